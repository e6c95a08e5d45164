"""Interpolation (the upsample ops): nearest, nearest-exact, linear, cubic and antialiased, with
their backward ops; the taps (indices and weights) are computed at trace time with NumPy, as
torch's CPU kernels compute them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ir_runtime._lowering._registry import out_dtype, register
from ir_runtime._lowering.sampling._common import compute_dtype, require_float


def _scales_value(scale, n_in: int, n_out: int, ft):
    """torch's ``compute_scales_value``: 1 / scale where a positive scale was given."""
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(n_in) / ft(n_out)


def _area_scale(n_in: int, n_out: int, align: bool, scale, ft):
    """torch's ``area_pixel_compute_scale``."""
    if align:
        return ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0)
    return _scales_value(scale, n_in, n_out, ft)


def _source_index(scale, n_out: int, align: bool, cubic: bool, ft):
    """torch's ``area_pixel_compute_source_index`` for every output index."""
    i = np.arange(n_out).astype(ft)
    if align:
        return (scale * i).astype(ft)
    src = (scale * (i + ft(0.5)) - ft(0.5)).astype(ft)
    return src if cubic else np.where(src < 0, ft(0), src).astype(ft)


def _guard(src, n_in: int, ft):
    """torch's ``guard_index_and_lambda``: the floor index (at most n_in - 1) and the fraction."""
    idx = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - idx.astype(ft), ft(0), ft(1)).astype(ft)
    return idx, lam


def _cc1(x, a):
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _cc2(x, a):
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


def cubic_coeffs(t, a):
    """torch's ``get_cubic_upsample_coefficients`` (works on NumPy and JAX arrays)."""
    x2 = 1 - t
    return [_cc2(t + 1, a), _cc1(t, a), _cc1(x2, a), _cc2(x2 + 1, a)]


def _aa_filter_linear(x):
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0)


def _aa_filter_cubic(x):
    a = -0.5  # Keys' a, as Pillow and torch's antialiased bicubic use
    x = np.abs(x)
    return np.where(x < 1, _cc1(x, a), np.where(x < 2, _cc2(x, a), 0))


def _taps(kind: str, n_in: int, n_out: int, align: bool, scale, ft, forward: bool):
    """(indices [n_out, K], weights [n_out, K] or None) of output positions along one axis,
    as torch's CPU kernels compute them (for the forward op, or for the backward op's
    transpose where torch's two kernels differ)."""
    out = np.arange(n_out)
    if kind == "nearest":
        if n_out == n_in:
            idx = out
        elif n_out == 2 * n_in:
            idx = out >> 1
        else:
            s = _scales_value(scale, n_in, n_out, np.float32)
            idx = np.minimum(np.floor(out.astype(np.float32) * s).astype(np.int64), n_in - 1)
        return idx[:, None], None
    if kind == "nearest_exact":
        s = _scales_value(scale, n_in, n_out, np.float32)
        # (dst + 0.5) * scale in double, then floorf: the product rounds to float first.
        prod = ((out + 0.5) * np.float64(s)).astype(np.float32)
        idx = np.minimum(np.floor(prod).astype(np.int64), n_in - 1)
        return idx[:, None], None
    if n_out == n_in and (kind == "linear" or (forward and kind in ("aa_linear", "aa_cubic"))):
        # torch copies an axis whose size does not change, whatever scale it is given: linear
        # modes both ways, antialiased ones only forward (their backward applies the scale);
        # bicubic's forward never does (its backward does: see the backward rule).
        return out[:, None], None
    s = _area_scale(n_in, n_out, align, scale, ft)
    if kind == "linear":
        idx0, lam = _guard(_source_index(s, n_out, align, False, ft), n_in, ft)
        idx1 = idx0 + (idx0 < n_in - 1)
        return np.stack([idx0, idx1], 1), np.stack([ft(1) - lam, lam], 1).astype(ft)
    if kind == "cubic":
        idx0, t = _guard(_source_index(s, n_out, align, True, ft), n_in, ft)
        w = np.stack(cubic_coeffs(t, ft(-0.75)), 1).astype(ft)
        idx = np.clip(idx0[:, None] + np.arange(-1, 3)[None, :], 0, n_in - 1)
        return idx, w
    # Antialiased (separable, as Pillow): torch's _compute_indices_min_size_weights_aa.
    interp, filt = (2, _aa_filter_linear) if kind == "aa_linear" else (4, _aa_filter_cubic)
    support = ft(interp * 0.5) * s if s >= 1 else ft(interp * 0.5)
    max_size = int(np.ceil(support)) * 2 + 1
    invscale = ft(1) / s if s >= 1 else ft(1)
    center = (s * (out + 0.5)).astype(ft)
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)
    xsize = np.minimum((center + support + 0.5).astype(np.int64), n_in) - xmin
    xsize = np.clip(xsize, 0, max_size)
    j = np.arange(max_size)[None, :]
    used = j < xsize[:, None]
    arg = ((j + xmin[:, None]) - center[:, None] + 0.5) * invscale
    w = np.where(used, filt(arg.astype(ft)), 0).astype(ft)
    total = w.sum(1, keepdims=True, dtype=ft)
    w = np.where(total != 0, w / np.where(total != 0, total, 1), w).astype(ft)
    idx = np.clip(xmin[:, None] + j, 0, n_in - 1)
    return idx, w


def _apply_taps(y, axis: int, idx, w):
    """Sum over taps k of y taken at idx[:, k] along ``axis``, times w[:, k]."""
    shape = [1] * y.ndim
    shape[axis] = idx.shape[0]
    out = None
    for k in range(idx.shape[1]):
        term = jnp.take(y, jnp.asarray(idx[:, k]), axis=axis, mode="clip")
        if w is not None:
            term = term * jnp.asarray(w[:, k].reshape(shape), y.dtype)
        out = term if out is None else out + term
    return out


def _resample(kind: str, x, out_sizes, align: bool, scales, op: str, forward: bool = True):
    """x [N, C, *spatial] resampled to ``out_sizes`` one spatial axis at a time."""
    n = len(out_sizes)
    if kind not in ("nearest", "nearest_exact"):
        require_float(x, op)
        x = x.astype(compute_dtype(x.dtype))
    ft = np.dtype(compute_dtype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else "f4")
    for a in range(n):
        axis = x.ndim - n + a
        idx, w = _taps(kind, x.shape[axis], out_sizes[a], align, scales[a], ft.type, forward)
        x = _apply_taps(x, axis, idx, w)
    return x


_SCALE_NAMES = {
    1: ("scales",),
    2: ("scales_h", "scales_w"),
    3: ("scales_d", "scales_h", "scales_w"),
}


def _upsample_rules(kind: str, forward: str, backward: str, n: int, has_align: bool):
    names = _SCALE_NAMES[n]

    def attrs(node):
        a = node.attrs
        align = a["align_corners"] if has_align else False
        return tuple(a["output_size"]), align, [a[s] for s in names]

    @register(forward)
    def rule(node, x):
        size, align, scales = attrs(node)
        return _resample(kind, x, size, align, scales, forward).astype(out_dtype(node))

    @register(backward)
    def rule_backward(node, grad):
        size, align, scales = attrs(node)
        ct = compute_dtype(grad.dtype)
        if kind == "cubic" and tuple(node.attrs["input_size"][2:]) == size:
            # torch's bicubic backward copies when no size changes, though its forward still
            # applies a given scale there: the gradient torch gives.
            return grad.astype(out_dtype(node))
        primal = jnp.zeros(tuple(node.attrs["input_size"]), ct)
        _, vjp = jax.vjp(lambda v: _resample(kind, v, size, align, scales, backward, False), primal)
        return vjp(grad.astype(ct))[0].astype(out_dtype(node))

    return rule, rule_backward


for _n in (1, 2, 3):
    _upsample_rules(
        "nearest",
        f"aten::upsample_nearest{_n}d.default",
        f"aten::upsample_nearest{_n}d_backward.default",
        _n,
        False,
    )
    _upsample_rules(
        "nearest_exact",
        f"aten::_upsample_nearest_exact{_n}d.default",
        f"aten::_upsample_nearest_exact{_n}d_backward.default",
        _n,
        False,
    )
for _name, _n in (("linear1d", 1), ("bilinear2d", 2), ("trilinear3d", 3)):
    _upsample_rules(
        "linear",
        f"aten::upsample_{_name}.default",
        f"aten::upsample_{_name}_backward.default",
        _n,
        True,
    )
_upsample_rules(
    "cubic",
    "aten::upsample_bicubic2d.default",
    "aten::upsample_bicubic2d_backward.default",
    2,
    True,
)
_upsample_rules(
    "aa_linear",
    "aten::_upsample_bilinear2d_aa.default",
    "aten::_upsample_bilinear2d_aa_backward.default",
    2,
    True,
)
_upsample_rules(
    "aa_cubic",
    "aten::_upsample_bicubic2d_aa.default",
    "aten::_upsample_bicubic2d_aa_backward.default",
    2,
    True,
)
