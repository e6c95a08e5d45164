"""Run one ATen op through the runtime and through torch eager, the oracle.

An op is recorded the way the front end records it: tensor arguments become operands (as
DeviceData holding the same values), other arguments attributes under their schema names, an
optional tensor given as None an attribute set to None. Output shapes come from torch's result.
"""

import numpy as np
import torch

import ir_runtime as irt
from ir_core import DeviceData, Generic, Shape, Value
from ir_runtime._frontend._record import TORCH_TO_IR

TORCH_DTYPES = TORCH_TO_IR  # the front end's table: torch dtype -> ir-core name


def shape_of(t):
    return Shape(TORCH_DTYPES[t.dtype], tuple(t.shape))


def to_numpy(t):
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


def attr(value):
    if isinstance(value, torch.dtype):
        return TORCH_DTYPES[value]
    if isinstance(value, (list, tuple, torch.Size)):
        return tuple(attr(v) for v in value)
    if isinstance(value, torch.memory_format | torch.layout | torch.device):
        return None
    return value


def overload(name):
    op, _, over = name.partition(".")
    return getattr(getattr(torch.ops.aten, op), over or "default")


def record(name, args, kwargs):
    """The IR node of ``aten::name(*args, **kwargs)``, its torch result, its leaves."""
    fn = overload(name)
    expected = fn(*args, **kwargs)
    operands, attrs, leaves = [], {}, []
    schema_args = fn._schema.arguments
    given = dict(zip([a.name for a in schema_args], args, strict=False))
    given.update(kwargs)
    for a in schema_args:
        if a.name not in given:
            continue
        value = given[a.name]
        values = value if isinstance(value, (list, tuple)) else [value]
        if values and all(isinstance(v, torch.Tensor) for v in values) and len(values) > 0:
            for v in values:
                leaf = DeviceData(shape_of(v), handle=to_numpy(v.detach()))
                leaves.append(leaf)
                operands.append(Value(leaf))
        elif value is None and "Tensor" in str(a.type):
            attrs[a.name] = None
        else:
            attrs[a.name] = attr(value)
    outs = expected if isinstance(expected, (tuple, list)) else (expected,)
    node = Generic(
        f"aten::{name if '.' in name else name + '.default'}",
        operands,
        [shape_of(o) for o in outs],
        attrs,
    )
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
