"""``torch_xla.debug.metrics`` (``met``): the engine's counters and timers under torch_xla's
names. Counters: ``UncachedCompile`` (XLA compiles), ``CachedCompile`` (compile-cache hits),
``ExecuteReplicated`` (programs run: every program here is an SPMD one), ``MarkStep``,
``TransferToDevice``, ``TransferFromDevice``; the engine's own names as they are. Metrics:
``CompileTime``, ``ExecuteTime`` and ``ExecuteReplicatedTime`` (the same programs),
``LowerTime``, ``TraceTime``. A metric's data is torch_xla's ``(count, total, samples)``, the
samples one ``(time, last value)`` pair; times are nanoseconds, as torch_xla reports them."""

from __future__ import annotations

import time

import ir_runtime as _irt

# torch_xla's name -> the engine's
COUNTERS = {
    "UncachedCompile": "CompileCount",
    "CachedCompile": "CacheHit",
    "ExecuteReplicated": "ExecuteCount",
    "TransferFromDevice": "TransferToHost",
}
METRICS = {"ExecuteReplicatedTime": "ExecuteTime", "TransferFromDeviceTime": None}
_TIMES = {"CompileTime", "ExecuteTime", "LowerTime", "TraceTime", "MarkStepTime", "CacheLookupTime"}


def _counters() -> dict:
    from ir_runtime._frontend.steps._step import _EVENTS

    raw = _irt.metrics()["counters"]
    out = {name: raw[engine] for name, engine in COUNTERS.items() if raw.get(engine)}
    out.update({k: v for k, v in raw.items() if v})
    if _EVENTS["mark_steps"] - _CLEARED[0]:
        out["MarkStep"] = _EVENTS["mark_steps"] - _CLEARED[0]
    return out


_CLEARED = [0]  # mark_steps counted when counters were last cleared


def counter_names() -> list[str]:
    return list(_counters())


def counter_value(name: str):
    """The counter's value, None when it has not counted anything (torch_xla's answer)."""
    return _counters().get(name)


def _timers() -> dict:
    raw = _irt.metrics()["timers"]
    out = dict(raw)
    for name, engine in METRICS.items():
        if engine in raw:
            out[name] = raw[engine]
    return out


def metric_names() -> list[str]:
    return list(_timers())


def metric_data(name: str):
    t = _timers().get(name)
    if t is None or not t["count"]:
        return None
    scale = 1e9 if name in _TIMES or name.endswith("Time") else 1
    return (t["count"], t["total"] * scale, [(time.time_ns(), t["last"] * scale)])


def clear_counters() -> None:
    from ir_runtime._frontend.steps._step import _EVENTS

    _irt.reset_metrics(timers=False)
    _CLEARED[0] = _EVENTS["mark_steps"]


def clear_metrics() -> None:
    _irt.reset_metrics(counters=False)


def clear_all() -> None:
    clear_metrics()
    clear_counters()


def metrics_report() -> str:
    return _irt.metrics_report()


def short_metrics_report(counter_names=None, metric_names=None) -> str:
    counters = _counters()
    timers = _timers()
    counter_names = counter_names or ["CachedCompile", "MarkStep"]
    metric_names = metric_names or ["CompileTime", "ExecuteTime", "ExecuteReplicatedTime"]
    lines = [f"Counter: {n}\n  Value: {counters[n]}" for n in counter_names if n in counters]
    lines += [
        f"Metric: {n}\n  TotalSamples: {timers[n]['count']}\n  Accumulator: {timers[n]['total']}"
        for n in metric_names
        if n in timers
    ]
    return "\n".join(lines)


def executed_fallback_ops() -> list[str]:
    """Ops the engine ran through a decomposition or could not lower (its ``Decomposed::`` and
    ``Unsupported::`` counters)."""
    return [k.split("::", 1)[1] for k in _irt.metrics()["counters"] if "::" in k]
