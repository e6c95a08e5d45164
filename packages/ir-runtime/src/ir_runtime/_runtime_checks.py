"""Checked programs: index bounds and integer divisors checked on the device.

XLA cannot raise inside a program: a gather clamps an out-of-range index (``jnp.take`` fills, a
scatter drops the update) and an integer quotient by zero is undefined, where eager torch
raises. A checked program (``IR_RUNTIME_PROGRAM_CHECKS=1``, or ``set_program_checks(True)``;
off by default, read at each cache lookup, and part of the cache key) computes, beside its
results, one flag per check and the first offending value. Each index-taking rule calls
``in_range`` and each integer division or remainder rule ``nonzero`` while it is traced;
``collecting`` gathers those into one int64 array that the program returns last.
``Executable.run`` reads that array once per run (one host read, only in checked mode) and
raises the first failed check, in program order, as eager would: ``CheckedIndexError`` or
``CheckedDivisionError``, naming the op, the line that recorded it and, for an index, the
dimension and its size.

The error comes after the program ran, so it cannot stop it: inside ``deferred()`` the error is
raised when the block ends, once the caller has bound the step's results (the bad one to what
XLA computed); a run outside ``deferred()`` raises at once. Inside regions (``scan_layers``,
``shard_map`` bodies) nothing is checked. An unchecked program is exactly what it was: no rule
traces anything for a check.
"""

from __future__ import annotations

import math
import os
import threading
from contextlib import contextmanager
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from ir_runtime import _metrics
from ir_runtime._data import fetch
from ir_runtime._errors import CheckedDivisionError, CheckedIndexError

ENV = "IR_RUNTIME_PROGRAM_CHECKS"
_FORCED: list = [None]  # set_program_checks()'s setting; None: the environment decides


def set_program_checks(on: bool | None = True) -> bool | None:
    """Run checked programs from now on (True), unchecked ones (False), or as
    ``IR_RUNTIME_PROGRAM_CHECKS`` says (None). Returns the previous setting, to restore it."""
    previous, _FORCED[0] = _FORCED[0], None if on is None else bool(on)
    return previous


def enabled() -> bool:
    """Whether a program looked up now is the checked one."""
    on = _FORCED[0]
    return os.environ.get(ENV, "0") not in ("", "0") if on is None else on


class Check(NamedTuple):
    """One check of a program, kept by its executable (no node): ``error`` the class it
    raises, ``text`` what failed with ``{}`` for the offending value, ``op`` and ``origin``
    the checked node's."""

    error: type
    text: str
    op: str
    origin: object

    def message(self, value: int, others: int, bound: bool) -> str:
        at = "" if self.origin is None else f" recorded at {self.origin}"
        more = f"; {others} more check(s) failed in this run" if others else ""
        then = (
            "its results are bound, this op's to what XLA made of the bad value (a clamped or "
            "dropped index, an undefined quotient)"
            if bound
            else "its results are dropped"
        )
        found = f"Found by the program's checks ({ENV}=1) after it ran"
        return f"{self.text.format(value)}, in {self.op}{at}{more}. {found}: {then}"


class _Collector:
    """The checks of the program being traced: their descriptions and traced flags."""

    __slots__ = ("checks", "flags")

    def __init__(self, checks: list):
        self.checks, self.flags = checks, []

    def add(self, check: Check, bad, value) -> None:
        self.checks.append(check)
        self.flags.append(jnp.stack([bad.astype(jnp.int64), value.astype(jnp.int64)]))

    def result(self):
        """The program's last result: per check, whether it failed and the value that did."""
        return jnp.concatenate(self.flags) if self.flags else jnp.zeros((0,), jnp.int64)


class _State(threading.local):
    def __init__(self):
        self.collectors = []  # innermost last; None where nothing is checked
        self.deferring = 0
        self.pending = []  # inside deferred(): (checks, flags) of each run, read at its end


_STATE = _State()


@contextmanager
def collecting(checks):
    """Trace inside: the checks rules make go to ``checks`` (a list, filled with ``Check``s)
    and to the collector this yields, whose ``result()`` is their flags; None: nothing is
    checked inside (a region's body, an unchecked program)."""
    collector = None if checks is None else _Collector(checks)
    stack = _STATE.collectors
    stack.append(collector)
    try:
        yield collector
    finally:
        stack.pop()


def _active():
    stack = _STATE.collectors
    return stack[-1] if stack else None


def in_range(node, index, low: int, high: int, dim=None, what: str = "index", ignore=None):
    """In a checked program, check that every element of ``index`` is in ``[low, high)`` (or
    is ``ignore``): an index into dimension ``dim`` of size ``high``, or into the flattened
    tensor of ``high`` elements (``dim`` None). ``low`` is ``-high`` where torch takes negative
    indices, else 0."""
    collector = _active()
    if collector is None or index.size == 0:
        return
    flat = index.reshape(-1)
    bad = (flat < low) | (flat >= high)
    if ignore is not None:
        bad = bad & (flat != ignore)
    into = f"a tensor of {high} elements" if dim is None else f"dimension {dim} with size {high}"
    check = Check(CheckedIndexError, f"{what} {{}} is out of bounds for {into}", *_of(node))
    collector.add(check, jnp.any(bad), flat[jnp.argmax(bad)])


def nonzero(node, divisor, shape) -> None:
    """In a checked program, check that an integer ``divisor``, broadcast to the result's
    ``shape``, has no zero (torch raises ``RuntimeError: ZeroDivisionError``)."""
    collector = _active()
    if collector is None or not jnp.issubdtype(divisor.dtype, jnp.integer) or not math.prod(shape):
        return
    check = Check(CheckedDivisionError, "integer division by zero", *_of(node))
    collector.add(check, jnp.any(jnp.broadcast_to(divisor, shape) == 0), jnp.zeros((), jnp.int64))


def _of(node) -> tuple:
    return node.op, getattr(node, "origin", None)


def verify(checks: list, flags) -> None:
    """A checked run's ``flags``: inside ``deferred()``, kept unread for the block's end (the
    caller binds the results first); outside, read now (the one host read of a checked run)
    and the first failed check raised."""
    state = _STATE
    if state.deferring:
        state.pending.append((checks, flags))
        return
    error = _first_failure([(checks, flags)], bound=False)
    if error is not None:
        raise error


def _first_failure(pending: list, bound: bool):
    """The error of the first failed check of these runs, in run and program order; None."""
    for checks, flags in pending:
        _metrics.count("ProgramCheckRead")
        values = fetch(flags).reshape(-1, 2)
        failed = np.flatnonzero(values[:, 0])
        if failed.size:
            check = checks[failed[0]]
            return check.error(check.message(int(values[failed[0], 1]), failed.size - 1, bound))
    return None


@contextmanager
def deferred():
    """A block whose programs' checks are read and raised at its end, not by the run that made
    them: a caller binds the step's results inside it, so they are bound when the error comes
    (and an interrupt while a flag is read loses nothing). Another error leaving the block
    wins; its runs' flags are dropped unread."""
    state = _STATE
    outer, state.pending = state.pending, []
    state.deferring += 1
    try:
        yield
    finally:
        state.deferring -= 1
        pending, state.pending = state.pending, outer
    error = _first_failure(pending, bound=True) if pending else None
    if error is not None:
        raise error
