"""sort, topk, kthvalue, median, nanmedian and mode: one stable ``lax.sort`` where the result
is unique, the machine's replay of torch's algorithm where ties make it depend on that
algorithm.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from ir_runtime._lowering._registry import NATIVE, family, norm_dim, out_dims, out_dtype
from ir_runtime._lowering.sorting._common import (
    I32,
    _key,
    _stable,
    check_real,
    from_rows,
    is_float,
    lg,
    negative_zero,
    take,
    to_rows,
)
from ir_runtime._lowering.sorting._machine import Machine, _gt, cdiv2, iota_rows, lt

# Half precision: NATIVE (``_registry``): this family sorts and selects: nothing to compute in
# float32.
register = family(NATIVE)

# --------------------------------------------------------------------------------------------
# sort, argsort (torch decomposes it to sort.stable), msort


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
    rows, shape = to_rows(s, axis)
    p = fn(rows, iota_rows(*rows.shape))
    return from_rows(p, (*shape[:-1], p.shape[-1]), axis)


def _sort(node, x, stable: bool):
    check_real("sort", x)
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
        return _machine_rows(s, axis, lambda K, P: Machine(lt).sort(K, P, n)[1])

    idx = lax.cond(_adjacent_equal(ks, axis), exact, lambda: idx)
    return take(x, idx, axis), idx.astype(dt)


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
    check_real("topk", x)
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
            m = Machine(lt)
            if partial:
                K, P = m.partial_sort(K, P, k)
            else:
                K, P = m.nth_element(K, P, jnp.full((K.shape[0],), k - 1, I32))
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
    return take(xr, out, axis).reshape(shape_v), out.astype(idt).reshape(shape_v)


# --------------------------------------------------------------------------------------------
# kthvalue


def _keep(a, axis, keepdim):
    return a if keepdim else jnp.squeeze(a, axis)


@register("aten::kthvalue.default")
def _kthvalue(node, x):
    check_real("kthvalue", x)
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
            return Machine(_gt).quick_select(K, P, jnp.full((K.shape[0],), k - 1, I32))[1][
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
    return _keep(take(x, out, axis), axis, keepdim), _keep(out.astype(idt), axis, keepdim)


# --------------------------------------------------------------------------------------------
# median, nanmedian


@functools.cache
def _all_nan_index(n: int) -> int:
    """The index torch's nanmedian(dim) gives a row of n NaNs: std::nth_element(first, first,
    last) with a comparator false for every pair (introselect's partitions still swap)."""
    a = list(range(n))
    first, last, depth = 0, n, 2 * lg(n) if n else 0
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


def _along_dim(what: str):
    """The rule of a reduction along ``dim`` returning (values, indices), median's and mode's:
    a real input; a 0-d one is its own result (index 0); a dim of size 0 has no ``what``.
    Otherwise ``rule(node, x, axis, n, idt, keepdim)``, ``n`` the size of dim ``axis`` and
    ``idt`` the index dtype."""

    def wrap(rule):
        @functools.wraps(rule)  # the rule's name, for the registry's messages
        def checked(node, x):
            check_real(what, x)
            idt = out_dtype(node, 1)
            keepdim = node.attrs["keepdim"]
            if x.ndim == 0:
                return x, jnp.zeros((), idt)
            axis = norm_dim(node.attrs["dim"], x.ndim)
            n = x.shape[axis]
            if n == 0:
                raise ValueError(f"{what}: a dim of size 0 has no {what}")
            return rule(node, x, axis, n, idt, keepdim)

        return checked

    return wrap


def _median_dim(ignore_nan: bool):
    @_along_dim("median")
    def rule(node, x, axis, n, idt, keepdim):
        # torch orders (value, index) pairs totally: the index is the stable order's.
        _, idx, _ = _stable(_key(x), x, axis=axis)
        nans = (
            jnp.sum(jnp.isnan(x), axis=axis, keepdims=True).astype(I32)
            if is_float(x)
            else jnp.zeros_like(lax.slice_in_dim(idx, 0, 1, axis=axis))
        )
        if ignore_nan:
            m = n - nans
            pos = jnp.where(m > 0, (m - 1) // 2, _all_nan_index(n))
        else:  # the first NaN, if any (NaNs sort last, in index order)
            pos = jnp.where(nans > 0, n - nans, (n - 1) // 2)
        out = take(idx, pos, axis)
        return _keep(take(x, out, axis), axis, keepdim), _keep(out.astype(idt), axis, keepdim)

    return rule


register("aten::median.dim")(_median_dim(False))
register("aten::nanmedian.dim")(_median_dim(True))


def _median_all(ignore_nan: bool):
    def rule(node, x):
        check_real("median", x)
        flat = x.reshape(1, -1)
        n = flat.shape[1]
        if n == 0:
            raise ValueError("median: an empty tensor has no median")
        s = _key(flat)
        _, _, vals = _stable(s, flat, axis=1)
        if is_float(x):
            nans = jnp.sum(jnp.isnan(flat)).astype(I32)
        else:
            nans = jnp.zeros((), I32)
        nth = cdiv2(n - nans - 1) if ignore_nan else jnp.asarray((n - 1) // 2, I32)
        value = vals[0, nth]
        if not ignore_nan and is_float(x):
            value = jnp.where(nans > 0, jnp.asarray(jnp.nan, x.dtype), value)
        if n > 3 and is_float(x):
            # std::nth_element moves values: which of -0.0 and 0.0 lands on the median is its
            # doing (at most 3 elements, it is an insertion sort: stable).
            def exact():
                _, P = Machine(lt).nth_element(s, iota_rows(1, n), nth.reshape(1))
                return flat[0, P[0, nth]]

            replay = negative_zero(flat)
            if not ignore_nan:
                replay = replay & (nans == 0)
            value = lax.cond(replay, exact, lambda v=value: v)
        return value.astype(out_dtype(node))

    return rule


register("aten::median.default")(_median_all(False))
register("aten::nanmedian.default")(_median_all(True))


# --------------------------------------------------------------------------------------------
# mode


def _run_lengths(sv):
    """Along each row of sorted values: at the last element of each run of equal values, the
    run's length; 0 elsewhere."""
    n = sv.shape[1]
    end = jnp.concatenate([sv[:, :-1] != sv[:, 1:], jnp.ones_like(sv[:, :1], bool)], axis=1)
    pos = jnp.arange(n, dtype=I32)
    last = lax.cummax(jnp.where(end, pos, -1), axis=1)
    prev = jnp.concatenate([jnp.full_like(last[:, :1], -1), last[:, :-1]], axis=1)
    return jnp.where(end, pos - prev, 0)


def _mode_pick(sv, sp):
    """torch's scan of the sorted (value, index) pairs: the first run of the greatest length;
    its value and the index of its last element."""
    w = jnp.argmax(_run_lengths(sv), axis=1)
    r = jnp.arange(sv.shape[0])
    return sv[r, w], sp[r, w]


@register("aten::mode.default")
@_along_dim("mode")
def _mode(node, x, axis, n, idt, keepdim):
    raw = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    rows, shape = to_rows(raw, axis)
    if rows.shape[0] == 0:
        z = jnp.zeros(out_dims(node, 0), x.dtype)
        return z, z.astype(idt)
    _, sp, sv = _stable(_key(rows), rows, axis=1)
    fast = _mode_pick(sv, sp)

    def exact():
        # torch sorts with ``a < b`` on the raw values (NaN compares false both ways).
        K, P = Machine(lt).sort(rows, iota_rows(*rows.shape), n)
        return _mode_pick(K, P)

    nan = jnp.any(jnp.isnan(rows)) if is_float(rows) else jnp.asarray(False)
    if n <= 16:
        # std::sort of at most 16 is an insertion sort: stable, unless NaNs break the order.
        value, index = lax.cond(nan, exact, lambda: fast) if is_float(rows) else fast
    else:
        value, index = lax.cond(nan | jnp.any(_run_max(sv) > 1), exact, lambda: fast)
    value = value.astype(x.dtype).reshape((*shape[:-1], 1))
    index = index.astype(idt).reshape((*shape[:-1], 1))
    value, index = jnp.moveaxis(value, -1, axis), jnp.moveaxis(index, -1, axis)
    return _keep(value, axis, keepdim), _keep(index, axis, keepdim)


def _run_max(sv):
    """The length of each row's longest run of equal sorted values."""
    return jnp.max(_run_lengths(sv), axis=1)
