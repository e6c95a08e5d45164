"""``ir::scan_layers`` and its gradient: one ``lax.scan`` over a layer's graph.

A stack of layers of one structure (``scan_layers`` in the front end) is recorded as one node
whose body is the graph of one layer, traced once on placeholders: the carry (the layer's
input), one placeholder per parameter or buffer (each operand of the node stacks that tensor
of every layer, layer first), and the body's free inputs (lifted scalars, the step's random
key) as further operands. The node's ``body`` attribute names the body in ``bodies`` by a
digest of its exact graph, so equal stacks share a program, and the outer graph's hash says
which body it runs.

Lowered, the body is evaluated node by node, as ``_lower`` evaluates a graph, inside the scan's
step function: XLA compiles one layer, whatever the depth. A body that draws random numbers
draws them from the step's key folded with the layer's index, so each layer draws its own.
The gradient node is ``jax.vjp`` of the same scan: the body's backward, compiled once too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ir_core import DeviceData, post_order
from ir_runtime import _lower, _runtime_checks
from ir_runtime._lowering._registry import register
from ir_runtime._lowering.random import fold_key
from ir_runtime._lowering.regions import bodies


class Body:
    """One layer's graph: ``root`` (its output Value) in terms of ``carry`` and ``params``
    (placeholder DeviceData nodes), and ``free`` (the other data nodes it reads, in order);
    ``key``: the index in ``free`` of the step's random key, or None."""

    __slots__ = ("carry", "free", "key", "order", "params", "root")

    def __init__(self, root, carry, params, free, key):
        self.root, self.carry, self.params, self.free, self.key = root, carry, params, free, key
        self.order = post_order([root])

    def step(self, free_arrays):
        """The scan's step function: ``(carry, (stacked slices, layer index)) -> (out, None)``."""
        free = list(free_arrays)
        key = self.key

        def step(carry, xs):
            slices, index = xs
            env = {id(self.carry): (carry,)}
            env.update((id(p), (a,)) for p, a in zip(self.params, slices, strict=True))
            env.update((id(f), (a,)) for f, a in zip(self.free, free, strict=True))
            if key is not None:
                env[id(self.free[key])] = (fold_key(free[key], index),)
            with _runtime_checks.collecting(None):  # (a check's flag would leave the scan)
                for n in self.order:
                    if type(n) is not DeviceData:
                        operands = [env[id(v.node)][v.index] for v in n.operands]
                        env[id(n)] = _lower.lower_node(n, operands, None)
            return env[id(self.root.node)][self.root.index], None

        return step


def add_body(body: Body) -> str:
    """Register ``body`` (or find an equal one); returns the name the node carries."""
    leaves = [body.carry, *body.params, *body.free]
    return bodies.add(body, [body.root], "ir::scan_layers", leaves, str(body.key).encode())


def _scan(body, layers, x, stacked, free):
    index = jnp.arange(layers, dtype=jnp.uint32)  # (also the length, when there is no parameter)
    out, _ = lax.scan(body.step(free), x, (tuple(stacked), index))
    return out


@register("ir::scan_layers")
def _scan_layers(node, x, *rest):
    p = node.attrs["params"]
    return _scan(bodies.of(node), node.attrs["layers"], x, rest[:p], rest[p:])


@register("ir::scan_layers_grad")
def _scan_layers_grad(node, x, *rest):
    p, layers = node.attrs["params"], node.attrs["layers"]
    stacked, free, grad = rest[:p], rest[p:-1], rest[-1]
    body = bodies.of(node)
    _, vjp = jax.vjp(lambda x, s: _scan(body, layers, x, s, free), x, tuple(stacked))
    gx, gs = vjp(grad)
    return (gx, *gs)
