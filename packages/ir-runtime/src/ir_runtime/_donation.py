"""Donation: which parameters of a program give their buffers to its results.

XLA writes a result into a donated parameter's buffer, as torch_xla aliases a parameter to its
update, so a training step needs one copy of its weights and optimizer state, not two. A
buffer may be donated only when nothing can read it once the program has run; this module owns
that whole policy, in three parts:

- Who may still read a buffer, counted with ``sys.getrefcount`` (``refs``): a live tensor, a
  detached copy, a pending op, an array handed out. Each count below subtracts exactly the
  references its own frame holds, every one named. How ``getrefcount`` counts is calibrated on
  the running interpreter when this module is imported (``CALIBRATION``): CPython 3.14's
  borrowed loads and free-threaded builds count differently. If the counts cannot be trusted,
  donation is switched off with one ``DonationWarning`` that says so, never silently: a count
  that is off could donate a buffer something still reads (a wrong value), or never donate
  (twice the memory). A compiled step's replay applies ``sole``'s rule in C (``_hot.sole``),
  where a count is exact and needs no calibration.
- The front end's rule for a step (``Donor``): the step rebinds every tensor it computes, so
  their old data is donated unless something else still reads it (``private``; ``held``; the
  compiled step's ``sole``).
- Pairing (``indices``): a donated parameter must be taken over by a result of its shape,
  dtype and placement, the result that replaces it first; jax pairs them in the order the
  program returns its results (``_output_order``).

``IR_RUNTIME_DONATE=0`` turns donation off (torch_xla's ``XLA_ENABLE_PARAM_ALIASING=0``), to
compare or to rule it out.
"""

from __future__ import annotations

import os
import sys
import warnings
from sys import getrefcount

import jax
import numpy as np

from ir_core import DeviceData
from ir_runtime._collectives import references
from ir_runtime._errors import LoweringError
from ir_runtime._placement import spec_at
from ir_sharding import ShardingKind


class DonationWarning(RuntimeWarning):
    """Donation was switched off: reference counts cannot be trusted on this interpreter."""


# -- counting references -------------------------------------------------------------------

_OWN = [0]  # references getrefcount sees inside ``refs`` that are refs' own (calibrated)


def refs(x) -> int:
    """References to ``x``, counting the caller's own locals, not this call's."""
    return getrefcount(x) - _OWN[0]


class Calibration:
    """How ``getrefcount`` counts on this interpreter, measured on objects whose holders are
    known, through functions shaped like ``refs``: ``own`` is what refs must subtract;
    ``trusted`` when every probe counts exactly, else ``reason`` says what was off."""

    def __init__(self, getrefcount=getrefcount, gil=None):
        self.own, self.reason = None, None
        if gil is None:
            gil = getattr(sys, "_is_gil_enabled", lambda: True)()
        if not gil:
            self.reason = (
                "this is a free-threaded interpreter without the GIL, whose reference counts "
                "are deferred and per thread"
            )
            return

        def raw(x):
            return getrefcount(x)

        own = _probe(1, raw) - 2  # the probe's holders: its list, and its local

        def counted(x):
            return getrefcount(x) - own

        # Every probe again, after the interpreter has had the chance to specialize the calls.
        for _ in range(64):
            seen = (_probe(1, counted), _probe(2, counted), _probe(3, counted))
            if seen != (2, 3, 4):
                self.reason = f"sys.getrefcount counted {seen} references where 2, 3 and 4 are held"
                return
        self.own = own

    @property
    def trusted(self) -> bool:
        return self.reason is None

    def __repr__(self):
        state = "trusted" if self.trusted else f"untrusted: {self.reason}"
        return f"Calibration(own={self.own}, {state})"


def _probe(n: int, count) -> int:
    """``count`` of an object that a list holds ``n`` times and a local once."""
    holder = [object()] * n
    x = holder[0]  # what every count below does: count a local
    return count(x)


def _untraced(measure):
    """``measure()`` with no trace or profile function set: on CPython before 3.13 a tracer
    that reads a frame's ``f_locals`` keeps a snapshot of the locals, which would count as
    holders in the probe and make every later count too low (a buffer still read, donated).
    A tracer set later can only make counts too high, which never donates what is read."""
    trace, profile = sys.gettrace(), sys.getprofile()
    sys.settrace(None)
    sys.setprofile(None)
    try:
        return measure()
    finally:
        sys.settrace(trace)
        sys.setprofile(profile)


CALIBRATION = _untraced(Calibration)
if CALIBRATION.trusted:
    _OWN[0] = CALIBRATION.own
    _seen = _untraced(lambda: _probe(1, refs))  # refs itself, as the counts below use it
    if _seen != 2:
        CALIBRATION.reason = f"refs counted {_seen} references where 2 are held"
ENABLED = [os.environ.get("IR_RUNTIME_DONATE", "1") != "0" and CALIBRATION.trusted]
if not CALIBRATION.trusted:
    warnings.warn(
        f"ir_runtime donates no buffers on this interpreter: {CALIBRATION.reason}. Steps keep "
        f"two copies of what they update (IR_RUNTIME_DONATE=0 says this by choice).",
        DonationWarning,
        stacklevel=2,
    )


def private(p: DeviceData) -> bool:
    """Whether only the node ``p`` holds its array (besides the runtime's own note of the last
    program's result, ``_collectives.references``): no one could read it once donated."""
    h = p.handle
    return refs(h) - 2 == references(h)  # the node's handle; the local h


def sole(t, extra: int) -> bool:
    """Whether the lazy tensor ``t`` alone holds its data, so a program may take its buffer
    over: nothing else references its value, that value's node or the node's array (a
    detached copy, a view, a pending op reading it, an array handed out). ``extra``:
    references to the node that the caller holds itself."""
    v = t._ir
    if refs(v) != 2:  # the tensor's slot; the local v
        return False
    n = v.node
    # the value's node slot, the local n, and the caller's
    return type(n) is DeviceData and refs(n) == 2 + extra and private(n)


def held(tensors: list, known) -> set:
    """Ids of the data nodes that ``tensors`` (a list made for this call: ``live()``) hold
    and that something else holds too: anything but the list, and ``known(id(t))`` references
    the caller knows of (an entry's own notes of ``t``). A count that is off, high or low,
    keeps the data: never donates what someone holds."""
    out = set()
    for t in tensors:
        n = t._ir.node
        if type(n) is not DeviceData:
            continue
        if refs(t) - 2 != known(id(t)):  # the list; the loop's t
            out.add(id(n))
    return out


class Donor:
    """Which parameters of a step's graph give their buffers to its results: those whose data
    nothing can read once the step has run. The step rebinds every tensor it computes, so its
    old data is left to whatever else holds it: a live tensor still holding that data (a
    detached copy, a tensor the step only reads, a batch), a live pending tensor the step does
    not compute whose graph reads it (``held``, by node), or anyone holding the array itself
    (``private``). Host data is placed afresh each step, so its device copy is the program's
    own, except a scalar's: placed once and reused (``_execute.place``). A callable for
    ``run_graph``'s ``donate``; only what a result can take over is donated (``indices``)."""

    __slots__ = ("held", "only", "replaces")

    def __init__(self, held: set, only=None, replaces=None):
        self.held = held  # ids of the DeviceData nodes something still reads
        self.only = only  # None, or the ids of the nodes that may be donated at all
        # id of the data a tensor held -> the root of its new value: which result is to take
        # over which buffer (a wrong pair costs XLA a copy)
        self.replaces = replaces or {}

    def __call__(self, p: DeviceData) -> bool:
        pid = id(p)
        if pid in self.held or (self.only is not None and pid not in self.only):
            return False
        if isinstance(p.handle, jax.Array):
            return private(p)
        return isinstance(p.handle, np.ndarray) and p.handle.ndim > 0


# -- pairing parameters with results ------------------------------------------------------


def indices(g, donate) -> tuple:
    """The donated parameters' indices, and the order of the results (None: the roots')."""
    if callable(donate):
        candidates = [k for k, p in enumerate(g.params) if donate(p)]
        pairs = _aliasable(g, candidates, getattr(donate, "replaces", {}))
        return tuple(k for k, _ in pairs), _output_order(pairs, len(g.roots))
    donate = list(donate)
    if not donate:
        return (), None
    position = {id(p): k for k, p in enumerate(g.params)}
    out = []
    for d in donate:
        if id(d) not in position:
            raise LoweringError(f"cannot donate {d!r}: it is not a parameter of this graph")
        out.append(position[id(d)])
    return tuple(sorted(set(out))), None


def _aliasable(g, candidates: list, replaces: dict) -> tuple:
    """``(parameter index, root index)`` for each of the ``candidates`` (parameter indices)
    whose buffer a result can take over: one of the same shape, dtype and sharding (or one
    whose sharding XLA chooses). The result that replaces it (``replaces``: id of a
    parameter -> root index, what the caller knows) first; else any such result left. A
    parameter no result can take is left out: donating it would free nothing, and jax would
    warn that it was not usable."""
    if not candidates:
        return ()
    # Compared as specs, not as jax shardings: those need the graph's Program, a walk of every
    # node, which a cache hit never pays for otherwise. Replicated data and a parameter with no
    # spec (replicated over the program's devices) are one placement, as jax sees them.
    ins = {k: _placement(spec_at(g.params[k].sharding, 0)) for k in candidates}
    # per root: where its result must land (None: XLA chooses)
    outs = [None if s is None else _placement(s) for s in g.out_specs]
    roots = g.roots

    def fits(k, r) -> bool:
        p, root = g.params[k], roots[r]
        return (
            p.shape.dims == root.shape.dims
            and p.shape.dtype == root.shape.dtype
            and (outs[r] is None or outs[r] == ins[k])
        )

    pairs, taken, left = [], set(), []
    for k in candidates:
        r = replaces.get(id(g.params[k]))
        if r is not None and r not in taken and fits(k, r):
            pairs.append((k, r))
            taken.add(r)
        else:
            left.append(k)
    free: dict = {}  # (dims, dtype) -> the roots of that shape not yet paired
    for r, root in enumerate(roots):
        if r not in taken:
            free.setdefault((root.shape.dims, root.shape.dtype), []).append(r)
    for exact in (True, False):  # results of the parameter's own sharding first
        rest = []
        for k in left:
            p = g.params[k]
            pool = free.get((p.shape.dims, p.shape.dtype), ())
            for i, r in enumerate(pool):
                if fits(k, r) and (outs[r] is not None) is exact:
                    pairs.append((k, pool.pop(i)))
                    break
            else:
                rest.append(k)
        left = rest
    return tuple(sorted(pairs))


_REPLICATED = object()  # the placement of replicated data, whatever spec says it


def _placement(spec):
    """A spec as ``_aliasable`` compares it: replicated (or no spec) as one value."""
    if spec is None or spec.kind is ShardingKind.REPLICATED:
        return _REPLICATED
    return spec


def _output_order(pairs: tuple, n: int):
    """The order the program returns its ``n`` results in, so that jax's pairing (each result
    takes the first donated parameter of its shape left) gives each result the parameter
    ``pairs`` gives it: the paired results first, by parameter, then the others. None when
    that is the roots' own order."""
    first = [r for _, r in pairs]  # (pairs are sorted by parameter)
    paired = set(first)
    order = tuple(first + [r for r in range(n) if r not in paired])
    return None if order == tuple(range(n)) else order
