"""torch's foreach OpInfo databases (``foreach_*_op_db``: the ``torch._foreach_*`` ops optimizers
call with ``foreach=True``) through the lazy device, against eager on the CPU, as
``test_opinfo.py`` runs ``op_db``: each op's values and input gradients, and its in-place
variant, which is what an optimizer calls: the tensors it writes hold eager's values, and a call
eager refuses is refused (a sample whose gradient eager's own autograd cannot compute, a 0-d
tensor operand, is compared by its values). No op is a known failure."""

from __future__ import annotations

import os

import opinfo
import pytest
import torch
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_other_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_unary_op_db,
)
from torch.utils._pytree import tree_map

import ir_runtime as irt

DBS = (
    foreach_unary_op_db,
    foreach_binary_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_other_op_db,
)
OPS = [op for db in DBS for op in db if opinfo.DTYPE in op.supported_dtypes("cpu")]
# CI's time: every sample of each op over lists of four tensors (4x4 down to 1x1), a quarter of
# the tensors the first three samples over torch's own lists (20 and 23 tensors) hold, and every
# kind of right-hand operand (scalar, bool, 0-d tensor, int and float lists) where those first
# three reach only some. ``IR_RUNTIME_OPINFO_SAMPLES=all pytest tests/test_opinfo_foreach.py``
# runs every sample over torch's own lists; a number instead of ``all``, the first that many.
_SAMPLES = os.environ.get("IR_RUNTIME_OPINFO_SAMPLES")
TENSORS = 4  # per list, where IR_RUNTIME_OPINFO_SAMPLES is unset
IN_PLACE = [op for op in OPS if op.inplace_variant is not None]


def test_the_databases_are_all_here():
    assert len(OPS) == 48 and len(IN_PLACE) == 44  # (torch 2.13's; fails loudly if they move)


def _samples(op, requires_grad: bool) -> list:
    if _SAMPLES is not None:
        return opinfo.samples_of(op, None if _SAMPLES == "all" else int(_SAMPLES), requires_grad)
    torch.manual_seed(0)
    return list(
        op.sample_inputs(
            "cpu", opinfo.DTYPE, requires_grad=requires_grad, num_input_tensors=[TENSORS]
        )
    )


def _eager(op, sample):
    """(eager's result, None), or (None, what eager raised)."""
    try:
        return op(sample.input, *sample.args, **sample.kwargs), None
    except Exception as e:
        return None, e


def _eager_gradients(sample, want) -> bool:
    """Whether eager gives this sample input gradients (torch 2.13's foreach backward refuses
    a 0-d tensor operand: "inconsistent range for TensorList output")."""
    outs = opinfo._differentiable(want)
    ins = opinfo._grad_inputs((sample.input, *sample.args), sample.kwargs)
    if not outs or not ins:
        return False
    try:
        torch.autograd.grad(
            outs, ins, [torch.ones_like(o) for o in outs], allow_unused=True, retain_graph=True
        )
    except Exception:  # (an IndexError for addcdiv's 0-d operand)
        return False
    return True


@pytest.mark.parametrize("op", OPS, ids=opinfo.op_id)
def test_foreach_op_matches_eager(op):
    """Every sample: eager's values and input gradients, or refused where eager refuses it
    (a list of bool tensors to subtract)."""
    with_grad = op.supports_autograd
    (rtol, atol), (grad_rtol, grad_atol) = opinfo.tolerances(op, opinfo.DTYPE)
    todo = []
    for sample in _samples(op, with_grad):
        want, refused = _eager(op, sample)
        if refused is None:
            todo.append((sample, with_grad and _eager_gradients(sample, want)))
            continue
        lazy = tree_map(opinfo._lazy, (sample.input, sample.args, sample.kwargs))
        with pytest.raises(Exception) as e:
            out = op(lazy[0], *lazy[1], **lazy[2])
            tree_map(opinfo._host, out)  # (run: a lazy op may refuse when it runs)
        assert type(e.value) is not AssertionError, refused
    runs = opinfo._record_all(op, todo) or [None] * len(todo)  # (None: each on its own)
    for (sample, grads), run in zip(todo, runs, strict=True):
        problem, _, got, args, kwargs, want, random = opinfo._values(
            op, sample, rtol, atol, opinfo.DTYPE, run
        )
        assert problem is None, problem
        if grads and not random:
            problem, _ = opinfo._grads(
                op, sample, got, args, kwargs, want, grad_rtol, grad_atol, opinfo.DTYPE, run
            )
            assert problem is None, problem


def _copies(sample, convert):
    def copy(t):
        return convert(t.detach().clone()) if isinstance(t, torch.Tensor) else t

    return tree_map(copy, (sample.input, sample.args, sample.kwargs))


@pytest.mark.parametrize("op", IN_PLACE, ids=opinfo.op_id)
def test_foreach_op_in_place_writes_eagers_values(op):
    """Every sample eager takes written in place by one program, with eager's values; every
    sample eager refuses refused."""
    written = []
    for sample in _samples(op, requires_grad=False):
        (x, args, kwargs), (lx, largs, lkwargs) = (
            _copies(sample, lambda t: t),
            _copies(sample, irt.to_lazy),
        )
        try:
            op.inplace_variant(x, *args, **kwargs)
        except Exception as eager_error:  # eager refuses it: so must the lazy device
            with pytest.raises(Exception) as e:
                op.inplace_variant(lx, *largs, **lkwargs)
                irt.mark_step()
            assert type(e.value) is not AssertionError, eager_error
            continue
        written.append((x, lx, largs, lkwargs))
    for _, lx, largs, lkwargs in written:
        op.inplace_variant(lx, *largs, **lkwargs)
    irt.mark_step()  # (one program writes them all)
    (rtol, atol), _ = opinfo.tolerances(op, opinfo.DTYPE)
    for x, lx, _, _ in written:
        got = [irt.to_torch(t) for t in lx]
        assert opinfo._same(got, x, rtol, atol, f"{op.name}_ written") is None
