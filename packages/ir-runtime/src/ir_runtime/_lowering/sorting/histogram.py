"""Histograms: histc, histogram and histogramdd (torch's histogramdd_cpu_contiguous), bin edges
as torch's linspace computes them.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from ir_runtime._lowering._registry import NATIVE, family, ieee_div, out_dtype
from ir_runtime._lowering.sorting._common import is_float

# Half precision: NATIVE (``_registry``): this family rounds after every operation itself, as
# torch's c10::BFloat16 and c10::Half arithmetic does (``_arith``).
register = family(NATIVE)


_HALF = (jnp.float16, jnp.bfloat16)


def _arith(dt):
    """``(compute dtype, round)``: torch's c10::Half/BFloat16 arithmetic is float arithmetic
    rounded after every operation. The rounding is ``reduce_precision`` (XLA's CPU fusions
    may drop a float32 -> float16 -> float32 round trip), float16's subnormals by hand (it
    flushes them)."""
    if dt == jnp.bfloat16:
        return jnp.float32, lambda v: lax.reduce_precision(v, 8, 7)
    if dt == jnp.float16:

        def r(v):
            sub = jnp.round(v * 2.0**24) * 2.0**-24  # float16's subnormal grid, exact
            return jnp.where(jnp.abs(v) < 2.0**-14, sub, lax.reduce_precision(v, 5, 10))

        return jnp.float32, r
    return dt, lambda v: v


def _split_hi(a):
    """The high 26 bits of float64 ``a`` (Dekker's split, by masking: exact)."""
    bits = lax.bitcast_convert_type(a, jnp.uint64) & jnp.uint64(0xFFFFFFFFF8000000)
    return lax.bitcast_convert_type(bits, jnp.float64)


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fma_int(a, i, c, dt):
    """``a * i + c`` rounded once to ``dt`` (the FMA torch's compiler makes of its linspace):
    ``a``, ``c`` of ``dt``, ``i`` small integers."""
    f64 = jnp.float64
    if dt == jnp.float32:
        p = a.astype(f64) * i.astype(f64)  # exact: 24 bits times < 2**29
        s, e = _two_sum(p, c.astype(f64))
        f = s.astype(jnp.float32)
        d = s - f.astype(f64)
        g = jnp.nextafter(f, jnp.where(d > 0, jnp.inf, -jnp.inf).astype(jnp.float32))
        mid = (d != 0) & (d == (g.astype(f64) - f.astype(f64)) / 2)
        # s is halfway between f and g: the exact value, s + e, is past it when e has d's sign.
        return jnp.where(mid & (e * d > 0), g, f)
    # float64: a = hi + lo (26 bits each), each product exact; a compensated sum.
    a = a.astype(f64)
    hi = _split_hi(a)
    i = i.astype(f64)
    s1, e1 = _two_sum(c.astype(f64), hi * i)
    s2, e2 = _two_sum(s1, (a - hi) * i)
    return s2 + (e1 + e2)


def _linspace(lo, hi, steps: int, dt):
    """torch.linspace(lo, hi, steps) in ``dt`` as torch's CPU kernel computes it: from both
    ends (``start + step * i`` below halfway, ``end - step * (steps - 1 - i)`` above)."""
    i = jnp.arange(steps, dtype=jnp.int64)
    half = steps // 2
    if dt in _HALF:
        cd, r = _arith(dt)
        start, end = r(lo.astype(cd)), r(hi.astype(cd))
        step = r(ieee_div(r(end - start), r(jnp.asarray(steps - 1, cd))))
        up = r(start + r(step * r(i.astype(cd))))
        down = r(end - r(step * r((steps - 1 - i).astype(cd))))
        return jnp.where(i < half, up, down).astype(dt)
    start, end = lo.astype(dt), hi.astype(dt)
    step = ieee_div(end - start, jnp.asarray(steps - 1, dt))
    up = _fma_int(step, i, start, dt)
    down = _fma_int(-step, steps - 1 - i, end, dt)
    return jnp.where(i < half, up, down).astype(dt)


def _upper_bound(edges, v, lo, hi, max_len: int):
    """libstdc++'s ``std::upper_bound(edges + lo, edges + hi, v)``, step by step."""
    first, ln = lo, hi - lo
    for _ in range(max(max_len, 0).bit_length()):
        act = ln > 0
        half = ln >> 1
        middle = first + half
        left = v < edges[jnp.clip(middle, 0, edges.shape[0] - 1)]
        first = jnp.where(act & ~left, middle + 1, first)
        ln = jnp.where(act, jnp.where(left, half, ln - half - 1), ln)
    return first


def _hist(x2, edges, weight, density: bool, how: str):
    """The D-dimensional histogram of the rows of ``x2`` (M, D) over ``edges`` (D sequences):
    ``how`` is "linear" (histc), "local" (histogram with a bin count: linear, then a search
    of the neighbouring bins) or "search" (given edges: std::upper_bound)."""
    dt = x2.dtype
    cd, r = _arith(dt)
    m = x2.shape[0]
    keep = jnp.ones((m,), bool)
    flat = jnp.zeros((m,), jnp.int64)
    sizes = tuple(e.shape[0] - 1 for e in edges)
    for d, e in enumerate(edges):
        nb = sizes[d]
        elt = x2[:, d]
        left, right = e[0], e[-1]
        keep = keep & (elt >= left) & (elt <= right)
        if how == "search":
            pos = _upper_bound(e, elt, jnp.zeros((m,), jnp.int64), jnp.full((m,), nb + 1), nb + 1)
        else:
            ec, lc, rc = elt.astype(cd), left.astype(cd), right.astype(cd)
            q = r(ieee_div(r(r(ec - lc) * jnp.asarray(nb, cd)), r(rc - lc)))
            pos = jnp.where(keep, q, 0).astype(jnp.int64)
            if how == "local":
                lo = jnp.maximum(pos - 1, 0)
                hi = jnp.minimum(pos + 2, nb + 1)
                pos = _upper_bound(e, elt, lo, hi, 3)
            else:
                pos = pos + 1  # the same "- 1" as after a search
        pos = pos - 1
        pos = jnp.where(pos == nb, nb - 1, pos)
        flat = flat * nb + jnp.clip(pos, 0, nb - 1)
    total = math.prod(sizes)
    w = jnp.ones((m,), dt) if weight is None else weight.reshape(-1).astype(dt)
    hist = jnp.zeros((total,), dt).at[jnp.where(keep, flat, total)].add(w, mode="drop")
    hist = hist.reshape(sizes)
    if density:
        hist = ieee_div(hist, jnp.sum(hist))
        for d, e in enumerate(edges):
            shape = [1] * len(edges)
            shape[d] = sizes[d]
            hist = ieee_div(hist, (e[1:] - e[:-1]).reshape(shape))
    return hist


def _outer_edges(x2, rng, op: str):
    """torch's select_outer_bin_edges: (lo, hi) float64 per dim, and whether torch would have
    refused them (not finite, from the data): a histogram made of NaN then."""
    d = x2.shape[1]
    if rng is not None:
        if len(rng) != 2 * d:
            raise ValueError(f"{op}: range needs {2 * d} numbers for {d} dims, got {len(rng)}")
        lo = [float(rng[2 * k]) for k in range(d)]
        hi = [float(rng[2 * k + 1]) for k in range(d)]
        for a, b in zip(lo, hi, strict=True):
            if not (math.isfinite(a) and math.isfinite(b)):
                raise ValueError(f"{op}: range [{a}, {b}] is not finite")
            if a > b:
                raise ValueError(f"{op}: min should not exceed max, got range [{a}, {b}]")
        lo, hi = jnp.asarray(lo, jnp.float64), jnp.asarray(hi, jnp.float64)
    elif x2.size > 0:
        lo = jnp.min(x2, axis=0).astype(jnp.float64)
        hi = jnp.max(x2, axis=0).astype(jnp.float64)
    else:
        lo, hi = jnp.zeros((d,), jnp.float64), jnp.ones((d,), jnp.float64)
    bad = ~(jnp.isfinite(lo) & jnp.isfinite(hi))
    eq = lo == hi
    return jnp.where(eq, lo - 0.5, lo), jnp.where(eq, hi + 0.5, hi), jnp.any(bad)


def _check_hist_input(op: str, x):
    if not is_float(x):
        raise ValueError(
            f"{op}: input must be floating point (torch's CPU kernel is), got {x.dtype}"
        )


def _nan_if(bad, a):
    return jnp.where(bad, jnp.asarray(jnp.nan, a.dtype), a)


@register("aten::histc.default")
def _histc(node, x):
    _check_hist_input("histc", x)
    bins = node.attrs["bins"]
    if bins <= 0:
        raise ValueError(f"histc: bins must be > 0, got {bins}")
    mn, mx = node.attrs["min"], node.attrs["max"]
    if isinstance(mn, (int, float)) and isinstance(mx, (int, float)) and mn > mx:
        raise ValueError(f"histc: max must be larger than min (min={mn}, max={mx})")
    flat = x.reshape(-1, 1)
    lo, hi = jnp.asarray(mn, jnp.float64), jnp.asarray(mx, jnp.float64)
    if flat.size > 0:
        same = lo == hi
        lo = jnp.where(same, jnp.min(flat).astype(jnp.float64), lo)
        hi = jnp.where(same, jnp.max(flat).astype(jnp.float64), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    # torch refuses a range that is not finite or empty: NaNs rather than a plausible count.
    bad = ~(jnp.isfinite(lo) & jnp.isfinite(hi)) | ~(lo < hi)
    # Only linspace's ends matter to histc: they are the range itself, in x's dtype.
    edges = jnp.stack([lo, hi]).astype(x.dtype)
    e = jnp.concatenate([edges[:1], jnp.zeros((bins - 1,), x.dtype), edges[1:]])
    return _nan_if(bad, _hist(flat, [e], None, False, "linear")).astype(out_dtype(node))


@register("aten::histogram.bin_ct")
def _histogram_bin_ct(node, x, weight):
    _check_hist_input("histogram", x)
    bins = node.attrs["bins"]
    if bins <= 0:
        raise ValueError(f"histogram: bins must be > 0, got {bins}")
    flat = x.reshape(-1, 1)
    lo, hi, bad = _outer_edges(flat, node.attrs["range"], "histogram")
    edges = _linspace(lo[0], hi[0], bins + 1, x.dtype)
    hist = _hist(flat, [edges], weight, node.attrs["density"], "local")
    return _nan_if(bad, hist), _nan_if(bad, edges)


@register("aten::histogram.bins_tensor")
def _histogram_bins_tensor(node, x, bins, weight):
    _check_hist_input("histogram", x)
    if bins.ndim != 1 or bins.shape[0] == 0:
        raise ValueError("histogram: bins must be a 1-D tensor with at least one edge")
    hist = _hist(x.reshape(-1, 1), [bins.astype(x.dtype)], weight, node.attrs["density"], "search")
    return hist, bins


def _dd_input(op, x):
    _check_hist_input(op, x)
    if x.ndim < 2:
        raise ValueError(f"{op}: input needs at least 2 dims, got {x.ndim}")
    return x.reshape(-1, x.shape[-1])


def _dd_edges(node, x2):
    bins = node.attrs["bins"]
    if len(bins) != x2.shape[1]:
        raise ValueError(f"histogramdd: {len(bins)} bin counts for {x2.shape[1]} dims")
    if any(b <= 0 for b in bins):
        raise ValueError(f"histogramdd: bins must be > 0, got {tuple(bins)}")
    lo, hi, bad = _outer_edges(x2, node.attrs["range"], "histogramdd")
    return [_linspace(lo[d], hi[d], b + 1, x2.dtype) for d, b in enumerate(bins)], bad


@register("aten::_histogramdd_bin_edges.default")
def _histogramdd_bin_edges(node, x, weight):
    edges, bad = _dd_edges(node, _dd_input("histogramdd", x))
    return tuple(_nan_if(bad, e) for e in edges)


@register("aten::_histogramdd_from_bin_cts.default")
def _histogramdd_from_bin_cts(node, x, weight):
    x2 = _dd_input("histogramdd", x)
    edges, bad = _dd_edges(node, x2)
    return _nan_if(bad, _hist(x2, edges, weight, node.attrs["density"], "local"))


@register("aten::_histogramdd_from_bin_tensors.default")
def _histogramdd_from_bin_tensors(node, x, bins, weight):
    x2 = _dd_input("histogramdd", x)
    if len(bins) != x2.shape[1]:
        raise ValueError(f"histogramdd: {len(bins)} edge sequences for {x2.shape[1]} dims")
    for b in bins:
        if b.ndim != 1 or b.shape[0] == 0:
            raise ValueError("histogramdd: each bins tensor must be 1-D with at least one edge")
    edges = [b.astype(x2.dtype) for b in bins]
    return _hist(x2, edges, weight, node.attrs["density"], "search")
