"""Losses: CTC (its forward and torch's backward) and the multi-margin and multilabel-margin
losses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime import _runtime_checks
from ir_runtime._lowering._registry import out_dims, out_dtype, register
from ir_runtime._lowering.sampling._common import compute_dtype, require_float

_NEG_INF = -np.inf


# -- CTC loss -------------------------------------------------------------------------------------


class _Ctc:
    """What the CTC forward and backward share: extended labels l' (blank, l1, blank, l2, ...,
    blank), the log-probabilities picked along them, and the static masks."""

    def __init__(self, node, log_probs, targets):
        a = node.attrs
        if log_probs.ndim != 3:
            raise ValueError("_ctc_loss: log_probs must be 3-D (T, N, C)")
        require_float(log_probs, "_ctc_loss")
        T, N, C = log_probs.shape
        self.blank = blank = a["blank"]
        self.in_lens = in_lens = np.asarray(a["input_lengths"], np.int64).reshape(-1)
        self.tg_lens = tg_lens = np.asarray(a["target_lengths"], np.int64).reshape(-1)
        if len(in_lens) != N or len(tg_lens) != N:
            raise ValueError("_ctc_loss: input_lengths and target_lengths need one entry a batch")
        if (in_lens < 0).any() or (in_lens > T).any():
            raise ValueError(f"_ctc_loss: input_lengths must be in [0, {T}], got {in_lens}")
        if (tg_lens < 0).any():
            raise ValueError("_ctc_loss: target_lengths must be non-negative")
        if not 0 <= blank < C:
            raise ValueError(f"_ctc_loss: blank {blank} is not a class of {C}")
        L = int(tg_lens.max(initial=0))
        S = 2 * L + 1
        k = np.arange(L)
        if targets.ndim == 1:
            starts = np.concatenate([[0], np.cumsum(tg_lens)[:-1]])
            if tg_lens.sum() > targets.shape[0]:
                raise ValueError("_ctc_loss: targets are shorter than the target lengths' sum")
            flat = np.where(k[None] < tg_lens[:, None], starts[:, None] + k[None], 0)
            tg = jnp.take(targets, jnp.asarray(flat.reshape(-1)), mode="clip").reshape(N, L)
        else:
            if targets.shape[1] < L:
                raise ValueError(
                    f"_ctc_loss: targets have {targets.shape[1]} columns, target lengths reach {L}"
                )
            tg = targets[:, :L]
        tg = jnp.clip(tg.astype(jnp.int32), 0, C - 1)
        s = np.arange(S)
        lprime = jnp.full((N, S), blank, jnp.int32)
        if L:
            lprime = lprime.at[:, 1::2].set(tg)
        self.lprime = lprime
        self.ct = ct = compute_dtype(log_probs.dtype)
        self.lp = log_probs.astype(ct)
        self.lp_ext = jnp.take_along_axis(
            self.lp, jnp.broadcast_to(lprime[None], (T, N, S)), axis=2
        )  # [T, N, S]
        self.valid_s = jnp.asarray(s[None, :] < 2 * tg_lens[:, None] + 1)  # [N, S]
        # Where alpha may come from s - 2 (l'(s-2) != l'(s)) and beta from s + 2.
        self.skip = jnp.asarray(s >= 2)[None] & (_shift(lprime, 2, -1) != lprime)
        self.skip_back = jnp.asarray(s + 2 < S)[None] & (_shift(lprime, -2, -1) != lprime)
        self.T, self.N, self.C, self.S = T, N, C, S

    def neg_inf(self, shape):
        return jnp.full(shape, _NEG_INF, self.ct)


def _logadd3(a, b, c):
    """log(e^a + e^b + e^c) as torch's CTC kernel computes it (max shift; 0 when all -inf)."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == _NEG_INF, jnp.zeros((), m.dtype), m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _shift(x, k: int, fill):
    """x shifted right (k > 0) or left (k < 0) along its last axis, ``fill`` coming in."""
    if abs(k) >= x.shape[-1]:
        return jnp.full(x.shape, fill, x.dtype)
    pad = jnp.full((*x.shape[:-1], abs(k)), fill, x.dtype)
    if k > 0:
        return jnp.concatenate([pad, x[..., :-k]], axis=-1)
    return jnp.concatenate([x[..., -k:], pad], axis=-1)


@register("aten::_ctc_loss.default")
def _ctc_loss(node, log_probs, targets):
    """(negative log-likelihood [N], log_alpha [N, T, 2 * max target length + 1]) by the
    forward algorithm in log space; log_alpha is -inf where torch leaves it unwritten."""
    c = _Ctc(node, log_probs, targets)
    T, N, S = c.T, c.N, c.S
    ninf = c.neg_inf((N, S))
    if T == 0:
        log_alpha = c.neg_inf((N, 0, S))
    else:
        s = jnp.arange(S)[None]
        has_target = jnp.asarray(c.tg_lens > 0)[:, None]
        alpha0 = jnp.where(s == 0, c.lp_ext[0], jnp.where((s == 1) & has_target, c.lp_ext[0], ninf))
        alpha0 = jnp.where(c.valid_s, alpha0, ninf)

        def step(alpha, lp_t):
            la3 = jnp.where(c.skip, _shift(alpha, 2, _NEG_INF), ninf)
            new = _logadd3(alpha, _shift(alpha, 1, _NEG_INF), la3) + lp_t
            new = jnp.where(c.valid_s, new, ninf)
            return new, new

        _, rest = lax.scan(step, alpha0, c.lp_ext[1:])
        log_alpha = jnp.concatenate([alpha0[None], rest], axis=0)  # [T, N, S]
        live = jnp.asarray(np.arange(T)[:, None] < c.in_lens[None, :])[..., None]
        log_alpha = jnp.where(live, log_alpha, jnp.full((), _NEG_INF, c.ct))
        log_alpha = jnp.transpose(log_alpha, (1, 0, 2))
    # The likelihood: alpha at the last input step, in l' positions 2L and 2L - 1.
    last_t = np.maximum(c.in_lens - 1, 0)
    rows = np.arange(N)
    if T == 0:
        l1 = l2 = c.neg_inf((N,))
    else:
        final = log_alpha[rows, last_t]  # [N, S]
        l1 = final[rows, 2 * c.tg_lens]
        l2 = jnp.where(
            jnp.asarray(c.tg_lens > 0), final[rows, np.maximum(2 * c.tg_lens - 1, 0)], _NEG_INF
        )
    m = jnp.maximum(l1, l2)
    m = jnp.where(m == _NEG_INF, jnp.zeros((), m.dtype), m)
    nll = -(jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m)
    # No input steps: the empty target has likelihood 1, any other 0.
    empty = jnp.asarray(c.in_lens == 0)
    nll = jnp.where(empty, jnp.where(jnp.asarray(c.tg_lens == 0), -0.0, jnp.inf), nll)
    return nll.astype(out_dtype(node, 0)), log_alpha.astype(out_dtype(node, 1))


@register("aten::_ctc_loss_backward.default")
def _ctc_loss_backward(node, grad, log_probs, targets, nll, log_alpha):
    """torch's CTC gradient: beta by the backward recursion, then per class c at step t
    exp(lp) - exp(logsumexp_{s: l'(s) = c}(alpha + beta) + nll - lp), times the incoming
    gradient; zero past each input length, and for infinite losses when zero_infinity."""
    c = _Ctc(node, log_probs, targets)
    T, N, S, C = c.T, c.N, c.S, c.C
    dt = out_dtype(node)
    if T == 0:
        return jnp.zeros(log_probs.shape, dt)
    ninf = c.neg_inf((N, S))
    s = jnp.arange(S)[None]
    two_l = jnp.asarray(2 * c.tg_lens)[:, None]
    start = jnp.asarray(c.in_lens - 1)[:, None]  # the step each sequence's beta starts at

    def step(beta, xs):
        lp_t, t = xs
        init = jnp.where((s == two_l) | ((s == two_l - 1) & (two_l > 0)), lp_t, ninf)
        lb3 = jnp.where(c.skip_back, _shift(beta, -2, _NEG_INF), ninf)
        rec = _logadd3(beta, _shift(beta, -1, _NEG_INF), lb3) + lp_t
        new = jnp.where(t == start, init, jnp.where(t < start, rec, ninf))
        new = jnp.where(c.valid_s, new, ninf)
        return new, new

    ts = jnp.arange(T - 1, -1, -1)
    _, betas = lax.scan(step, ninf, (c.lp_ext[::-1], ts))
    log_beta = betas[::-1]  # [T, N, S]
    ab = jnp.transpose(log_alpha.astype(c.ct), (1, 0, 2)) + log_beta
    # Per class: logsumexp over the l' positions holding it (shift by each class's max).
    t_idx = jnp.arange(T)[:, None, None]
    n_idx = jnp.arange(N)[None, :, None]
    cls = jnp.broadcast_to(c.lprime[None], (T, N, S))
    mx = jnp.full((T, N, C), _NEG_INF, c.ct).at[t_idx, n_idx, cls].max(ab)
    mx = jnp.where(jnp.isfinite(mx), mx, jnp.zeros((), c.ct))
    share = jnp.exp(ab - mx[t_idx, n_idx, cls])
    total = jnp.zeros((T, N, C), c.ct).at[t_idx, n_idx, cls].add(share)
    lcab = jnp.log(total) + mx
    nll_b = nll.astype(c.ct)[None, :, None]
    g = (jnp.exp(c.lp) - jnp.exp(lcab + nll_b - c.lp)) * grad.astype(c.ct)[None, :, None]
    live = jnp.asarray(np.arange(T)[:, None] < c.in_lens[None, :])[..., None]
    g = jnp.where(live, g, jnp.zeros((), c.ct))
    if node.attrs["zero_infinity"]:
        g = jnp.where(nll_b == jnp.inf, jnp.zeros((), c.ct), g)
    return g.astype(dt)


# -- margin losses --------------------------------------------------------------------------------

_NONE, _MEAN_R, _SUM_R = 0, 1, 2


def _reduce(losses, reduction: int, shape):
    if reduction == _NONE:
        return losses.reshape(shape)
    if reduction == _MEAN_R:
        return jnp.mean(losses).reshape(shape)
    if reduction == _SUM_R:
        return jnp.sum(losses).reshape(shape)
    raise ValueError(f"reduction {reduction} is not one of 0 (none), 1 (mean), 2 (sum)")


def _classes(x) -> int:
    return x.shape[-1] if x.ndim else 1


def _multi_margin(x, target, p, margin, weight, reduction, shape):
    if not isinstance(p, (int, float)) or p not in (1, 2):
        raise ValueError(f"multi_margin_loss: p must be 1 or 2, got {p!r}")
    c = _classes(x)
    x2 = x.reshape(-1, c)
    t = target.reshape(-1).astype(jnp.int32)
    picked = jnp.take_along_axis(x2, t[:, None], axis=1, mode="clip")
    z = margin - picked + x2
    h = jnp.where(z > 0, z if p == 1 else z * z, jnp.zeros((), x2.dtype))
    if weight is not None:
        h = h * jnp.take(weight.astype(x2.dtype), t, mode="clip")[:, None]
    h = jnp.where(jnp.arange(c)[None, :] == t[:, None], jnp.zeros((), x2.dtype), h)
    return _reduce(jnp.sum(h, axis=1) / c, reduction, shape)


@register("aten::multi_margin_loss.default")
def _multi_margin_loss(node, x, target, weight):
    a = node.attrs
    require_float(x, "multi_margin_loss")
    _runtime_checks.in_range(node, target, 0, _classes(x), x.ndim - 1, "target")
    dt = out_dtype(node)
    return _multi_margin(
        x.astype(dt), target, a["p"], a["margin"], weight, a["reduction"], out_dims(node)
    ).astype(dt)


@register("aten::multi_margin_loss_backward.default")
def _multi_margin_loss_backward(node, grad, x, target, weight):
    a = node.attrs
    dt = out_dtype(node)
    shape = grad.shape
    _, vjp = jax.vjp(
        lambda v: _multi_margin(v, target, a["p"], a["margin"], weight, a["reduction"], shape),
        x.astype(dt),
    )
    return vjp(grad.astype(dt))[0].astype(dt)


def _multilabel_margin(x, target, reduction, shape):
    c = _classes(x)
    x2 = x.reshape(-1, c)
    t2 = target.reshape(-1, c).astype(jnp.int32)
    # A row's targets run up to its first negative entry.
    valid = jnp.cumprod((t2 >= 0).astype(jnp.int32), axis=1).astype(bool)
    safe = jnp.where(valid, t2, 0)
    rows = jnp.arange(x2.shape[0])[:, None]
    is_target = jnp.zeros(x2.shape, bool).at[rows, safe].max(valid)
    picked = jnp.take_along_axis(x2, safe, axis=1, mode="clip")  # [N, J]
    z = 1 - picked[:, :, None] + x2[:, None, :]  # [N, J, K]
    use = valid[:, :, None] & ~is_target[:, None, :] & (z > 0)
    losses = jnp.sum(jnp.where(use, z, jnp.zeros((), x2.dtype)), axis=(1, 2)) / c
    return _reduce(losses, reduction, shape), is_target


@register("aten::multilabel_margin_loss_forward.default")
def _multilabel_margin_loss(node, x, target):
    require_float(x, "multilabel_margin_loss")
    # (-1 ends a row's targets; torch checks every entry, those after it too)
    _runtime_checks.in_range(node, target, -1, _classes(x), x.ndim - 1, "target")
    dt = out_dtype(node)
    loss, is_target = _multilabel_margin(
        x.astype(dt), target, node.attrs["reduction"], out_dims(node)
    )
    return loss.astype(dt), is_target.reshape(out_dims(node, 1)).astype(out_dtype(node, 1))


@register("aten::multilabel_margin_loss_backward.default")
def _multilabel_margin_loss_backward(node, grad, x, target, is_target):
    dt = out_dtype(node)
    reduction = node.attrs["reduction"]
    _, vjp = jax.vjp(
        lambda v: _multilabel_margin(v, target, reduction, grad.shape)[0], x.astype(dt)
    )
    return vjp(grad.astype(dt))[0].astype(dt)
