"""torch's operator suite (OpInfo) in bfloat16 through the lazy device, values and input
gradients, against torch eager on the CPU (``opinfo.py``, as ``test_opinfo.py`` in float32).

Eager computes a bfloat16 op in float32 and rounds once, and so does the lazy device
(``_lowering._registry``'s rounding modes): the results are compared with rtol 1.6e-2 and atol
1e-2, gradients too. Where eager's CPU kernel rounds intermediates (``cross``, ``addbmm``, the
grid sampler) an element outside the tolerance passes if it is no farther from the float64
result than eager's element (``opinfo``'s docstring); the run's summary counts those ops.

Every op passes, or is in ``BFLOAT16_FAILURES`` with the reason; a known failure must still
fail, and only by raising: a wrong value fails the run whatever the list says. The list only
shrinks. The first sample of each op (``IR_RUNTIME_OPINFO_BF16_SAMPLES``: another number, or
``all``): the float32 suite runs three, for the keyword arguments; this one is for the dtype.
On two shared CPU cores one sample took 100-140 s, two 170-210 s (with the same totals).
"""

from __future__ import annotations

import os

import opinfo
import pytest
import torch
from opinfo_known_failures import BFLOAT16_FAILURES as KNOWN_FAILURES

DTYPE = torch.bfloat16
SAMPLES = os.environ.get("IR_RUNTIME_OPINFO_BF16_SAMPLES", "1")
SAMPLES = None if SAMPLES == "all" else int(SAMPLES)

OPS = opinfo.population(DTYPE)
OUTCOMES: dict = {}  # op id -> Outcome, for the run's summary (``conftest.py``)


@pytest.mark.parametrize("op", OPS, ids=opinfo.op_id)
def test_op_matches_eager_in_bfloat16(op):
    name = opinfo.op_id(op)
    outcome = OUTCOMES[name] = opinfo.check(op, SAMPLES, DTYPE)
    opinfo.judge(name, outcome, KNOWN_FAILURES.get(name), "BFLOAT16_FAILURES")


def test_known_failures_name_real_ops():
    ids = {opinfo.op_id(op) for op in OPS}
    assert set(KNOWN_FAILURES) <= ids, sorted(set(KNOWN_FAILURES) - ids)
    for name, (part, reason) in KNOWN_FAILURES.items():
        assert part in ("values", "gradients") and reason, name
