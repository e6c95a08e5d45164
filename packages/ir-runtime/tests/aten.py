"""Run one ATen op through the runtime and through torch eager, the oracle.

An op is recorded the way the front end records it (its own argument preparation): tensor
arguments become operands (as DeviceData holding the same values), other arguments attributes
under their schema names, defaults included, an optional tensor given as None an attribute set
to None. Output shapes come from torch's result.
"""

import numpy as np
import torch

import ir_runtime as irt
from ir_core import Generic, Shape, Value
from ir_runtime._frontend import inspect
from ir_runtime._frontend.recording._convert import TORCH_TO_IR

TORCH_DTYPES = TORCH_TO_IR  # the front end's table: torch dtype -> ir-core name


def shape_of(t):
    return Shape(TORCH_DTYPES[t.dtype], tuple(t.shape))


def to_numpy(t):
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


def overload(name):
    op, _, over = name.partition(".")
    return getattr(getattr(torch.ops.aten, op), over or "default")


def record(name, args, kwargs):
    """The IR node of ``aten::name(*args, **kwargs)`` exactly as the front end records it (its
    own argument preparation: host tensors become DeviceData holding the same values, every
    default an attribute), and its torch result."""
    fn = overload(name)
    expected = fn(*args, **kwargs)
    _, operands, attrs = inspect.prepared(fn, args, kwargs)
    outs = expected if isinstance(expected, (tuple, list)) else (expected,)
    op = f"{fn._schema.name}.{fn._schema.overload_name or 'default'}"
    node = Generic(op, operands, [shape_of(o) for o in outs], attrs)
    return node, outs


def check(name, *args, rtol=1e-5, atol=1e-6, **kwargs):
    node, expected = record(name, args, kwargs)
    results = irt.execute([Value(node, k) for k in range(len(expected))])
    for k, (got, want) in enumerate(zip(results, expected, strict=True)):
        assert got.shape == shape_of(want), (name, k, got.shape, shape_of(want))
        np.testing.assert_allclose(
            irt.to_host(got).astype(np.float64)
            if want.dtype == torch.bfloat16
            else irt.to_host(got),
            to_numpy(want.detach()),
            rtol=rtol,
            atol=atol,
            err_msg=f"{name} output {k}",
        )
    return results
