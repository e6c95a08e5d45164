"""Random numbers from an explicit key: ``ir::random_*`` ops take a uint32[2] key operand and an
``offset`` attribute, so a step is a pure function of its seed and the stream is reproducible.
The front end folds a per-step counter into the key."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ir_runtime._lowering._registry import out_dims, out_dtype, register


def _key(key, node):
    k = jax.random.wrap_key_data(key.astype(jnp.uint32), impl="threefry2x32")
    return jax.random.fold_in(k, node.attrs.get("offset", 0))


@register("ir::random_uniform")
def _uniform(node, key):
    a = node.attrs
    dt = out_dtype(node)
    return jax.random.uniform(
        _key(key, node),
        out_dims(node),
        dtype=dt,
        minval=a.get("low", 0.0),
        maxval=a.get("high", 1.0),
    )


@register("ir::random_normal")
def _normal(node, key):
    a = node.attrs
    sample = jax.random.normal(_key(key, node), out_dims(node), dtype=out_dtype(node))
    return sample * a.get("std", 1.0) + a.get("mean", 0.0)


@register("ir::random_bernoulli")
def _bernoulli(node, key):
    p = node.attrs.get("p", 0.5)
    return jax.random.bernoulli(_key(key, node), p, out_dims(node)).astype(out_dtype(node))


@register("ir::random_bits")
def _bits(node, key):
    return jax.random.bits(_key(key, node), out_dims(node), dtype=out_dtype(node))
