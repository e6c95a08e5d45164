"""Sorting and selection: sort, topk, kthvalue, median, mode, cumulative max/min/product,
logcumsumexp, searchsorted, bucketize, histograms, segment_reduce.

Index outputs are torch CPU's, exactly. Where ties make the index (or the sign of a zero, or
with ``sorted=False`` the order itself) depend on the algorithm torch CPU runs --
``std::sort`` for ``sort(stable=False)`` and ``mode``, ``std::nth_element`` and
``std::partial_sort`` for ``topk``, torch's quickselect for ``kthvalue``, ``std::nth_element``
for ``median``/``nanmedian`` without a dim -- the rule checks for such ties at run time and
only then replays that algorithm step by step (``_Machine``: libstdc++'s introsort,
introselect and heap routines, on every row at once, in ``lax.while_loop``s). Without ties
the result is unique and comes from one stable ``lax.sort``. The replay costs compile time
(about a second per such op), and run time only when there are ties; ``stable=True`` and
dims of at most 16 (``std::sort`` is an insertion sort there) never need it.

Other conventions kept: NaN sorts above everything; cumulative ops accumulate as torch CPU
does (float32 in float64: at::acc_type); histogram bin edges are torch's linspace (from both
ends, with the FMA its compiler makes; float64 edges are faithful, correctly rounded but for
exact halfway cases), a histogram whose range torch would refuse (not finite: NaN or inf in
the data) is NaN; searchsorted and bucketize replay torch's binary search (its path decides
where a NaN or an unsorted sequence sends a value).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from ir_runtime._lowering._registry import norm_dim, out_dims, out_dtype, register

_I32 = jnp.int32


# --------------------------------------------------------------------------------------------
# Keys: integers in torch's order (NaN above everything, every NaN equal, -0.0 == 0.0)


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def _check_real(op: str, x) -> None:
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise ValueError(f"{op}: complex input ({x.dtype}) is not supported (torch refuses it too)")


def _key(x, nan_low: bool = False):
    """An integer array ordered as torch orders ``x``: NaN the largest (the smallest with
    ``nan_low``), all NaNs equal, -0.0 equal to 0.0. Integers are their own key."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.int8)
    if not _is_float(x):
        return x
    it = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[x.dtype.itemsize]
    big = jnp.iinfo(it).max
    b = lax.bitcast_convert_type(x, it)
    k = jnp.where(b < 0, b ^ jnp.asarray(big, it), b)
    k = jnp.where(x == 0, jnp.zeros_like(k), k)
    return jnp.where(jnp.isnan(x), jnp.asarray(jnp.iinfo(it).min if nan_low else big, it), k)


def _negative_zero(x):
    """Whether ``x`` holds a -0.0 anywhere (a tie whose order shows in the values)."""
    if not _is_float(x):
        return jnp.asarray(False)
    return jnp.any((x == 0) & jnp.signbit(x))


def _to_rows(x, axis: int):
    """``x`` with ``axis`` last, as (rows, n), and the shape to go back."""
    moved = jnp.moveaxis(x, axis, -1)
    return moved.reshape(-1, moved.shape[-1]), moved.shape


def _from_rows(r, shape, axis: int):
    return jnp.moveaxis(r.reshape(shape[:-1] + r.shape[-1:]), -1, axis)


def _stable(s, *rest, axis=-1):
    """Stable ascending sort of ``s`` along ``axis``, carrying ``rest`` along."""
    iota = lax.broadcasted_iota(_I32, s.shape, axis if axis >= 0 else s.ndim + axis)
    out = lax.sort(
        (s, iota, *rest), dimension=axis if axis >= 0 else s.ndim + axis, num_keys=1, is_stable=True
    )
    return out


def _lg(n: int) -> int:
    return n.bit_length() - 1


# --------------------------------------------------------------------------------------------
# The machine: libstdc++'s (and torch's) selection algorithms, on every row at once.
#
# State: K (rows, n) keys compared by ``comp``, P (rows, n) the int32 positions they came
# from; every scalar of the C++ code is a (rows,) vector. Each loop runs while any row needs
# it; ``run`` says which rows do, and every write and update is masked by it, so a row's
# values are those of the C++ code run on that row alone.


_GATHER = lax.GatherDimensionNumbers(
    offset_dims=(),
    collapsed_slice_dims=(1,),
    start_index_map=(1,),
    operand_batching_dims=(0,),
    start_indices_batching_dims=(0,),
)
_SCATTER = lax.ScatterDimensionNumbers(
    update_window_dims=(),
    inserted_window_dims=(1,),
    scatter_dims_to_operand_dims=(1,),
    operand_batching_dims=(0,),
    scatter_indices_batching_dims=(0,),
)


def _get(a, i):
    """``a[r, i[r]]`` for every row ``r`` (an index out of range is clamped)."""
    return lax.gather(a, i[:, None], _GATHER, slice_sizes=(1, 1), mode=lax.GatherScatterMode.CLIP)


def _put(a, i, v, on):
    """``a[r, i[r]] = v[r]`` for the rows ``r`` where ``on``."""
    j = jnp.where(on, i, a.shape[1])[:, None]
    return lax.scatter(
        a,
        j,
        v.astype(a.dtype),
        _SCATTER,
        indices_are_sorted=True,
        unique_indices=True,
        mode=lax.GatherScatterMode.FILL_OR_DROP,
    )


def _cdiv2(a):
    """C++'s ``a / 2`` on integers (towards zero)."""
    return lax.div(a, jnp.asarray(2, a.dtype))


def _loop(cond, body, init):
    """while any row's ``cond``: ``body(state, run)`` with ``run`` the rows that loop."""
    return lax.while_loop(lambda s: jnp.any(cond(s)), lambda s: body(s, cond(s)), init)


class _Machine:
    def __init__(self, comp):
        self.comp = comp

    # -- elementary moves

    def swap(self, K, P, i, j, on):
        ki, kj, pi, pj = _get(K, i), _get(K, j), _get(P, i), _get(P, j)
        K = _put(_put(K, i, kj, on), j, ki, on)
        P = _put(_put(P, i, pj, on), j, pi, on)
        return K, P

    def move(self, K, P, dst, src, on):
        return _put(K, dst, _get(K, src), on), _put(P, dst, _get(P, src), on)

    # -- partitioning (std::__unguarded_partition_pivot)

    def median_to_first(self, K, P, result, a, b, c, on):
        c_ = self.comp
        ka, kb, kc = _get(K, a), _get(K, b), _get(K, c)
        ab, bc, ac = c_(ka, kb), c_(kb, kc), c_(ka, kc)
        pick = jnp.where(
            ab, jnp.where(bc, b, jnp.where(ac, c, a)), jnp.where(ac, a, jnp.where(bc, c, b))
        )
        return self.swap(K, P, result, pick, on)

    def unguarded_partition(self, K, P, first, last, pivot, on):
        comp, n = self.comp, K.shape[1]
        pv = _get(K, pivot)

        def body(s, run):
            K, P, f, e, go = s
            f = _loop(
                lambda f: run & (f < n - 1) & comp(_get(K, f), pv),
                lambda f, r: jnp.where(r, f + 1, f),
                f,
            )
            e = jnp.where(run, e - 1, e)
            e = _loop(
                lambda e: run & (e > 0) & comp(pv, _get(K, e)),
                lambda e, r: jnp.where(r, e - 1, e),
                e,
            )
            cross = ~(f < e)
            sw = run & ~cross
            K, P = self.swap(K, P, f, e, sw)
            return K, P, jnp.where(sw, f + 1, f), e, go & ~(run & cross)

        K, P, f, _, _ = _loop(lambda s: s[4], body, (K, P, first, last, on))
        return K, P, f

    def partition_pivot(self, K, P, first, last, on):
        mid = first + (last - first) // 2
        K, P = self.median_to_first(K, P, first, first + 1, mid, last - 1, on)
        return self.unguarded_partition(K, P, first + 1, last, first, on)

    # -- heaps (std::__adjust_heap and friends)

    def push_heap(self, K, P, first, hole, top, kv, pv, on):
        comp = self.comp

        def cond(s):
            parent = (s[2] - 1) // 2
            return on & (s[2] > top) & comp(_get(s[0], first + parent), kv)

        def body(s, run):
            K, P, hole = s
            parent = (hole - 1) // 2
            K, P = self.move(K, P, first + hole, first + parent, run)
            return K, P, jnp.where(run, parent, hole)

        K, P, hole = _loop(cond, body, (K, P, hole))
        return _put(K, first + hole, kv, on), _put(P, first + hole, pv, on)

    def adjust_heap(self, K, P, first, hole, ln, kv, pv, on):
        comp = self.comp
        top = hole

        def body(s, run):
            K, P, hole, second = s
            sc = 2 * (second + 1)
            sc = jnp.where(comp(_get(K, first + sc), _get(K, first + sc - 1)), sc - 1, sc)
            K, P = self.move(K, P, first + hole, first + sc, run)
            return K, P, jnp.where(run, sc, hole), jnp.where(run, sc, second)

        K, P, hole, second = _loop(lambda s: on & (s[3] < _cdiv2(ln - 1)), body, (K, P, hole, hole))
        tail = on & ((ln & 1) == 0) & (second == _cdiv2(ln - 2))
        sc = 2 * (second + 1)
        K, P = self.move(K, P, first + hole, first + sc - 1, tail)
        hole = jnp.where(tail, sc - 1, hole)
        return self.push_heap(K, P, first, hole, top, kv, pv, on)

    def heap(self, K, P, first, middle, last, on, sort: bool):
        """``std::__heap_select(first, middle, last)``, then with ``sort``
        ``std::__sort_heap(first, middle)``: one loop, one ``__adjust_heap`` per step.

        Phase 0 builds the heap (``__make_heap``: a parent a step, from the last down to 0),
        phase 1 pops the heap's top for each element of [middle, last) below it
        (``__pop_heap``), phase 2 sorts the heap (a ``__pop_heap`` a step)."""
        comp = self.comp
        ln = middle - first
        heap0 = ln >= 2

        def cond(s):
            _, _, phase, c = s
            return on & (
                ((phase == 0) & (c >= 0))
                | ((phase == 1) & (c < last))
                | ((phase == 2) & (c - first > 1))
            )

        def body(s, run):
            K, P, phase, c = s
            p0, p1, p2 = run & (phase == 0), run & (phase == 1), run & (phase == 2)
            hit = p1 & comp(_get(K, c), _get(K, first))
            end = jnp.where(p2, c - 1, c)  # phase 2: the heap's new end, where its top goes
            src = jnp.where(p0, first + c, end)  # the value that sifts down
            kv, pv = _get(K, src), _get(P, src)
            K, P = self.move(K, P, end, first, hit | p2)
            hole = jnp.where(p0, c, 0)
            size = jnp.where(p2, end - first, ln)
            K, P = self.adjust_heap(K, P, first, hole, size, kv, pv, p0 | hit | p2)
            c = jnp.where(p0 | p1, c + jnp.where(p0, -1, 1), end)
            # Phase changes: 0 -> 1 past the first parent, 1 -> 2 (or done) past ``last``.
            to1 = p0 & (c < 0)
            phase = jnp.where(to1, 1, phase)
            c = jnp.where(to1, middle, c)
            to2 = run & (phase == 1) & (c >= last)
            phase = jnp.where(to2, 2 if sort else 3, phase)
            c = jnp.where(to2, middle, c)
            return K, P, phase, c

        init = (K, P, jnp.where(heap0, 0, 1).astype(_I32), jnp.where(heap0, _cdiv2(ln - 2), middle))
        K, P, _, _ = _loop(cond, body, init)
        return K, P

    # -- insertion sort (std::__insertion_sort; ``final``: std::__final_insertion_sort)

    def insertion_sort(self, K, P, first, last, on, final=False):
        comp = self.comp

        def body(s, run):
            K, P, i = s
            v, pv = _get(K, i), _get(P, i)
            guarded = (i < first + 16) if final else jnp.ones_like(run)
            rot = guarded & comp(v, _get(K, first))

            def shift(t, r):
                K, P, j = t
                K, P = self.move(K, P, j, j - 1, r)
                return K, P, jnp.where(r, j - 1, j)

            K, P, j = _loop(
                lambda t: run & (t[2] > first) & (rot | comp(v, _get(t[0], t[2] - 1))),
                shift,
                (K, P, i),
            )
            return _put(K, j, v, run), _put(P, j, pv, run), jnp.where(run, i + 1, i)

        K, P, _ = _loop(lambda s: on & (s[2] < last), body, (K, P, first + 1))
        return K, P

    # -- the algorithms

    def sort(self, K, P, m: int):
        """``std::sort(first, first + m)``."""
        rows = K.shape[0]
        zero = jnp.zeros((rows,), _I32)
        if m <= 1:
            return K, P
        if m > 16:
            depth = 2 * _lg(m)
            size = depth + 3
            stack = jnp.zeros((rows, size, 3), _I32).at[:, 0].set(jnp.asarray([0, m, depth], _I32))
            r = jnp.arange(rows)

            def body(s, run):
                K, P, stack, sp = s
                sp = jnp.where(run, sp - 1, sp)
                top = stack[r, jnp.clip(sp, 0, size - 1)]
                f, e, d = top[:, 0], top[:, 1], top[:, 2]
                big = run & (e - f > 16)
                heap, part = big & (d == 0), big & (d > 0)
                K, P = self.heap(K, P, f, e, e, heap, sort=True)
                K, P, cut = self.partition_pivot(K, P, f, e, part)
                for lo, hi in ((cut, e), (f, cut)):
                    entry = jnp.stack([lo, hi, d - 1], axis=1)
                    at = jnp.where(part, sp, size)
                    stack = stack.at[r, at].set(entry, mode="drop")
                    sp = sp + part.astype(_I32)
                return K, P, stack, sp

            K, P, _, _ = _loop(lambda s: s[3] > 0, body, (K, P, stack, zero + 1))
        return self.insertion_sort(K, P, zero, zero + m, jnp.ones((rows,), bool), final=True)

    def nth_element(self, K, P, nth):
        """``std::nth_element(first, first + nth, last)``."""
        rows, n = K.shape
        if n == 0:
            return K, P
        zero = jnp.zeros((rows,), _I32)

        def body(s, run):
            K, P, f, e, depth, done = s
            h = run & (depth == 0)
            K, P = self.heap(K, P, f, nth + 1, e, h, sort=False)
            K, P = self.swap(K, P, f, nth, h)
            p = run & ~h
            K, P, cut = self.partition_pivot(K, P, f, e, p)
            f = jnp.where(p & (cut <= nth), cut, f)
            e = jnp.where(p & (cut > nth), cut, e)
            return K, P, f, e, jnp.where(p, depth - 1, depth), done | h

        init = (K, P, zero, zero + n, zero + 2 * _lg(n), jnp.zeros((rows,), bool))
        K, P, f, e, _, done = _loop(lambda s: ~s[5] & (s[3] - s[2] > 3), body, init)
        return self.insertion_sort(K, P, f, e, ~done)

    def partial_sort(self, K, P, k: int):
        """``std::partial_sort(first, first + k, last)``."""
        rows, n = K.shape
        zero = jnp.zeros((rows,), _I32)
        on = jnp.ones((rows,), bool)
        return self.heap(K, P, zero, zero + k, zero + n, on, sort=True)

    def quick_select(self, K, P, k):
        """torch's ``quick_select_template`` (kthvalue): ``comp`` is its ``gt_or_nan``."""
        gt, n = self.comp, K.shape[1]
        rows = K.shape[0]
        zero = jnp.zeros((rows,), _I32)

        def body(s, run):
            K, P, L, R, done = s
            one, two = R <= L, R == L + 1
            K, P = self.swap(K, P, L, R, run & ~one & two & gt(_get(K, L), _get(K, R)))
            gen = run & ~one & ~two
            mid = (L + R) >> 1
            K, P = self.swap(K, P, mid, L + 1, gen)
            K, P = self.swap(K, P, L + 1, R, gen & gt(_get(K, L + 1), _get(K, R)))
            K, P = self.swap(K, P, L, R, gen & gt(_get(K, L), _get(K, R)))
            K, P = self.swap(K, P, L + 1, L, gen & gt(_get(K, L + 1), _get(K, L)))
            piv = _get(K, L)

            def part(t, r):
                K, P, i, j, go = t
                i = jnp.where(r, i + 1, i)
                i = _loop(
                    lambda i: r & (i < n - 1) & gt(piv, _get(K, i)),
                    lambda i, q: jnp.where(q, i + 1, i),
                    i,
                )
                j = jnp.where(r, j - 1, j)
                j = _loop(
                    lambda j: r & (j > 0) & gt(_get(K, j), piv),
                    lambda j, q: jnp.where(q, j - 1, j),
                    j,
                )
                brk = j < i
                K, P = self.swap(K, P, i, j, r & ~brk)
                return K, P, i, j, go & ~(r & brk)

            K, P, i, j, _ = _loop(lambda t: t[4], part, (K, P, L + 1, R, gen))
            K, P = self.swap(K, P, L, j, gen)
            L = jnp.where(gen & (j <= k), i, L)
            R = jnp.where(gen & (j >= k), j - 1, R)
            return K, P, L, R, done | (run & (one | two))

        init = (K, P, zero, zero + n - 1, jnp.zeros((rows,), bool))
        K, P, _, _, _ = _loop(lambda s: ~s[4], body, init)
        return K, P


def _lt(a, b):
    return a < b


def _gt(a, b):
    return a > b


def _iota_rows(rows: int, n: int):
    return jnp.broadcast_to(jnp.arange(n, dtype=_I32), (rows, n))


# --------------------------------------------------------------------------------------------
# sort, argsort (torch decomposes it to sort.stable), msort


def _take(x, idx, axis):
    return jnp.take_along_axis(x, idx, axis=axis)


def _adjacent_equal(s, axis, upto=None):
    """Whether any two neighbours along ``axis`` of sorted keys ``s`` are equal (among the
    first ``upto`` + 1)."""
    n = s.shape[axis]
    m = n - 1 if upto is None else min(upto, n - 1)
    if m <= 0:
        return jnp.asarray(False)
    a = lax.slice_in_dim(s, 0, m, axis=axis)
    b = lax.slice_in_dim(s, 1, m + 1, axis=axis)
    return jnp.any(a == b)


def _machine_rows(s, axis, fn):
    """``fn(K, P) -> P`` on the rows of ``s`` along ``axis``; the positions, back in shape."""
    rows, shape = _to_rows(s, axis)
    p = fn(rows, _iota_rows(*rows.shape))
    return _from_rows(p, (*shape[:-1], p.shape[-1]), axis)


def _sort(node, x, stable: bool):
    _check_real("sort", x)
    dt = out_dtype(node, 1)
    if x.ndim == 0:
        return x, jnp.zeros((), dt)
    axis = norm_dim(node.attrs["dim"], x.ndim)
    descending = node.attrs["descending"]
    n = x.shape[axis]
    k = _key(x)
    s = ~k if descending else k
    ks, idx, vals = _stable(s, x, axis=axis)
    if stable or n <= 16 or x.size == 0:
        # stable=True is std::stable_sort; at most 16 elements std::sort is an insertion sort,
        # stable too. Either way the order is this one.
        return vals, idx.astype(dt)

    def exact():
        return _machine_rows(s, axis, lambda K, P: _Machine(_lt).sort(K, P, n)[1])

    idx = lax.cond(_adjacent_equal(ks, axis), exact, lambda: idx)
    return _take(x, idx, axis), idx.astype(dt)


@register("aten::sort.default")
def _sort_default(node, x):
    return _sort(node, x, stable=False)


@register("aten::sort.stable")
def _sort_stable(node, x):
    return _sort(node, x, stable=bool(node.attrs["stable"]))  # None: not stable


# --------------------------------------------------------------------------------------------
# topk


@register("aten::topk.default")
def _topk(node, x):
    _check_real("topk", x)
    k, largest, srt = node.attrs["k"], node.attrs["largest"], node.attrs["sorted"]
    vdt, idt = out_dtype(node, 0), out_dtype(node, 1)
    shape_v = out_dims(node, 0)
    xr = x.reshape(1) if x.ndim == 0 else x
    axis = norm_dim(node.attrs["dim"], x.ndim)
    n = xr.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} is out of range for a dim of size {n}")
    if k == 0 or xr.size == 0:
        return jnp.zeros(shape_v, vdt), jnp.zeros(shape_v, idt)
    key = _key(xr)
    s = ~key if largest else key  # torch's comparator is ``s(a) < s(b)``
    ks, idx, _ = _stable(s, xr, axis=axis)
    fast = lax.slice_in_dim(idx, 0, k, axis=axis)
    partial = k * 64 <= n  # std::partial_sort, else std::nth_element (+ std::sort)

    def exact():
        def fn(K, P):
            m = _Machine(_lt)
            if partial:
                K, P = m.partial_sort(K, P, k)
            else:
                K, P = m.nth_element(K, P, jnp.full((K.shape[0],), k - 1, _I32))
                if srt:
                    K, P = m.sort(K, P, k - 1)
            return P[:, :k]

        return _machine_rows(s, axis, fn)

    if n <= 3:
        # nth_element on at most 3 elements is an insertion sort: stable.
        out = fast
    elif not srt and not partial and k > 1:
        # std::nth_element's arrangement of the first k, unsorted: always the replay.
        out = exact()
    else:
        # Sorted: the result is unique unless two of the first k + 1 tie.
        out = lax.cond(_adjacent_equal(ks, axis, upto=k), exact, lambda: fast)
    return _take(xr, out, axis).reshape(shape_v), out.astype(idt).reshape(shape_v)


# --------------------------------------------------------------------------------------------
# kthvalue


def _keep(a, axis, keepdim):
    return a if keepdim else jnp.squeeze(a, axis)


@register("aten::kthvalue.default")
def _kthvalue(node, x):
    _check_real("kthvalue", x)
    k, keepdim = node.attrs["k"], node.attrs["keepdim"]
    idt = out_dtype(node, 1)
    if x.ndim == 0:
        if k != 1:
            raise ValueError(f"kthvalue: k={k} is out of range for a 0-d tensor")
        return x, jnp.zeros((), idt)
    axis = norm_dim(node.attrs["dim"], x.ndim)
    n = x.shape[axis]
    if not 1 <= k <= n:
        raise ValueError(f"kthvalue: k={k} is out of range for a dim of size {n}")
    s = _key(x)
    ks, idx, _ = _stable(s, x, axis=axis)
    fast = lax.slice_in_dim(idx, k - 1, k, axis=axis)

    def exact():
        def fn(K, P):
            return _Machine(_gt).quick_select(K, P, jnp.full((K.shape[0],), k - 1, _I32))[1][
                :, k - 1 : k
            ]

        return _machine_rows(s, axis, fn)

    if n <= 2:  # quick_select on 2 elements swaps only a strict inversion: stable
        out = fast
    else:
        kth = lax.slice_in_dim(ks, k - 1, k, axis=axis)
        tie = jnp.asarray(False)
        if k >= 2:
            tie = tie | jnp.any(lax.slice_in_dim(ks, k - 2, k - 1, axis=axis) == kth)
        if k < n:
            tie = tie | jnp.any(lax.slice_in_dim(ks, k, k + 1, axis=axis) == kth)
        out = lax.cond(tie, exact, lambda: fast)
    return _keep(_take(x, out, axis), axis, keepdim), _keep(out.astype(idt), axis, keepdim)


# --------------------------------------------------------------------------------------------
# median, nanmedian


@functools.cache
def _all_nan_index(n: int) -> int:
    """The index torch's nanmedian(dim) gives a row of n NaNs: std::nth_element(first, first,
    last) with a comparator false for every pair (introselect's partitions still swap)."""
    a = list(range(n))
    first, last, depth = 0, n, 2 * _lg(n) if n else 0
    while last - first > 3:
        if depth == 0:
            break  # heap_select on equal elements moves nothing; swap(first, nth) neither
        depth -= 1
        mid = first + (last - first) // 2
        a[first], a[mid] = a[mid], a[first]  # __move_median_to_first: all equal -> mid
        i, j = first + 1, last
        while True:
            j -= 1
            if not i < j:
                break
            a[i], a[j] = a[j], a[i]
            i += 1
        last = i  # the cut is after nth (= first), so the right part is dropped
    return a[0]


def _median_dim(ignore_nan: bool):
    def rule(node, x):
        _check_real("median", x)
        idt = out_dtype(node, 1)
        keepdim = node.attrs["keepdim"]
        if x.ndim == 0:
            return x, jnp.zeros((), idt)
        axis = norm_dim(node.attrs["dim"], x.ndim)
        n = x.shape[axis]
        if n == 0:
            raise ValueError("median: a dim of size 0 has no median")
        # torch orders (value, index) pairs totally: the index is the stable order's.
        _, idx, _ = _stable(_key(x), x, axis=axis)
        nans = (
            jnp.sum(jnp.isnan(x), axis=axis, keepdims=True).astype(_I32)
            if _is_float(x)
            else jnp.zeros_like(lax.slice_in_dim(idx, 0, 1, axis=axis))
        )
        if ignore_nan:
            m = n - nans
            pos = jnp.where(m > 0, (m - 1) // 2, _all_nan_index(n))
        else:  # the first NaN, if any (NaNs sort last, in index order)
            pos = jnp.where(nans > 0, n - nans, (n - 1) // 2)
        out = _take(idx, pos, axis)
        return _keep(_take(x, out, axis), axis, keepdim), _keep(out.astype(idt), axis, keepdim)

    return rule


register("aten::median.dim")(_median_dim(False))
register("aten::nanmedian.dim")(_median_dim(True))


def _median_all(ignore_nan: bool):
    def rule(node, x):
        _check_real("median", x)
        flat = x.reshape(1, -1)
        n = flat.shape[1]
        if n == 0:
            raise ValueError("median: an empty tensor has no median")
        s = _key(flat)
        _, _, vals = _stable(s, flat, axis=1)
        if _is_float(x):
            nans = jnp.sum(jnp.isnan(flat)).astype(_I32)
        else:
            nans = jnp.zeros((), _I32)
        nth = _cdiv2(n - nans - 1) if ignore_nan else jnp.asarray((n - 1) // 2, _I32)
        value = vals[0, nth]
        if not ignore_nan and _is_float(x):
            value = jnp.where(nans > 0, jnp.asarray(jnp.nan, x.dtype), value)
        if n > 3 and _is_float(x):
            # std::nth_element moves values: which of -0.0 and 0.0 lands on the median is its
            # doing (at most 3 elements, it is an insertion sort: stable).
            def exact():
                _, P = _Machine(_lt).nth_element(s, _iota_rows(1, n), nth.reshape(1))
                return flat[0, P[0, nth]]

            replay = _negative_zero(flat)
            if not ignore_nan:
                replay = replay & (nans == 0)
            value = lax.cond(replay, exact, lambda v=value: v)
        return value.astype(out_dtype(node))

    return rule


register("aten::median.default")(_median_all(False))
register("aten::nanmedian.default")(_median_all(True))


# --------------------------------------------------------------------------------------------
# mode


def _mode_pick(sv, sp):
    """torch's scan of the sorted (value, index) pairs: the first run of the greatest length;
    its value and the index of its last element."""
    n = sv.shape[1]
    end = jnp.concatenate([sv[:, :-1] != sv[:, 1:], jnp.ones_like(sv[:, :1], bool)], axis=1)
    pos = jnp.arange(n, dtype=_I32)
    last = lax.cummax(jnp.where(end, pos, -1), axis=1)
    prev = jnp.concatenate([jnp.full_like(last[:, :1], -1), last[:, :-1]], axis=1)
    freq = jnp.where(end, pos - prev, 0)
    w = jnp.argmax(freq, axis=1)
    r = jnp.arange(sv.shape[0])
    return sv[r, w], sp[r, w]


@register("aten::mode.default")
def _mode(node, x):
    _check_real("mode", x)
    idt = out_dtype(node, 1)
    keepdim = node.attrs["keepdim"]
    if x.ndim == 0:
        return x, jnp.zeros((), idt)
    axis = norm_dim(node.attrs["dim"], x.ndim)
    n = x.shape[axis]
    if n == 0:
        raise ValueError("mode: a dim of size 0 has no mode")
    raw = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    rows, shape = _to_rows(raw, axis)
    if rows.shape[0] == 0:
        z = jnp.zeros(out_dims(node, 0), x.dtype)
        return z, z.astype(idt)
    _, sp, sv = _stable(_key(rows), rows, axis=1)
    fast = _mode_pick(sv, sp)

    def exact():
        # torch sorts with ``a < b`` on the raw values (NaN compares false both ways).
        K, P = _Machine(_lt).sort(rows, _iota_rows(*rows.shape), n)
        return _mode_pick(K, P)

    nan = jnp.any(jnp.isnan(rows)) if _is_float(rows) else jnp.asarray(False)
    if n <= 16:
        # std::sort of at most 16 is an insertion sort: stable, unless NaNs break the order.
        value, index = lax.cond(nan, exact, lambda: fast) if _is_float(rows) else fast
    else:
        value, index = lax.cond(nan | jnp.any(_run_max(sv) > 1), exact, lambda: fast)
    value = value.astype(x.dtype).reshape((*shape[:-1], 1))
    index = index.astype(idt).reshape((*shape[:-1], 1))
    value, index = jnp.moveaxis(value, -1, axis), jnp.moveaxis(index, -1, axis)
    return _keep(value, axis, keepdim), _keep(index, axis, keepdim)


def _run_max(sv):
    """The length of each row's longest run of equal sorted values."""
    n = sv.shape[1]
    end = jnp.concatenate([sv[:, :-1] != sv[:, 1:], jnp.ones_like(sv[:, :1], bool)], axis=1)
    pos = jnp.arange(n, dtype=_I32)
    last = lax.cummax(jnp.where(end, pos, -1), axis=1)
    prev = jnp.concatenate([jnp.full_like(last[:, :1], -1), last[:, :-1]], axis=1)
    return jnp.max(jnp.where(end, pos - prev, 0), axis=1)


# --------------------------------------------------------------------------------------------
# cummax, cummin


def _cum_extreme(largest: bool):
    def rule(node, x):
        _check_real("cummax" if largest else "cummin", x)
        idt = out_dtype(node, 1)
        if x.ndim == 0:
            return x, jnp.zeros((), idt)
        axis = norm_dim(node.attrs["dim"], x.ndim)
        if x.size == 0:
            return x, jnp.zeros(x.shape, idt)
        # torch: out = x where x >= out (<= for cummin) or x is NaN: the latest index of the
        # running extreme, NaN above (below) everything.
        k = _key(x, nan_low=not largest)
        run = lax.cummax(k, axis=axis) if largest else lax.cummin(k, axis=axis)
        iota = lax.broadcasted_iota(jnp.int64, x.shape, axis)
        idx = lax.cummax(jnp.where(k == run, iota, -1), axis=axis)
        return _take(x, idx, axis), idx.astype(idt)

    return rule


register("aten::cummax.default")(_cum_extreme(True))
register("aten::cummin.default")(_cum_extreme(False))


# --------------------------------------------------------------------------------------------
# cumprod, logcumsumexp


def _acc(dt):
    """torch CPU's accumulation type for cumulative ops (at::acc_type<T, false>): double for
    float, float for half and bfloat16."""
    if dt == jnp.float32:
        return jnp.float64
    if dt in (jnp.float16, jnp.bfloat16):
        return jnp.float32
    if dt == jnp.complex64:
        return jnp.complex128
    return dt


@register("aten::cumprod.default")
def _cumprod(node, x):
    dt = out_dtype(node)
    x = x.astype(dt)
    if x.ndim == 0:
        return x
    return jnp.cumprod(x.astype(_acc(dt)), axis=norm_dim(node.attrs["dim"], x.ndim)).astype(dt)


@register("aten::logcumsumexp.default")
def _logcumsumexp(node, x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise ValueError("logcumsumexp: complex input is not supported on the lazy device")
    dt = out_dtype(node)
    x = x.astype(dt)
    if x.ndim == 0 or x.size == 0:
        return x
    axis = norm_dim(node.attrs["dim"], x.ndim)
    return lax.cumlogsumexp(x.astype(_acc(dt)), axis=axis).astype(dt)


# --------------------------------------------------------------------------------------------
# searchsorted, bucketize: torch's binary search, step by step (its path decides where a NaN
# or an unsorted sequence sends a value, so the steps are replayed, not just the contract).


def _torch_dtype(dtype):
    import torch

    from ir_runtime._dtypes import name_of

    return getattr(torch, name_of(dtype))


def _compare_dtype(boundaries, value):
    """The dtype torch compares in: the result type of the boundaries and the value (a
    tensor, or a Python number for the Scalar overloads)."""
    import torch

    from ir_runtime._dtypes import to_numpy_dtype
    from ir_runtime._frontend._record import ir_dtype

    b = torch.empty(
        (1,) * max(boundaries.ndim, 1), dtype=_torch_dtype(boundaries.dtype), device="meta"
    )
    if not isinstance(value, (bool, int, float)):
        value = torch.empty(value.shape, dtype=_torch_dtype(value.dtype), device="meta")
    return to_numpy_dtype(ir_dtype(torch.result_type(b, value)))


def _binary_search(boundaries, values, right: bool, sorter=None):
    """torch's ``cus_lower_bound``/``cus_upper_bound``: ``boundaries`` (..., n), 1-D or with
    the leading dims of ``values`` (..., m); int64 positions shaped like ``values``."""
    n = boundaries.shape[-1]
    start = jnp.zeros(values.shape, jnp.int64)
    end = jnp.full(values.shape, n, jnp.int64)
    if n == 0:
        return start
    nd = boundaries.ndim > 1

    def value_at(mid):
        pos = mid
        if sorter is not None:
            pos = (_take(sorter, mid, -1) if nd else sorter[mid]).astype(jnp.int64)
        return _take(boundaries, pos, -1) if nd else boundaries[pos]

    for _ in range(n.bit_length()):
        active = start < end
        mid = start + ((end - start) >> 1)
        mv = value_at(jnp.where(active, mid, 0))
        below = ~(mv > values) if right else ~(mv >= values)
        start = jnp.where(active & below, mid + 1, start)
        end = jnp.where(active & ~below, mid, end)
    return start


def _searchsorted(node, seq, values, sorter, scalar):
    right = node.attrs["right"]
    side = node.attrs["side"]
    if side is not None:
        if side not in ("left", "right"):
            raise ValueError(f"searchsorted: side={side!r} (expected 'left' or 'right')")
        if right and side == "left":
            raise ValueError("searchsorted: side='left' and right=True contradict each other")
        right = side == "right"
    dt = _compare_dtype(seq, scalar if scalar is not None else values)
    if scalar is not None:
        values = jnp.asarray(values, dt)
    out = _binary_search(seq.astype(dt), values.astype(dt), right, sorter)
    return out.astype(out_dtype(node))


@register("aten::searchsorted.Tensor")
def _searchsorted_tensor(node, seq, values, sorter):
    return _searchsorted(node, seq, values, sorter, None)


@register("aten::searchsorted.Scalar")
def _searchsorted_scalar(node, seq, sorter):
    v = node.attrs["self"]
    return _searchsorted(node, seq, v, sorter, v if isinstance(v, (bool, int, float)) else 0.5)


def _bucketize(node, values, boundaries, scalar):
    if boundaries.ndim != 1:
        raise ValueError(f"bucketize: boundaries must be 1-D (got {boundaries.ndim}-D)")
    dt = _compare_dtype(boundaries, scalar if scalar is not None else values)
    out = _binary_search(boundaries.astype(dt), jnp.asarray(values).astype(dt), node.attrs["right"])
    return out.astype(out_dtype(node))


@register("aten::bucketize.Tensor")
def _bucketize_tensor(node, values, boundaries):
    return _bucketize(node, values, boundaries, None)


@register("aten::bucketize.Scalar")
def _bucketize_scalar(node, boundaries):
    v = node.attrs["self"]
    return _bucketize(node, v, boundaries, v if isinstance(v, (bool, int, float)) else 0.5)


# --------------------------------------------------------------------------------------------
# Histograms: histc, histogram, histogramdd (torch's histogramdd_cpu_contiguous)

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


def _div(a, b):
    """``a / b`` as IEEE division: XLA turns a division by a constant into a multiplication by
    its (rounded) reciprocal, which torch does not; the barrier keeps ``b`` opaque."""
    return a / lax.optimization_barrier(b)


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
        step = r(_div(r(end - start), r(jnp.asarray(steps - 1, cd))))
        up = r(start + r(step * r(i.astype(cd))))
        down = r(end - r(step * r((steps - 1 - i).astype(cd))))
        return jnp.where(i < half, up, down).astype(dt)
    start, end = lo.astype(dt), hi.astype(dt)
    step = _div(end - start, jnp.asarray(steps - 1, dt))
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
            q = r(_div(r(r(ec - lc) * jnp.asarray(nb, cd)), r(rc - lc)))
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
        hist = _div(hist, jnp.sum(hist))
        for d, e in enumerate(edges):
            shape = [1] * len(edges)
            shape[d] = sizes[d]
            hist = _div(hist, (e[1:] - e[:-1]).reshape(shape))
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
    if not _is_float(x):
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


# --------------------------------------------------------------------------------------------
# segment_reduce and its backward (torch's _segment_reduce_cpu_kernel2, by lengths or offsets)

_SEGMENT_REDUCTIONS = ("max", "mean", "min", "sum", "prod")


def _segments(op, data, lengths, offsets, axis: int):
    """Per position along ``axis``: its segment (``seg``, (B, L)) and whether it is in one;
    the segments' lengths (B, S); the data as (B, L, I)."""
    if (lengths is None) == (offsets is None):
        raise ValueError(f"{op}: give exactly one of lengths and offsets")
    ref = lengths if lengths is not None else offsets
    axis = norm_dim(axis, data.ndim)
    if ref.ndim - 1 != axis:
        raise ValueError(
            f"{op}: axis={axis} but lengths/offsets have {ref.ndim} dims (torch reduces along "
            f"their last dim, dim {ref.ndim - 1})"
        )
    lead = data.shape[:axis]
    b = math.prod(lead)
    size = data.shape[axis]
    d3 = data.reshape(b, size, -1)
    ref = ref.astype(jnp.int64).reshape(b, ref.shape[-1])
    if lengths is not None:
        lens = ref
        starts = jnp.cumsum(lens, axis=1) - lens
    else:
        starts = ref[:, :-1]
        lens = ref[:, 1:] - starts
    ends = starts + lens
    s = lens.shape[1]
    pos = jnp.arange(size, dtype=jnp.int64)
    seg = jax.vmap(lambda e: jnp.searchsorted(e, pos, side="right"))(ends)
    seg_c = jnp.clip(seg, 0, max(s - 1, 0))
    inside = (seg < s) & (pos[None, :] >= jnp.take_along_axis(starts, seg_c, axis=1))
    return seg_c, inside, lens, d3, lead


def _by_segment(values, seg, inside, s: int, combine: str, start=None):
    """Reduce ``values`` (B, L, I) into (B, S, I) by segment, each from ``start`` (a scalar;
    the combination's identity by default), its elements added (multiplied...) in order."""
    b, size, inner = values.shape
    gid = jnp.where(inside, jnp.arange(b)[:, None] * s + seg, b * s).reshape(-1)
    flat = values.reshape(b * size, inner)
    dt = values.dtype
    if start is None:
        if combine in ("sum", "prod"):
            start = 0 if combine == "sum" else 1
        elif jnp.issubdtype(dt, jnp.floating):
            start = -jnp.inf if combine == "max" else jnp.inf
        else:
            start = jnp.iinfo(dt).min if combine == "max" else jnp.iinfo(dt).max
    base = jnp.full((b * s + 1, inner), jnp.asarray(start, dt))
    at = base.at[gid]
    out = {"sum": at.add, "max": at.max, "min": at.min, "prod": at.multiply}[combine](flat)
    return out[: b * s].reshape(b, s, inner)


def _reduce_name(op, reduce):
    if reduce not in _SEGMENT_REDUCTIONS:
        raise ValueError(f"{op}: reduce={reduce!r} (expected one of {_SEGMENT_REDUCTIONS})")
    return reduce


@register("aten::segment_reduce.default")
def _segment_reduce(node, data, lengths, indices, offsets):
    op = "segment_reduce"
    if indices is not None:
        raise ValueError(f"{op}: indices are not supported (torch reduces by lengths or offsets)")
    if not _is_float(data):
        raise ValueError(f"{op}: data must be floating point, got {data.dtype}")
    reduce = _reduce_name(op, node.attrs["reduce"])
    initial = node.attrs["initial"]
    seg, inside, lens, d3, lead = _segments(op, data, lengths, offsets, node.attrs["axis"])
    s = lens.shape[1]
    dt = data.dtype
    lens3 = lens[:, :, None]
    if reduce in ("sum", "mean"):
        out = _by_segment(d3, seg, inside, s, "sum", initial)
        if reduce == "mean":  # an empty segment: NaN, or the initial value as it is
            empty = jnp.asarray(jnp.nan, dt) if initial is None else out
            out = jnp.where(lens3 > 0, _div(out, lens3.astype(dt)), empty)
    elif reduce == "prod":
        out = _by_segment(d3, seg, inside, s, "prod", initial)
    else:
        out = _segment_extreme(d3, seg, inside, s, reduce == "max", initial)
    shape = (*lead, s, *data.shape[len(lead) + 1 :])
    return out.reshape(shape).astype(out_dtype(node))


def _segment_extreme(d3, seg, inside, s: int, largest: bool, initial):
    """torch's fold ``v = isnan(d) ? d : std::max(v, d)`` (std::min) from the initial value:
    NaN if any; else the first of (initial, data...) to reach the extreme (ties keep the
    earlier: that is which of -0.0 and 0.0 comes out)."""
    size = d3.shape[1]
    dt = d3.dtype
    k = _key(d3, nan_low=not largest)
    best = _by_segment(k, seg, inside, s, "max" if largest else "min")
    at = jnp.broadcast_to(seg[:, :, None], d3.shape)
    hit = inside[:, :, None] & (k == jnp.take_along_axis(best, at, axis=1))
    pos = jnp.broadcast_to(jnp.arange(size)[None, :, None], d3.shape)
    first = _by_segment(jnp.where(hit, pos, size), seg, inside, s, "min")
    value = jnp.take_along_axis(d3, jnp.clip(first, 0, max(size - 1, 0)), axis=1)
    ident = jnp.asarray(-jnp.inf if largest else jnp.inf, dt)
    value = jnp.where(first < size, value, ident)
    init = ident if initial is None else jnp.asarray(initial, dt)
    keep_init = ~(init < value) if largest else ~(value < init)
    return jnp.where(jnp.isnan(value), value, jnp.where(jnp.isnan(init) | keep_init, init, value))


def _segmented_scan_prod(v, start):
    """Inclusive products along axis 1 of ``v`` (B, L, I), restarting where ``start`` (B, L)."""

    def combine(a, b):
        (va, fa), (vb, fb) = a, b
        return jnp.where(fb[..., None], vb, va * vb), fa | fb

    return lax.associative_scan(combine, (v, start), axis=1)[0]


@register("aten::_segment_reduce_backward.default")
def _segment_reduce_backward(node, grad, output, data, lengths, offsets):
    op = "segment_reduce backward"
    reduce = _reduce_name(op, node.attrs["reduce"])
    initial = node.attrs["initial"]
    seg, inside, lens, d3, _ = _segments(op, data, lengths, offsets, node.attrs["axis"])
    b, size, inner = d3.shape
    s = lens.shape[1]
    dt = d3.dtype
    g3 = grad.reshape(b, s, inner)
    o3 = output.reshape(b, s, inner)
    at = seg[:, :, None]
    gp = jnp.take_along_axis(g3, jnp.broadcast_to(at, (b, size, inner)), axis=1)
    op_ = jnp.take_along_axis(o3, jnp.broadcast_to(at, (b, size, inner)), axis=1)
    lp = jnp.take_along_axis(lens, seg, axis=1)[:, :, None]
    ins = inside[:, :, None]
    if reduce in ("max", "min"):
        hit = ins & (jnp.isnan(d3) | (d3 == op_))
        count = _by_segment(hit.astype(jnp.int64), seg, inside, s, "sum")
        cp = jnp.take_along_axis(count, jnp.broadcast_to(at, (b, size, inner)), axis=1)
        gi = jnp.where(hit, gp, 0)
        # torch divides by the count only the gradients above 0 (so does this).
        gi = jnp.where((cp >= 2) & (gi > 0), _div(gi, cp.astype(dt)), gi)
    elif reduce == "mean":
        gi = jnp.where(ins, _div(gp, lp.astype(dt)), 0)
    elif reduce == "sum":
        gi = jnp.where(ins, gp, 0)
    else:  # prod
        special = jnp.isnan(d3) | (d3 == 0)
        plain = _div(gp * op_, d3)
        pos = jnp.arange(size)
        starts = jnp.take_along_axis(jnp.cumsum(lens, axis=1) - lens, seg, axis=1)
        if offsets is not None:
            o = offsets.astype(jnp.int64).reshape(b, -1)
            starts = jnp.take_along_axis(o[:, :-1], seg, axis=1)
        last_pos = starts + jnp.take_along_axis(lens, seg, axis=1) - 1
        first = ~inside | (pos[None, :] == starts)
        last = ~inside | (pos[None, :] == last_pos)
        v = jnp.where(ins, d3, jnp.ones_like(d3))
        incl = _segmented_scan_prod(v, first)
        before = jnp.where(first[:, :, None], 1, jnp.roll(incl, 1, axis=1))
        rincl = _segmented_scan_prod(v[:, ::-1], last[:, ::-1])[:, ::-1]
        after = jnp.where(last[:, :, None], 1, jnp.roll(rincl, -1, axis=1))
        init = jnp.asarray(1 if initial is None else initial, dt)
        excl = init * before * after
        gi = jnp.where(ins, jnp.where(special, gp * excl, plain), 0)
    gi = jnp.where(lp > 0, gi, 0)
    return gi.reshape(data.shape).astype(out_dtype(node))
