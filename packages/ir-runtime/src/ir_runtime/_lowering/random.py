"""Random numbers from an explicit key: ``ir::random_*`` ops take a uint32[3] key operand
(seed, step, base) and an ``offset`` attribute, and draw from threefry's (seed, step) key folded
with ``base + offset``, so a step is a pure function of its seed and the stream is reproducible.
The base is data, not part of the program: a graph cut in the middle of a step (a value read
to the host) starts its draws at a new base with offsets from 0 again, so a sampling loop that
reads each token runs one program for every token, not one per position in the stream."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ir_runtime._lowering._registry import out_dims, out_dtype, register


def threefry(key):
    """The threefry key of a uint32[3] key array: its (seed, step) words."""
    return jax.random.wrap_key_data(key[:2].astype(jnp.uint32), impl="threefry2x32")


def fold_key(key, data):
    """``key`` (a uint32[3] array) with ``data`` folded into its threefry words, its base kept:
    a region's key per layer or per device."""
    folded = jax.random.key_data(jax.random.fold_in(threefry(key), data))
    return jnp.concatenate([folded, key[2:].astype(jnp.uint32)])


def _key(key, node):
    return jax.random.fold_in(threefry(key), key[2].astype(jnp.uint32) + node.attrs["offset"])


def _floats(node):
    """Samplers draw floats: in the output dtype when it is one, else float32, then cast."""
    dt = out_dtype(node)
    return dt if jnp.issubdtype(dt, jnp.floating) else np.dtype(np.float32)


@register("ir::random_uniform")
def _uniform(node, key):
    a = node.attrs
    sample = jax.random.uniform(
        _key(key, node), out_dims(node), dtype=_floats(node), minval=a["low"], maxval=a["high"]
    )
    return sample.astype(out_dtype(node))


@register("ir::random_normal")
def _normal(node, key):
    a = node.attrs
    sample = jax.random.normal(_key(key, node), out_dims(node), dtype=_floats(node))
    return (sample * a["std"] + a["mean"]).astype(out_dtype(node))


@register("ir::random_log_normal")
def _log_normal(node, key):
    a = node.attrs
    sample = jax.random.normal(_key(key, node), out_dims(node), dtype=_floats(node))
    return jnp.exp(sample * a["std"] + a["mean"]).astype(out_dtype(node))


@register("ir::random_exponential")
def _exponential(node, key):
    sample = jax.random.exponential(_key(key, node), out_dims(node), dtype=_floats(node))
    return (sample / node.attrs["lambd"]).astype(out_dtype(node))


@register("ir::random_cauchy")
def _cauchy(node, key):
    a = node.attrs
    sample = jax.random.cauchy(_key(key, node), out_dims(node), dtype=_floats(node))
    return (a["median"] + a["sigma"] * sample).astype(out_dtype(node))


@register("ir::random_geometric")
def _geometric(node, key):
    """Trials up to and including the first success: 1, 2, ..."""
    u = jax.random.uniform(_key(key, node), out_dims(node), dtype=np.float64)
    trials = jnp.ceil(jnp.log1p(-u) / jnp.log1p(-node.attrs["p"]))
    return jnp.maximum(trials, 1).astype(out_dtype(node))


@register("ir::random_randint")
def _randint(node, key):
    """Integers uniform in [low, high), in any output dtype."""
    a = node.attrs
    sample = jax.random.randint(
        _key(key, node), out_dims(node), a["low"], a["high"], dtype=np.int64
    )
    return sample.astype(out_dtype(node))


@register("ir::random_bernoulli")
def _bernoulli(node, key):
    return jax.random.bernoulli(_key(key, node), node.attrs["p"], out_dims(node)).astype(
        out_dtype(node)
    )


@register("ir::random_bernoulli_tensor")
def _bernoulli_tensor(node, key, p):
    """1 with each element's own probability ``p``."""
    u = jax.random.uniform(_key(key, node), out_dims(node), dtype=np.float64)
    return (u < jnp.broadcast_to(p, out_dims(node))).astype(out_dtype(node))


@register("ir::random_multinomial")
def _multinomial(node, key, probs):
    """``num_samples`` category indices per row of ``probs`` (unnormalized weights): with
    replacement, independent draws; without, the Gumbel top-k trick (weighted sampling
    without replacement)."""
    n = out_dims(node)[-1]
    logits = jnp.log(probs.astype(np.float64))
    k = _key(key, node)
    if node.attrs["replacement"]:
        draws = jax.random.categorical(k, logits, axis=-1, shape=(n, *logits.shape[:-1]))
        return jnp.moveaxis(draws, 0, -1).astype(out_dtype(node))
    gumbel = jax.random.gumbel(k, logits.shape, dtype=np.float64)
    _, top = jax.lax.top_k(logits + gumbel, n)
    return top.astype(out_dtype(node))


@register("ir::random_permutation")
def _permutation(node, key):
    n = out_dims(node)[0]
    return jax.random.permutation(_key(key, node), n).astype(out_dtype(node))
