"""torch's OpInfo samples through ``torch.compile(backend="ir_runtime")``, against torch eager:
one sample per op (its first, float32), its values and, where the op has them, its input
gradients (one cotangent per differentiable output, the same on both sides). An op whose
result is random or uninitialized is compared by shape and dtype (``opinfo._random``).

``check(op)`` returns an ``opinfo.Outcome`` as ``opinfo.check`` does. Used by
``test_opinfo_dynamo.py``.
"""

from __future__ import annotations

import opinfo
import torch
from torch.utils._pytree import tree_map

import ir_runtime as irt


def _fresh(sample):
    """A copy of the sample's tensors (the same values, leaves again where they were)."""

    def copy(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.detach().clone().requires_grad_(t.requires_grad)

    return sample.transform(copy)


def _run(fn, op, sample):
    """``fn``'s outputs on the sample, and its input gradients (None: no differentiable
    output) for cotangents drawn from a fixed seed."""
    args, kwargs = (sample.input, *sample.args), sample.kwargs
    torch.manual_seed(0)
    # What torch's own tests compare: outputs made unique where the op's are not (an
    # eigenvector's sign, a singular vector's phase).
    out = sample.output_process_fn_grad(fn(*args, **kwargs))
    outs = opinfo._differentiable(out)
    inputs = opinfo._grad_inputs(args, kwargs)
    grads = None
    if outs and inputs:
        g = torch.Generator().manual_seed(1)
        cots = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
        grads = torch.autograd.grad(outs, inputs, cots, allow_unused=True)
    keep = tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)
    return keep, grads


def check(op) -> opinfo.Outcome:
    samples = opinfo.samples_of(op, 1, requires_grad=op.supports_autograd)
    if not samples:
        return opinfo.Outcome("pass", None, "no sample")
    sample = samples[0]
    if op.name in opinfo.STORAGE_OPS:
        sample = opinfo._contiguous(sample)
    random = opinfo._random(op, sample)
    (rtol, atol), (grtol, gatol) = opinfo.tolerances(op, opinfo.DTYPE)
    want, want_grads = _run(op, op, _fresh(sample))
    torch._dynamo.reset()

    def fn(*args, **kwargs):
        return op(*args, **kwargs)

    compiled = torch.compile(fn, backend="ir_runtime", dynamic=False)
    graphs = irt.metrics()["counters"].get("DynamoGraphs", 0)
    try:
        # (OpInfo's reseeding wrapper is where Dynamo breaks the graph: the op is called
        # without it, so it reaches the backend; random results are compared by shape)
        with opinfo.unseeded(op):
            got, got_grads = _run(compiled, op, _fresh(sample))
    except Exception as e:  # (an op the backend refuses: named by the outcome)
        return opinfo.Outcome("raise", None, f"{type(e).__name__}: {str(e)[:300]}")
    if irt.metrics()["counters"].get("DynamoGraphs", 0) == graphs:
        # (Dynamo ran the op as it is: eager against eager would prove nothing)
        return opinfo.Outcome("raise", None, "Dynamo handed the backend no graph")
    if random:
        wrong = opinfo._same(tree_map(_shape, got), tree_map(_shape, want), 0, 0, "shape and dtype")
        return opinfo.Outcome("wrong" if wrong else "pass", None, wrong or "")
    wrong = opinfo._same(got, want, rtol, atol, "value")
    if wrong:
        return opinfo.Outcome("wrong", None, wrong)
    if want_grads is None:
        return opinfo.Outcome("pass", None)
    if got_grads is None:
        return opinfo.Outcome("pass", "wrong", "no gradient where eager has one")
    w = [g if g is not None else None for g in want_grads]
    wrong = opinfo._same(list(got_grads), w, grtol, gatol, "gradient")
    return opinfo.Outcome("pass", "wrong" if wrong else "pass", wrong or "")


def _shape(t):
    return (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t
