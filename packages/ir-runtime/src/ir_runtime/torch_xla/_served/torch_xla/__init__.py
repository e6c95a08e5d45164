"""torch_xla's top-level API, served by ir_runtime over its engine (``ir_runtime.torch_xla``).

The device is the engine's, named ``xla``; a step is ``ir_runtime.mark_step``; ``compile``
runs the function's Python on every call and its program comes from the engine's compile
cache (torch_xla's semantics)."""

from __future__ import annotations

import contextlib
import functools

import torch

import ir_runtime as _irt
from ir_runtime.torch_xla import _core

__version__ = "2.9.0+ir_runtime." + _irt.__version__

from torch_xla import _XLAC, runtime  # noqa: F401  (torch_xla.runtime, torch_xla._XLAC)
from torch_xla.core import xla_model as _xm
from torch_xla.distributed import xla_backend  # noqa: F401  (registers "xla" and xla://)


def device(index: int | None = None) -> torch.device:
    """``xla:0`` under SPMD (one virtual device over all); else ``xla:index``."""
    _core.devices()
    _irt.install()
    if _core.is_spmd() or index is None:
        return torch.device("xla", 0)
    if index >= len(_core.local_devices()):
        raise IndexError(f"Device index {index} out of range in {[str(d) for d in devices()]}")
    if index != 0:
        raise NotImplementedError(
            f"torch_xla.device({index}): this engine runs one process's devices as one SPMD "
            f"program behind xla:0 (use torch_xla.runtime.use_spmd() and shardings, or one "
            f"process per device with python -m ir_runtime.launch)"
        )
    return torch.device("xla", 0)


def devices() -> list[torch.device]:
    return [torch.device(d) for d in _xm.get_xla_supported_devices()]


def real_devices() -> list[str]:
    return _xm.xla_real_devices()


def device_count() -> int:
    return len(real_devices())


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """Run the pending graph of the live tensors (``ir_runtime.mark_step``), then the step
    closures; ``wait`` blocks until the program has finished."""
    _core.sync(wait)


def step():
    """A context that syncs on entry and on exit (torch_xla's experimental ``step``)."""
    return compile()


def compile(
    f=None,
    full_graph: bool = False,
    name: str | None = None,
    max_different_graphs: int | None = None,
):
    """torch_xla's ``compile``: the pending work is synced first; ``f`` runs (its Python, every
    call) and the graph it recorded runs as one program at its end, compiled once per distinct
    graph (the engine's compile cache). ``full_graph=True``: a host read inside ``f`` (which
    would run a graph of its own) raises, naming ``f``. ``max_different_graphs``: more
    distinct graphs than that from ``f`` raise. Used as a decorator, a wrapper, or a context
    manager (``with torch_xla.compile():``)."""
    label = name or getattr(f, "__name__", None) or "torch_xla.compile"
    graphs = [0]  # distinct graphs f recorded: each compiled once, the first time it ran

    @contextlib.contextmanager
    def region():
        from ir_runtime._frontend.steps._step import watch

        _core.sync()
        with watch() as w:
            yield
        before = _irt.metrics()["counters"]["CompileCount"]
        _core.sync()
        if full_graph and w.host_reads:
            raise RuntimeError(
                f"torch_xla.compile({label}, full_graph=True): {w.host_reads} value(s) were "
                f"read to the host inside it, each running a graph of its own; keep the "
                f"function on the device (no .item(), .cpu() or print of a tensor inside)"
            )
        graphs[0] += _irt.metrics()["counters"]["CompileCount"] - before
        if max_different_graphs is not None and graphs[0] > max_different_graphs:
            raise RuntimeError(
                f"torch_xla.compile({label}): {graphs[0]} different graphs, more than "
                f"max_different_graphs={max_different_graphs} (a shape or a Python branch "
                f"that changes between calls records a new graph)"
            )

    if f is None:
        return region()

    @functools.wraps(f)
    def compiled(*args, **kwargs):
        with region():
            return f(*args, **kwargs)

    return compiled


def manual_seed(seed, device=None) -> None:
    """Restart the device's random stream from ``seed`` (here through ``torch.manual_seed``,
    which the engine's stream follows; the CPU generator is reseeded with it)."""
    _xm.set_rng_state(seed, device)


def launch(fn, args=(), start_method: str = "spawn", debug_single_process: bool = False):
    """Call ``fn(index, *args)`` for this process. Under SPMD (or one process per run), this
    process is the one: ``fn(process_index, *args)``. One process per device (torch_xla's
    multiprocess mode) runs as one process per ``python -m ir_runtime.launch`` process."""
    import os

    if os.environ.get("LOCAL_RANK") is not None:
        return fn(int(os.environ["LOCAL_RANK"]), *args)
    return fn(runtime.process_index(), *args)
