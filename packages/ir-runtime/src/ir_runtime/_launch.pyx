# cython: language_level=3, boundscheck=False, wraparound=False
"""Launching a compiled program, in C: ``Executable.run``, and the one-collective-in-flight
rule's state and wait (``settle``; ``_collectives`` says the rule and waits for launches).

Every program the runtime runs goes through ``run``: a compiled step's replay calls it for each
step, so it runs no Python of its own. On a machine whose cores the device threads share with
the host (XLA's CPU devices), the host's work between two programs finds its caches cold, and
each Python function or lock it touches costs microseconds. So what an execution adds to the
metrics (``ExecuteCount``, ``ExecuteTime``, ``DonatedBuffers``, ``InputOutputAliasCount``,
``CollectiveSync``) is counted here in C and folded into ``_metrics`` when they are read
(``flush``, registered there), and jax's executable is called through the callable its
``Compiled.__call__`` forwards to. (``_collectives`` takes its state from here, so nothing this
module imports as it loads imports ``_collectives``.)
"""
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from ir_runtime import _distributed, _metrics, _profile
from ir_runtime._errors import ExecutionError
from ir_runtime._jaxapi import ArrayImpl

LAST_RUN: list = [None]  # the Executable that ran last
IN_FLIGHT: list = [None]  # the first result of the collective program still running on CPU
LAST: list = [None]  # the first result of the last program launched

cdef list _LAST_RUN = LAST_RUN
cdef list _IN_FLIGHT = IN_FLIGHT, _LAST = LAST
cdef list _ACTIVE = _profile.ACTIVE
cdef object _STATE = _distributed.STATE
cdef object _failure = _distributed.device_failure
cdef object _span = _profile.span
cdef object _ARRAY = ArrayImpl, _ExecutionError = ExecutionError
cdef dict _TIMERS = _metrics._timers
cdef long long _syncs = 0  # waits for a collective program still in flight (CollectiveSync)
cdef object _RUNTIME_CHECKS = None  # the module, once a checked program ran (``_checks``)

# Executions since the metrics were last read: their seconds (``ExecuteTime``), and of those
# that took buffers over, how many each took (``InputOutputAliasCount``), each kept as
# ``_metrics._record`` keeps a timer.
cdef struct Tally:
    long long n
    double total, high, last

cdef Tally _seconds, _buffers, _NONE  # (_NONE: all zero)


cdef inline double _now():
    """``time.perf_counter()``: the same clock, read without a call into Python."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


def run(exe, arrays):
    """``Executable.run``: launch ``exe`` on ``arrays`` (one per parameter) under the
    one-collective-in-flight rule; one array per root, in the roots' order. A checked program's
    flags are verified (``_runtime_checks``)."""
    cdef double start = _now()
    _LAST_RUN[0] = exe
    sync = exe.sync
    if sync and _IN_FLIGHT[0] is not None:
        settle()
    try:
        if _ACTIVE[0]:
            with _span("ir_runtime.execute"):
                outs = exe.compiled(*arrays)
        else:
            call = exe.call
            if call is None:  # jax makes its fast callable on the first call
                outs = exe.compiled(*arrays)
                exe.call = _fast_call(exe.compiled)
            else:
                outs = call(*arrays)
    except Exception as e:
        if "has been deleted" in str(e):  # (jax's refusal: the array is named)
            refuse_deleted(arrays, e)
        raise _failure(e, "the program") from e
    checks = exe.checks
    if checks is not None:  # (the flags come last; no negative index here: wraparound=False)
        n = len(outs) - 1
        outs, flags = outs[:n], outs[n]
    unorder = exe._unorder
    if unorder is not None:
        outs = [outs[j] for j in unorder]
    if outs:  # (the one-collective-in-flight rule: the next collective program waits for it)
        _LAST[0] = outs[0]
        if sync:
            _IN_FLIGHT[0] = outs[0]
    _STATE.launched += 1
    _note(_now() - start, len(exe.donate))
    if checks:
        _checks().verify(checks, flags)
    return outs


cpdef int refuse_deleted(arrays, e) except -1:
    """Raise ``ExecutionError`` naming the first of ``arrays`` that was deleted (donated to an
    earlier program), when one was (``e``: what failed because of it, or None). A compiled
    step's replay passes its arrays unchecked (jax's call checks each anyway, shard by shard);
    this names the one once the launch failed, or before a copy of one is taken."""
    for k, a in enumerate(arrays):
        if type(a) is _ARRAY and a.is_deleted():
            raise _ExecutionError(
                f"parameter {k} of the program holds a deleted (donated) buffer "
                f"({a.dtype}{list(a.shape)}): a tensor that still reads it lost its data to "
                f"an earlier program") from e
    return 0


cdef object _checks():
    """``_runtime_checks``, imported at its first checked run (it imports ``_collectives``,
    which imports this module)."""
    global _RUNTIME_CHECKS
    if _RUNTIME_CHECKS is None:
        from ir_runtime import _runtime_checks

        _RUNTIME_CHECKS = _runtime_checks
    return _RUNTIME_CHECKS


cpdef settle():
    """Wait for the collective program still running on CPU devices, if there is one."""
    global _syncs
    a = _IN_FLIGHT[0]
    if a is None:
        return
    _IN_FLIGHT[0] = None
    _syncs += 1
    try:
        if not a.is_deleted():
            a.block_until_ready()
    except Exception as e:
        raise _failure(e, "the previous program") from e


cdef object _fast_call(compiled):
    """The callable jax's ``Compiled.__call__`` forwards to (its C++ dispatch), once made;
    the compiled object itself where there is none."""
    call = getattr(compiled, "_call", None)
    return compiled if call is None else call


cdef int _note(double seconds, long long donated) except -1:
    """Count one execution (``flush`` folds the counts into ``_metrics``)."""
    _add(&_seconds, seconds, "ExecuteTime")
    if donated:
        _add(&_buffers, donated, "InputOutputAliasCount")
    return 0


cdef int _add(Tally* t, double value, str name) except -1:
    if t.n == 0:  # the first since a read: its timer takes its place in order, as recorded
        _TIMERS.setdefault(name, [0, 0.0, 0.0, 0.0])
    t.n += 1
    t.total += value
    if value > t.high:
        t.high = value
    t.last = value
    return 0


def flush(counters: dict, timers: dict):
    """Fold the executions counted since the last read into ``_metrics``' tables (its lock
    held: ``_metrics.metrics`` and ``reset_metrics`` call this first). The counts are taken and
    zeroed before anything is allocated, so none that a thread adds meanwhile is lost."""
    global _seconds, _buffers, _syncs
    cdef Tally seconds = _seconds, buffers = _buffers
    cdef long long syncs = _syncs
    _seconds = _buffers = _NONE
    _syncs = 0
    if syncs:
        counters["CollectiveSync"] = counters.get("CollectiveSync", 0) + syncs
    if seconds.n:
        counters["ExecuteCount"] = counters.get("ExecuteCount", 0) + seconds.n
        _fold(timers, "ExecuteTime", seconds, seconds.high, seconds.last)
    if buffers.n:  # (buffers: whole numbers, as _metrics._record keeps them)
        counters["DonatedBuffers"] = counters.get("DonatedBuffers", 0) + <long long>buffers.total
        _fold(timers, "InputOutputAliasCount", buffers, <long long>buffers.high,
              <long long>buffers.last)


cdef int _fold(dict timers, str name, Tally tally, high, last) except -1:
    t = timers.setdefault(name, [0, 0.0, 0.0, 0.0])  # as _metrics._record keeps a timer
    t[0] += tally.n
    t[1] += tally.total
    if high > t[2]:
        t[2] = high
    t[3] = last
    return 0


_metrics.FLUSH.append(flush)
