"""The machine: libstdc++'s (and torch's) selection algorithms -- introsort, introselect and the
heap routines -- on every row at once.

State: K (rows, n) keys compared by ``comp``, P (rows, n) the int32 positions they came
from; every scalar of the C++ code is a (rows,) vector. Each loop runs while any row needs
it; ``run`` says which rows do, and every write and update is masked by it, so a row's
values are those of the C++ code run on that row alone.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ir_runtime._lowering.sorting._common import I32, lg

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


def cdiv2(a):
    """C++'s ``a / 2`` on integers (towards zero)."""
    return lax.div(a, jnp.asarray(2, a.dtype))


def _loop(cond, body, init):
    """while any row's ``cond``: ``body(state, run)`` with ``run`` the rows that loop."""
    return lax.while_loop(lambda s: jnp.any(cond(s)), lambda s: body(s, cond(s)), init)


class Machine:
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

        K, P, hole, second = _loop(lambda s: on & (s[3] < cdiv2(ln - 1)), body, (K, P, hole, hole))
        tail = on & ((ln & 1) == 0) & (second == cdiv2(ln - 2))
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

        init = (K, P, jnp.where(heap0, 0, 1).astype(I32), jnp.where(heap0, cdiv2(ln - 2), middle))
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
        zero = jnp.zeros((rows,), I32)
        if m <= 1:
            return K, P
        if m > 16:
            depth = 2 * lg(m)
            size = depth + 3
            stack = jnp.zeros((rows, size, 3), I32).at[:, 0].set(jnp.asarray([0, m, depth], I32))
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
                    sp = sp + part.astype(I32)
                return K, P, stack, sp

            K, P, _, _ = _loop(lambda s: s[3] > 0, body, (K, P, stack, zero + 1))
        return self.insertion_sort(K, P, zero, zero + m, jnp.ones((rows,), bool), final=True)

    def nth_element(self, K, P, nth):
        """``std::nth_element(first, first + nth, last)``."""
        rows, n = K.shape
        if n == 0:
            return K, P
        zero = jnp.zeros((rows,), I32)

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

        init = (K, P, zero, zero + n, zero + 2 * lg(n), jnp.zeros((rows,), bool))
        K, P, f, e, _, done = _loop(lambda s: ~s[5] & (s[3] - s[2] > 3), body, init)
        return self.insertion_sort(K, P, f, e, ~done)

    def partial_sort(self, K, P, k: int):
        """``std::partial_sort(first, first + k, last)``."""
        rows, n = K.shape
        zero = jnp.zeros((rows,), I32)
        on = jnp.ones((rows,), bool)
        return self.heap(K, P, zero, zero + k, zero + n, on, sort=True)

    def quick_select(self, K, P, k):
        """torch's ``quick_select_template`` (kthvalue): ``comp`` is its ``gt_or_nan``."""
        gt, n = self.comp, K.shape[1]
        rows = K.shape[0]
        zero = jnp.zeros((rows,), I32)

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


def lt(a, b):
    return a < b


def _gt(a, b):
    return a > b


def iota_rows(rows: int, n: int):
    return jnp.broadcast_to(jnp.arange(n, dtype=I32), (rows, n))
