"""``torch_xla.debug.profiler`` (``xp``): traces through jax's profiler (the same XLA
profiler torch_xla uses; view with TensorBoard or Perfetto)."""

from __future__ import annotations

import contextlib

import jax

import ir_runtime as _irt

_TRACER_MARKED_STEP = [False]


def set_tracer_marked_step(value: bool) -> None:
    _TRACER_MARKED_STEP[0] = value


def get_tracer_marked_step() -> bool:
    return _TRACER_MARKED_STEP[0]


def start_server(port: int, only_on_master: bool = True):
    """Start the profiler server on ``port`` (jax's)."""
    return jax.profiler.start_server(port)


def trace(service_addr: str, logdir: str, duration_ms: int = 1000, **kwargs) -> None:
    raise NotImplementedError(
        "torch_xla.debug.profiler.trace (capture from a remote profiler server) is not "
        "available here: trace in process with start_trace(logdir) / stop_trace(), or "
        "ir_runtime.profile"
    )


def trace_detached(*args, **kwargs) -> None:
    trace(*args, **kwargs)


def start_trace(log_dir) -> None:
    jax.profiler.start_trace(str(log_dir))


def stop_trace() -> None:
    jax.profiler.stop_trace()


class Trace(contextlib.ContextDecorator):
    """A named span in the trace (``jax.profiler.TraceAnnotation``)."""

    def __init__(self, name: str, **kwargs):
        self.name = name
        self._span = jax.profiler.TraceAnnotation(name, **kwargs)

    def __enter__(self):
        self._span.__enter__()
        return self

    def __exit__(self, *exc):
        return self._span.__exit__(*exc)


class StepTrace(Trace):
    """A step's span: the step runs (``mark_step``) at its end, as torch_xla's does."""

    def __init__(self, name: str, **kwargs):
        super().__init__(name, **kwargs)

    def __exit__(self, *exc):
        try:
            if exc[0] is None:
                _irt.mark_step()
        finally:
            super().__exit__(*exc)
        return False


def trace_me(scope: str):
    def decorate(fn):
        return Trace(scope)(fn)

    return decorate
