"""torch's OpInfo ops that take no float32 (``bincount``, ``gcd``, the shifts, ``imag``,
``view_as_real``, ``istft``, ...) through the lazy device against torch eager on the CPU, every
sample, in the first dtype each takes of int64, int32, complex64, bool and the other integers:
``test_opinfo.py`` runs the float32 ones and would leave these out.

Every op passes or is a known failure with its reason (``KNOWN_FAILURES``), and the ops that take no
dtype on the CPU at all (CUDA-only kernels, float8) are named here, so none is skipped unseen.
"""

from __future__ import annotations

import opinfo
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

DTYPES = (
    torch.int64,
    torch.int32,
    torch.complex64,
    torch.bool,
    torch.uint8,
    torch.int16,
    torch.int8,
    torch.float64,
)
SAMPLES = None  # every sample
# ``name: (part, reason)`` as in ``opinfo_known_failures``; only shrinks.
KNOWN_FAILURES = {
    "istft": (
        "gradients",
        "a window shorter than n_fft (win_length 8 of 10): eager's autograd gives the window no "
        "gradient (None: its kernel pads the window by copying it into a new tensor, which "
        "autograd does not track) where the lazy device gives one; the values match",
    ),
}
# Ops op_db lists with no dtype this harness runs on the CPU: CUDA-only kernels and float8.
NOT_ON_CPU = frozenset(
    (
        "torch._scaled_mm",
        "torch._scaled_mm_v2",
        "torch.ops.aten._flash_attention_forward",
        "torch.ops.aten._efficient_attention_forward",
        "nn.functional.batch_norm.without_cudnn",
    )
)


def _without_float32():
    return [
        op
        for op in op_db
        if not op.name.startswith("jiterator")
        and "sparse" not in op.name
        and torch.float32 not in op.supported_dtypes("cpu")
    ]


def _dtype(op):
    return next((d for d in DTYPES if d in op.supported_dtypes("cpu")), None)


OPS = [op for op in _without_float32() if _dtype(op) is not None]
OUTCOMES: dict = {}  # op id -> Outcome, for the run's summary (``conftest.py``)


@pytest.mark.parametrize("op", OPS, ids=opinfo.op_id)
def test_op_matches_eager_in_its_own_dtype(op):
    name = opinfo.op_id(op)
    outcome = OUTCOMES[name] = opinfo.check(op, SAMPLES, _dtype(op))
    passed = outcome.values == "pass" and outcome.grads in ("pass", None)
    known = KNOWN_FAILURES.get(name)
    if known is None:
        assert passed, (
            f"{name} in {_dtype(op)} ({outcome.values}, gradients {outcome.grads}): "
            f"{outcome.detail}"
        )
        return
    assert not passed, f"{name} passes now: remove it from KNOWN_FAILURES ({known[1]})"
    assert known[0] == "gradients" and outcome.values == "pass", outcome.detail


def test_every_op_without_float32_runs_here_or_is_named():
    skipped = {opinfo.op_id(op) for op in _without_float32() if _dtype(op) is None}
    assert skipped == NOT_ON_CPU
    assert len(OPS) >= 19
