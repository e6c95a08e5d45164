"""Counters and timings, named as torch_xla users know them."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

_lock = threading.Lock()
_counters: dict[str, int] = {}
_timers: dict[str, list[float]] = {}  # name -> [count, total seconds, max seconds, last]
# What folds counts kept elsewhere into these tables before they are read, its lock held:
# ``flush(counters, timers)`` (``_launch`` counts executions in C, off the hot path's locks).
FLUSH: list = []

COUNTERS = (
    "CompileCount",  # XLA compiles (in-memory cache misses)
    "CacheHit",  # in-memory compile-cache hits
    "CacheMiss",
    "PersistentCacheHit",  # compiles served by JAX's persistent compilation cache
    "ExecuteCount",
    "CollectiveSync",  # waits that keep collective programs from overlapping on CPU
    "TransferToDevice",  # host -> device transfers (arrays placed)
    "TransferToHost",
    "Reshard",  # device arrays moved to a parameter's sharding
    "DonatedBuffers",
    "HostRead",  # reads to the host (.item(), .cpu(), print) that ran a program
    "HostReadTensors",  # tensors those programs computed: the read one and those sharing its graph
)
# Timers appear in metrics() in the order first recorded (an execution's, ``_launch``'s, at the
# first read after it): LowerTime, CompileTime, ExecuteTime, GraphNodes (nodes, not seconds),
# CacheLookupTime, TraceTime (host time between two mark_steps: recording a step), MarkStepTime
# and TransferToDeviceTime; and two of sizes, as torch_xla names them: OutboundData (bytes of
# each host -> device transfer) and InputOutputAliasCount (buffers each program took over).
# Counters named "Decomposed::<op>" count ops that went through torch's decompositions (slow on
# the tracing path: candidates for a lowering rule); "Unsupported::<op>" ops with neither.


def count(name: str, n: int = 1) -> None:
    with _lock:
        _counters[name] = _counters.get(name, 0) + n


def record(name: str, value: float) -> None:
    with _lock:
        _record(name, value)


def _record(name: str, value: float) -> None:
    t = _timers.setdefault(name, [0, 0.0, 0.0, 0.0])
    t[0] += 1
    t[1] += value
    t[2] = max(t[2], value)
    t[3] = value


def transferred(nbytes: int, seconds: float) -> None:
    """A host -> device transfer: ``OutboundData`` (bytes) and ``TransferToDeviceTime``."""
    with _lock:
        _record("OutboundData", nbytes)
        _record("TransferToDeviceTime", seconds)


@contextmanager
def timed(name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        record(name, time.perf_counter() - start)


def metrics() -> dict:
    """Every counter and timer: ``{"counters": {name: n}, "timers": {name: {...}}}``.

    Timers give count, total, mean, max and last (seconds; ``GraphNodes`` in nodes).
    """
    with _lock:
        _flush()
        counters = {name: _counters.get(name, 0) for name in COUNTERS}
        counters.update({k: v for k, v in _counters.items() if k not in counters})
        timers = {
            name: {
                "count": t[0],
                "total": t[1],
                "mean": t[1] / t[0] if t[0] else 0.0,
                "max": t[2],
                "last": t[3],
            }
            for name, t in _timers.items()
        }
    return {"counters": counters, "timers": timers}


def metrics_report() -> str:
    """The metrics as text, one line per counter and timer."""
    m = metrics()
    lines = ["Counters:"]
    lines += [f"  {k}: {v}" for k, v in m["counters"].items()]
    lines.append("Timers (seconds; GraphNodes in nodes):")
    for name, t in m["timers"].items():
        lines.append(
            f"  {name}: count={t['count']} total={t['total']:.6g} mean={t['mean']:.6g} "
            f"max={t['max']:.6g} last={t['last']:.6g}"
        )
    return "\n".join(lines)


def reset_metrics(counters: bool = True, timers: bool = True) -> None:
    """Clear the counters and the timers (either alone: torch_xla clears them apart)."""
    with _lock:
        _flush()
        if counters:
            _counters.clear()
        if timers:
            _timers.clear()


def _flush() -> None:
    for flush in FLUSH:
        flush(_counters, _timers)
