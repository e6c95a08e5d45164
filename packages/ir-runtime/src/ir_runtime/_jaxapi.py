"""The jax internals ir_runtime uses, each where no public API does the job, in one place.

Nothing else in ir_runtime imports ``jax._src``. Each name says why it is needed; when jax
makes one public, this module is the only one to change.
"""

from __future__ import annotations

import contextlib

import jax

# jax.Array's concrete type. Placing a step's parameters checks every buffer's type on the hot
# path; ``isinstance(h, jax.Array)`` goes through an ABC's subclass hook and costs several times
# an exact ``type(h) is ArrayImpl``.
# ``_hot`` reads an array's sharding as ``ArrayImpl._sharding``, the object jax's public
# ``sharding`` property returns: that property is a Python function, run once per parameter on
# every replay, where ``_sharding`` is jaxlib's own accessor, run without a Python frame.
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


_OWN_CACHES: list = []  # the user context that keeps jax's caches of our lowerings apart


@contextlib.contextmanager
def one_frame_locations():
    """A context for lowering graphs whose operations ``recorded_at`` locates.

    jax writes one file:line location per operation (not the call-site chain of a whole Python
    stack, which needs a real jaxlib traceback, which ``recorded_at`` cannot make): its
    ``jax_include_full_tracebacks_in_locations`` setting, as a context. And jax's caches of
    what is traced inside (the jaxprs of jitted helpers such as ``jax.nn.relu``) are kept apart
    from the user's own, through a public ``jax.make_user_context``: a jaxpr traced here holds
    ``recorded_at``'s stand-in tracebacks, which jax's full-traceback lowering of the user's
    own programs would refuse."""
    from jax._src import config

    if not _OWN_CACHES:
        _OWN_CACHES.append(jax.make_user_context(None))
    with config.include_full_tracebacks_in_locations(False), _OWN_CACHES[0]("ir_runtime"):
        yield


def batched_put(aval, sharding, shards, devices):
    """One jax.Array of ``aval`` placed as ``sharding``, from each device's host part
    (``shards[i]`` onto ``devices[i]``), in one call: what ``jax.device_put(host, sharding)``
    ends in, without working out and checking which part goes where again on every call."""
    from jax._src.interpreters import pxla

    return pxla.batched_device_put(aval, sharding, shards, devices)


def all_gather_invariant(x, axes, dim: int):
    """``lax.all_gather(x, axes, axis=dim, tiled=True)`` whose result jax knows to be the same
    on every device along ``axes`` (invariant), so an out spec may leave those axes out, as a
    gathered value is used; its transpose is each device's slice of the cotangent. jax's
    public ``all_gather`` marks its result as varying, which a replicated out spec refuses."""
    from jax._src.lax.parallel import all_gather_invariant

    return all_gather_invariant(x, axes, axis=dim, tiled=True)


__all__ = [
    "ArrayImpl",
    "all_gather_invariant",
    "backends_are_initialized",
    "batched_put",
    "distributed_client",
    "one_frame_locations",
    "recorded_at",
]
