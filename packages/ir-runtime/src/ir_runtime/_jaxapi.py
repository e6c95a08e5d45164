"""The jax internals ir_runtime uses, each where no public API does the job, in one place.

Nothing else in ir_runtime imports ``jax._src``. Each name says why it is needed; when jax
makes one public, this module is the only one to change.
"""

from __future__ import annotations

# jax.Array's concrete type. Placing a step's parameters checks every buffer's type on the hot
# path; ``isinstance(h, jax.Array)`` goes through an ABC's subclass hook and costs several times
# an exact ``type(h) is ArrayImpl``.
from jax._src.array import ArrayImpl


def backends_are_initialized() -> bool:
    """Whether the XLA backend has started. jax's public calls that could tell (``jax.devices``)
    start it, which fixes the CPU device count and forbids joining other processes: ``init``
    must know without starting it."""
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def distributed_client():
    """The coordination service's client of ``jax.distributed``: its key-value store carries the
    watchdog's heartbeats. jax exposes no public handle to it."""
    from jax._src import distributed

    return distributed.global_state.client


__all__ = ["ArrayImpl", "backends_are_initialized", "distributed_client"]
