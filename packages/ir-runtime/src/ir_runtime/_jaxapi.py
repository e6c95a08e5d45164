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


class _Frames:
    """A traceback as jax's lowering reads one: ``raw_frames`` (innermost first), and ``+``
    (jax appends the caller's traceback to each operation's in nested programs)."""

    __slots__ = ("codes", "lastis")

    def __init__(self, codes, lastis):
        self.codes, self.lastis = codes, lastis

    def raw_frames(self):
        return self.codes, self.lastis

    def __add__(self, outer):
        codes, lastis = outer.raw_frames()
        return self if not codes else _Frames(self.codes + list(codes), self.lastis + list(lastis))

    def __radd__(self, inner):
        codes, lastis = inner.raw_frames()
        return self if not codes else _Frames(list(codes) + self.codes, list(lastis) + self.lastis)

    def as_python_traceback(self):
        return None


def recorded_at(code, lasti):
    """A context in which the jax operations traced say they come from instruction ``lasti``
    of ``code`` (the torch line that recorded the node), in their StableHLO locations and XLA's
    op metadata. jax takes an operation's location from the Python stack it was traced from,
    which is a lowering rule's; its public API has no way to give another one."""
    from jax._src import source_info_util

    return source_info_util.user_context(_Frames([code], [lasti]))


def one_frame_locations():
    """A context in which jax writes one file:line location per operation (not the call-site
    chain of a whole Python stack, which needs a real jaxlib traceback ``recorded_at`` cannot
    make). The setting is jax's ``jax_include_full_tracebacks_in_locations``, as a context."""
    from jax._src import config

    return config.include_full_tracebacks_in_locations(False)


def all_gather_invariant(x, axes, dim: int):
    """``lax.all_gather(x, axes, axis=dim, tiled=True)`` whose result jax knows to be the same
    on every device along ``axes`` (invariant), so an out spec may leave those axes out, as a
    gathered value is used; its transpose is each device's slice of the cotangent. jax's
    public ``all_gather`` marks its result as varying, which a replicated out spec refuses."""
    from jax._src.lax.parallel import all_gather_invariant

    return all_gather_invariant(x, axes, axis=dim, tiled=True)


__all__ = [
    "all_gather_invariant",
    "ArrayImpl",
    "backends_are_initialized",
    "distributed_client",
    "one_frame_locations",
    "recorded_at",
]
