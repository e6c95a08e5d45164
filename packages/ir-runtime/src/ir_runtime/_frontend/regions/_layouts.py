"""Placements that follow a tensor into its gradient or onto another tensor:
``mark_sharding_with_gradients(t, mesh, spec)`` and ``shard_as(a, b)``.

``mark_sharding_with_gradients`` (torch_xla's name) is ``mark_sharding`` that also constrains
the gradient flowing back to ``t`` to the same placement: a parameter's gradient is computed
where the parameter lives (FSDP's layout, without GSPMD choosing a replicated gradient and a
reduce-scatter of its own), and an activation's gradient keeps the activation's layout. A leaf
gets a gradient hook; a tensor with history is returned through an autograd function whose
backward does it (use the returned tensor, as with torch_xla).

``shard_as(a, b)`` returns ``a`` and ``b`` placed alike: where one of them is annotated, the
other gets that annotation; where neither is, one ``ir::shard_alike`` node lets XLA choose a
placement and gives it to both (``jax.experimental.shard_alike``). Their gradients are placed
alike too.

Each constraint is an ``ir::annotate`` node (the identity, carrying the sharding), so the
constrained value is never computed twice.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ir_core import Generic, Value
from ir_runtime._frontend.recording import _fast
from ir_runtime._frontend.recording._api import check_lazy, mark_sharding
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap
from ir_runtime._frontend.regions._shard_map import first_order_only
from ir_sharding import Mesh, ShardingError, ShardingSpec


def _annotated(t: LazyTensor, spec) -> LazyTensor:
    node = Generic("ir::annotate", [t._ir], [t._ir.shape], {}, spec, _fast.origin())
    return wrap(Value(node))


class _GradLayout(torch.autograd.Function):
    """The identity whose gradient is constrained to ``spec``."""

    @staticmethod
    def forward(ctx, t, spec):
        ctx.spec = spec
        return _annotated(t, spec)

    @staticmethod
    def backward(ctx, grad):
        return first_order_only([_annotated(grad, ctx.spec)], "a placement's gradient")[0], None


_HOOKS = WeakIdKeyDictionary()  # leaf -> (spec, its gradient hook's handle), by identity


def mark_sharding_with_gradients(t, mesh: Mesh, partition_spec) -> LazyTensor:
    """``mark_sharding(t, mesh, partition_spec)``, and the gradient that reaches ``t`` placed
    the same way (module docstring). Returns ``t`` for a leaf; for a tensor with history, the
    tensor to use from here on."""
    check_lazy(t, "mark_sharding_with_gradients")
    spec = ShardingSpec(mesh, partition_spec)
    spec.check_rank(t.dim(), f"the tensor {tuple(t.shape)}")
    mark_sharding(t, mesh, partition_spec)
    if not t.requires_grad:
        return t
    if t.grad_fn is None:  # a leaf (a parameter): its gradient, before it is accumulated
        # One hook per tensor, however often this is called (torch_xla code calls it every
        # step): the latest spec replaces the one before.
        old = _HOOKS.get(t)
        if old is not None:
            if old[0] == spec:
                return t
            old[1].remove()
        _HOOKS[t] = (spec, t.register_hook(lambda grad: _annotated(grad, spec)))
        return t
    return _GradLayout.apply(t, spec)


class _Alike(torch.autograd.Function):
    """Two tensors placed alike, by XLA's choice; their gradients too."""

    @staticmethod
    def forward(ctx, a, b):
        shapes = [a._ir.shape, b._ir.shape]
        node = Generic("ir::shard_alike", [a._ir, b._ir], shapes, {}, None, _fast.origin())
        return wrap(Value(node, 0)), wrap(Value(node, 1))

    @staticmethod
    def backward(ctx, ga, gb):
        if ga is None or gb is None:
            return ga, gb
        with torch.no_grad():
            both = _Alike.apply(ga, gb)
        return tuple(first_order_only(list(both), "shard_as"))


def shard_as(a, b) -> tuple[LazyTensor, LazyTensor]:
    """``a`` and ``b`` with one placement (module docstring): returns the two tensors to use."""
    check_lazy(a, "shard_as")
    check_lazy(b, "shard_as")
    if tuple(a.shape) != tuple(b.shape):
        raise ShardingError(
            f"shard_as places two tensors of one shape alike; got {list(a.shape)} and "
            f"{list(b.shape)}"
        )
    sa, sb = a._where(), b._where()
    if sa is not None and sb is not None and sa != sb:
        raise ShardingError(
            f"shard_as: the two tensors are annotated differently ({sa.partition_spec} and "
            f"{sb.partition_spec}); clear one (clear_sharding) to give it the other's"
        )
    if sa is None and sb is None:
        return _Alike.apply(a, b)
    spec = sa if sa is not None else sb
    a = a if sa is not None else _GradLayout.apply(a, spec)
    b = b if sb is not None else _GradLayout.apply(b, spec)
    return a, b
