"""Rules for ``ir::attention`` and ``ir::attention_backward``: ``scaled_dot_product_attention``
as one op with its backward (recorded by ``_frontend/regions/_attention.py``).

Operands are torch's: ``q (*B, Hq, L, E)``, ``k (*B, Hk, S, E)``, ``v (*B, Hk, S, Ev)`` and an
optional mask broadcastable to ``(*B, Hq, L, S)`` (boolean: True attends; or additive, in the
query's dtype). ``Hq`` is a multiple of ``Hk``: query head ``h`` reads key head ``h // (Hq /
Hk)`` (torch's ``enable_gqa``, and a single key head broadcast), without repeating K and V.
Attributes: ``scale`` (a float) and ``causal`` (torch's top-left-aligned lower triangle:
query ``i`` sees keys ``j <= i``).

The forward gives the output and the rows' log-sum-exp of the scaled, masked logits (float32,
float64 for float64 inputs), which the backward reads instead of recomputing the softmax's
normalizer. Both compute in that precision and round their results once.

Memory is linear in the key length: keys are taken in blocks of ``BLOCK`` with an online
softmax (a running maximum and denominator per query row, the output accumulated and rescaled
as each block raises the maximum), and the backward recomputes each block's probabilities from
the saved log-sum-exp (FlashAttention's formulation, as an XLA loop). The full ``L x S``
logits exist only when the keys fit in one block; there the backward recomputes the softmax
itself and its row sums ``sum(dO * O)`` as ``sum(P * dP)``, eager's precision. Over several
blocks it reads the probabilities through the log-sum-exp and the output as the forward
rounded it (FlashAttention's and cuDNN's error: in half precision, and for logits of large
magnitude, a few times torch's math kernel's, which keeps float32 throughout).

A row whose keys are all hidden (left padding meets this) gives zeros and a zero gradient, as
torch's math kernel does (``_safe_softmax``), not the mean of V; its log-sum-exp is ``-inf``.

On a GPU, with float16 or bfloat16 operands and a head size cuDNN takes, the forward is cuDNN's
fused kernel (``jax.nn.dot_product_attention(implementation="cudnn")``) and the backward its
vjp; rows that see no key are shown every key, then zeroed (``_cudnn_call``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._dtypes import name_of, to_numpy_dtype
from ir_runtime._lowering._registry import register

BLOCK = 512  # keys per block of the online softmax
# cuDNN's fused attention: half precision, a head size that is a multiple of 8 up to 128.
_CUDNN_DTYPES = frozenset((np.dtype(np.float16), np.dtype(jnp.bfloat16)))


def _einsum(spec, a, b):
    """A product at the operands' own precision on every backend (XLA's default on a TPU
    multiplies float32 in one bfloat16 pass)."""
    return jnp.einsum(spec, a, b, precision=lax.Precision.HIGHEST)


def wide_dtype(dtype) -> np.dtype:
    """The precision attention computes in for operands of ``dtype``."""
    return np.promote_types(np.dtype(dtype), np.float32)


def lse_dtype(name: str) -> str:
    """The dtype name of the rows' log-sum-exp, the forward's second output, for operands of
    dtype ``name``."""
    return name_of(wide_dtype(to_numpy_dtype(name)))


def broadcastable(mask_dims, logits_dims) -> bool:
    """Whether a mask of ``mask_dims`` broadcasts to the logits' ``(*B, Hq, L, S)``."""
    if len(mask_dims) > len(logits_dims):
        return False
    pairs = zip(reversed(mask_dims), reversed(logits_dims), strict=False)
    return all(m in (1, d) for m, d in pairs)


def implementation(
    platform: str, dtype, head: int, value_head: int, masked: bool = False, lengths=(0, 0)
) -> str:
    """``"cudnn"`` or ``"blockwise"`` for these operands on ``platform`` (jax's name).
    ``masked``: a mask is given (cuDNN's bias); ``lengths``: ``(L, S)``. cuDNN's backward
    with a bias takes even lengths only (jax's ``check_is_flash_attention``)."""
    fits = head == value_head and head % 8 == 0 and head <= 128
    if masked and any(n % 2 for n in lengths):
        fits = False
    if platform == "gpu" and np.dtype(dtype) in _CUDNN_DTYPES and fits:
        return "cudnn"
    return "blockwise"


class _Layout:
    """The operands as ``(B, Hk, G, L, E)`` queries, ``(B, Hk, S, E)`` keys and values, and a
    mask of rank 5 whose every dimension is 1 or the logits' own (``G = Hq / Hk``)."""

    def __init__(self, q, k, v, mask):
        self.q_shape, self.k_shape, self.v_shape = q.shape, k.shape, v.shape
        *batch, hq, self.L, self.E = q.shape
        self.batch = tuple(batch)
        hk, self.S, _ = k.shape[-3:]
        self.Ev = v.shape[-1]
        self.B = math.prod(self.batch)
        self.Hk, self.G = hk, hq // hk
        self.q = q.reshape(self.B, hk, self.G, self.L, self.E)
        self.k = k.reshape(self.B, hk, self.S, self.E)
        self.v = v.reshape(self.B, hk, self.S, self.Ev)
        self.mask = None if mask is None else self._mask(mask, hq)

    def _mask(self, mask, hq):
        nd = len(self.batch) + 3
        mask = mask.reshape((1,) * (nd - mask.ndim) + mask.shape)
        mb, (mh, ml, ms) = mask.shape[:-3], mask.shape[-3:]
        if all(d == 1 for d in mb):
            b = 1
        else:  # (some batch dimensions broadcast: those made whole)
            mask = jnp.broadcast_to(mask, (*self.batch, mh, ml, ms))
            b = self.B
        heads = (1, 1) if mh == 1 else (self.Hk, self.G)
        return mask.reshape(b, *heads, ml, ms)

    def query(self, x):
        """A ``(B, Hk, G, L, ...)`` result in the query's own shape."""
        return x.reshape(*self.batch, self.Hk * self.G, self.L, *x.shape[4:])


def _hide(s, mask_block, causal, keys, queries, limit):
    """The logits ``s (B, Hk, G, L, n)`` of keys at ``keys (n,)``, with every hidden one
    ``-inf``: the mask's (added, or False), the causal triangle's, and padding at or past
    ``limit`` (None: no padding)."""
    if mask_block is not None:
        if mask_block.dtype == np.bool_:
            s = jnp.where(mask_block, s, -jnp.inf)
        else:
            s = s + mask_block.astype(s.dtype)
    visible = None
    if causal:
        visible = keys[None, :] <= queries[:, None]
    if limit is not None:
        inside = (keys < limit)[None, :]
        visible = inside if visible is None else visible & inside
    if visible is not None:
        s = jnp.where(visible, s, -jnp.inf)
    return s


def _logits(lay, k_block, mask_block, causal, keys, scale, wide):
    s = _einsum("bhgle,bhse->bhgls", lay.q.astype(wide), k_block.astype(wide))
    limit = lay.S if lay.S > BLOCK and lay.S % BLOCK else None
    return _hide(s * scale, mask_block, causal, keys, jnp.arange(lay.L), limit)


def _blocks(lay, x, axis_from_end):
    """``x`` split along its key axis into ``(n, ...)`` blocks of ``BLOCK`` (zero padded)."""
    n = -(-lay.S // BLOCK)
    axis = x.ndim - axis_from_end
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n * BLOCK - lay.S)
    x = jnp.pad(x, pad)
    x = x.reshape(*x.shape[:axis], n, BLOCK, *x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def _mask_blocks(lay):
    """The mask as per-block slices (None when it is one for every block: no mask, or a mask
    broadcast over keys), and the mask every block reads otherwise."""
    m = lay.mask
    if m is None or m.shape[-1] == 1:
        return None, m
    return _blocks(lay, m, 1), None


def _forward(lay, causal, scale, wide):
    """``(out (B, Hk, G, L, Ev), lse (B, Hk, G, L))`` in ``wide``."""
    if lay.S <= BLOCK:
        s = _logits(lay, lay.k, lay.mask, causal, jnp.arange(lay.S), scale, wide)
        m = jnp.max(s, axis=-1)
        m = jnp.where(jnp.isfinite(m), m, 0)
        p = jnp.exp(s - m[..., None])
        total = jnp.sum(p, axis=-1)
        acc = _einsum("bhgls,bhsd->bhgld", p, lay.v.astype(wide))
    else:
        mask_blocks, shared = _mask_blocks(lay)
        xs = (_blocks(lay, lay.k, 2), _blocks(lay, lay.v, 2), jnp.arange(-(-lay.S // BLOCK)))
        if mask_blocks is not None:
            xs = (*xs, mask_blocks)

        def step(carry, x):
            m, total, acc = carry
            k_block, v_block, j = x[:3]
            mask_block = x[3] if mask_blocks is not None else shared
            keys = j * BLOCK + jnp.arange(BLOCK)
            s = _logits(lay, k_block, mask_block, causal, keys, scale, wide)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0)
            p = jnp.exp(s - m_safe[..., None])
            rescale = jnp.exp(m - m_safe)  # (0 while no key was visible: m is -inf)
            total = total * rescale + jnp.sum(p, axis=-1)
            acc = acc * rescale[..., None] + _einsum("bhgls,bhsd->bhgld", p, v_block.astype(wide))
            return (m_new, total, acc), None

        rows = (lay.B, lay.Hk, lay.G, lay.L)
        init = (
            jnp.full(rows, -jnp.inf, wide),
            jnp.zeros(rows, wide),
            jnp.zeros((*rows, lay.Ev), wide),
        )
        (m, total, acc), _ = lax.scan(step, init, xs)
        m = jnp.where(jnp.isfinite(m), m, 0)
    seen = total > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, total, 1)[..., None], 0)
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, total, 1)), -jnp.inf)
    return out, lse


def _backward(lay, grad, out, lse, causal, scale, wide):
    """``(dq, dk, dv)`` in the layout's shapes, in ``wide``."""
    do = grad.astype(wide)
    lse = jnp.where(jnp.isneginf(lse), jnp.inf, lse.astype(wide))  # (hidden rows: p is 0)
    q = lay.q.astype(wide)

    def block(k_block, v_block, mask_block, keys, delta=None):
        k_block, v_block = k_block.astype(wide), v_block.astype(wide)
        s = _logits(lay, k_block, mask_block, causal, keys, scale, wide)
        if delta is None:  # (one block: the softmax itself, as eager's, not through the lse)
            m = jnp.max(s, axis=-1, keepdims=True)
            e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0))
            total = jnp.sum(e, axis=-1, keepdims=True)
            p = e / jnp.where(total > 0, total, 1)
        else:
            p = jnp.exp(s - lse[..., None])
        dv = _einsum("bhgls,bhgld->bhsd", p, do)
        dp = _einsum("bhgld,bhsd->bhgls", do, v_block)
        if delta is None:  # (one block: the unrounded sum(dO * O))
            delta = jnp.sum(p * dp, axis=-1)
        ds = p * (dp - delta[..., None]) * scale
        dq = _einsum("bhgls,bhse->bhgle", ds, k_block)
        dk = _einsum("bhgls,bhgle->bhse", ds, q)
        return dq, dk, dv

    if lay.S <= BLOCK:
        return block(lay.k, lay.v, lay.mask, jnp.arange(lay.S))
    delta = jnp.sum(do * out.astype(wide), axis=-1)  # (over blocks: O as the forward rounded it)
    mask_blocks, shared = _mask_blocks(lay)
    n = -(-lay.S // BLOCK)
    xs = (_blocks(lay, lay.k, 2), _blocks(lay, lay.v, 2), jnp.arange(n))
    if mask_blocks is not None:
        xs = (*xs, mask_blocks)

    def step(dq, x):
        k_block, v_block, j = x[:3]
        mask_block = x[3] if mask_blocks is not None else shared
        keys = j * BLOCK + jnp.arange(BLOCK)
        dq_block, dk, dv = block(k_block, v_block, mask_block, keys, delta)
        return dq + dq_block, (dk, dv)

    dq, (dk, dv) = lax.scan(step, jnp.zeros(q.shape, wide), xs)

    def keys_back(x):  # (n, B, Hk, BLOCK, d) -> (B, Hk, S, d)
        x = jnp.moveaxis(x, 0, 2)
        return x.reshape(*x.shape[:2], n * BLOCK, x.shape[-1])[:, :, : lay.S]

    return dq, keys_back(dk), keys_back(dv)


# -- cuDNN (GPU, half precision) ---------------------------------------------------------------


def _cudnn_call(lay, q, k, v, causal, scale, seen):
    """jax's fused attention on ``(B, T, N, H)`` operands; the output as ``(B, Hk, G, L,
    Ev)``, zeros in the rows that see no key. A boolean mask is jax's ``mask``, an additive one
    its ``bias``; rows that see no key are shown every key (the kernels give NaN there, and
    NaN in a row's probabilities would reach dK and dV through the backward however small its
    cotangent), then zeroed."""
    qt = q.reshape(lay.B, lay.Hk * lay.G, lay.L, lay.E).transpose(0, 2, 1, 3)
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    mask = bias = None
    if lay.mask is not None:
        m = lay.mask
        if seen is not None:
            hidden = ~seen[..., None]
            m = (m | hidden) if m.dtype == np.bool_ else jnp.where(hidden, 0, m).astype(m.dtype)
        # (cuDNN takes a bias of the logits' own (L, S), never a broadcast one)
        m = jnp.broadcast_to(m, (*m.shape[:-2], lay.L, lay.S))
        m = m.reshape(m.shape[0], -1, *m.shape[-2:])
        if m.dtype == np.bool_:
            mask = m
        else:
            bias = m
    o = jax.nn.dot_product_attention(
        qt,
        kt,
        vt,
        bias=bias,
        mask=mask,
        scale=scale,
        is_causal=causal,
        implementation=_CUDNN_IMPLEMENTATION[0],
    )
    return _zero_hidden(o.transpose(0, 2, 1, 3).reshape(lay.B, lay.Hk, lay.G, lay.L, lay.Ev), seen)


# The implementation the GPU path asks jax for: "cudnn"; tests on CPU swap in "xla", which runs
# the same layout and masking code around jax's reference kernel.
_CUDNN_IMPLEMENTATION = ["cudnn"]


def _seen(lay, causal):
    """Per query row ``(B, Hk, G, L)``-broadcastable: whether any key is visible."""
    if lay.mask is None:  # (under the causal triangle alone, query i sees key 0)
        return None
    s = jnp.zeros((1, 1, 1, lay.L, lay.S), np.float32)
    s = _hide(s, lay.mask, causal, jnp.arange(lay.S), jnp.arange(lay.L), None)
    return jnp.any(jnp.isfinite(s), axis=-1)


def _zero_hidden(x, seen):
    return x if seen is None else jnp.where(seen[..., None], x, 0)


def _use_cudnn(q, k, v, mask) -> bool:
    lengths = (q.shape[-2], k.shape[-2])
    how = implementation(
        jax.default_backend(), q.dtype, q.shape[-1], v.shape[-1], mask is not None, lengths
    )
    return how == "cudnn"


@register("ir::attention")
def _attention(node, q, k, v, mask=None):
    causal, scale = node.attrs["causal"], node.attrs["scale"]
    lay = _Layout(q, k, v, mask)
    wide = wide_dtype(q.dtype)
    out, lse = _forward(lay, causal, scale, wide)
    if _use_cudnn(q, k, v, mask):  # (the blockwise out is then dead code; its lse, read or not)
        out = _cudnn_call(lay, lay.q, lay.k, lay.v, causal, scale, _seen(lay, causal))
    lse_dtype = to_numpy_dtype(node.shapes[1].dtype)
    return lay.query(out).astype(q.dtype), lay.query(lse[..., None])[..., 0].astype(lse_dtype)


@register("ir::attention_backward")
def _attention_backward(node, grad, q, k, v, out, lse, mask=None):
    causal, scale = node.attrs["causal"], node.attrs["scale"]
    lay = _Layout(q, k, v, mask)
    wide = wide_dtype(q.dtype)
    grad5 = grad.reshape(lay.B, lay.Hk, lay.G, lay.L, lay.Ev)
    if _use_cudnn(q, k, v, mask):
        seen = _seen(lay, causal)

        def forward(q5, k4, v4):
            return _cudnn_call(lay, q5, k4, v4, causal, scale, seen)

        _, vjp = jax.vjp(forward, lay.q, lay.k, lay.v)
        dq, dk, dv = vjp(grad5.astype(q.dtype))
    else:
        out5 = out.reshape(lay.B, lay.Hk, lay.G, lay.L, lay.Ev)
        lse4 = lse.reshape(lay.B, lay.Hk, lay.G, lay.L)
        dq, dk, dv = _backward(lay, grad5, out5, lse4, causal, scale, wide)
    return (
        dq.reshape(lay.q_shape).astype(q.dtype),
        dk.reshape(lay.k_shape).astype(k.dtype),
        dv.reshape(lay.v_shape).astype(v.dtype),
    )
