"""``profile(logdir)``: a trace jax's profiler tools (TensorBoard, XProf) and Perfetto open.

Inside the context, jax's profiler records XLA's own activity, and the runtime adds named spans
for its phases: ``ir_runtime.trace`` (recording a step: the host time from one ``mark_step`` to
the next, or ``compile_step``'s trace of its function), ``ir_runtime.mark_step``,
``ir_runtime.lower``, ``ir_runtime.compile``, ``ir_runtime.execute`` and
``ir_runtime.replay`` (a compiled step's replay). XLA's operations in the trace are named by
the torch op and the file and line that recorded them (their op metadata).

Outside the context the spans cost one list read each: nothing is created.
"""

from __future__ import annotations

import contextlib
import os

import jax

ACTIVE = [False]
_NULL = contextlib.nullcontext()
_BETWEEN = [None]  # the open ``ir_runtime.trace`` span between two mark_steps


def span(name: str):
    """A named span in the profile while one is recorded; otherwise a no-op context."""
    if not ACTIVE[0]:
        return _NULL
    return jax.profiler.TraceAnnotation(name)


def step_started() -> None:
    """A mark_step begins: the recording span since the last one ends."""
    t = _BETWEEN[0]
    if t is not None:
        _BETWEEN[0] = None
        t.__exit__(None, None, None)


def step_ended() -> None:
    """A mark_step is done: what follows, until the next, is the next step's recording."""
    if ACTIVE[0] and _BETWEEN[0] is None:
        t = span("ir_runtime.trace")
        t.__enter__()
        _BETWEEN[0] = t


@contextlib.contextmanager
def profile(logdir, perfetto: bool = True, python: bool = False):
    """Record a profile of what runs inside into ``logdir`` (module docstring): jax's
    ``plugins/profile/<run>/*.xplane.pb``, and with ``perfetto`` a ``perfetto_trace.json.gz``
    beside it that ui.perfetto.dev opens. ``python``: also every Python call (jax's Python
    tracer; off by default: torch's Python alone fills the trace's million events)."""
    if ACTIVE[0]:
        raise RuntimeError("ir_runtime.profile is already recording; profiles do not nest")
    os.makedirs(logdir, exist_ok=True)
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 1 if python else 0
    jax.profiler.start_trace(str(logdir), create_perfetto_trace=perfetto, profiler_options=options)
    ACTIVE[0] = True
    try:
        yield
    finally:
        step_started()  # (closes an open recording span)
        ACTIVE[0] = False
        jax.profiler.stop_trace()
