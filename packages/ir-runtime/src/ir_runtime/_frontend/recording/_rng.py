"""Random numbers on the lazy device: a key per step, an offset per op.

The key is a uint32[3] parameter (the seed, a step counter, and the base of the offsets), so
every step runs the same program on a new key, and ``torch.manual_seed(s)`` restarts the
stream: the same seed gives the same numbers (not CPU torch's bits; jax's threefry generator).
An op draws at ``base + offset``. When a graph runs in the middle of a step (a value read to the
host), the draws after it take a new key whose base is where the stream is, with offsets from
0 again: the numbers are those of an uncut step, and a loop that reads a value per iteration
(a sampling loop's tokens) records the same program every iteration, compiled once.

This module owns the stream's state (``_state``); everything else reads and writes it through
``current_key``, ``draw``, ``state``, ``restore``, ``keyed``, ``own_key``, ``seedings``,
``snapshot``, ``put_back`` and ``next_step`` (whose body, ``_fast.next_step``, a compiled
step's replay calls on this state directly)."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from ir_core import DeviceData, Generic, Shape, Value
from ir_runtime._frontend.recording import _fast
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap

_state = {"seed": None, "seedings": -1, "step": 0, "base": 0, "offset": 0, "key": None}


def next_step() -> None:
    """Called by mark_step: the next step draws from a new key (``_fast.next_step``, which a
    compiled step's replay calls on this module's state)."""
    _fast.next_step(_state)


def rebase() -> None:
    """Called once a graph has run: the next draws take a new key whose base is where the
    stream is, offsets from 0 (the tensors still pending keep the key they drew from)."""
    if _state["offset"]:
        _state.update(base=_state["base"] + _state["offset"], offset=0, key=None)


_seedings = [0]  # how many times torch.manual_seed has been called
_torch_manual_seed = torch.manual_seed


def _manual_seed(seed):
    """torch.manual_seed, counted: the lazy stream restarts when the user reseeds."""
    _seedings[0] += 1
    return _torch_manual_seed(seed)


def seedings() -> int:
    """How many times torch has been reseeded: a compiled step's trace compares it before and
    after the call, to reseed its replays the same way."""
    return _seedings[0]


def install() -> None:
    """Count torch's reseeds (``torch.manual_seed`` replaced by a counting wrapper)."""
    torch.manual_seed = _manual_seed
    torch.random.manual_seed = _manual_seed


def sync() -> None:
    """The stream restarted if torch was reseeded since it last drew (also in the middle of a
    step), as torch's does."""
    seed = torch.initial_seed()
    if seed != _state["seed"] or _seedings[0] != _state["seedings"]:
        _state.update(seed=seed, seedings=_seedings[0], step=0, base=0, offset=0, key=None)


def current_key():
    """The step's key as drawn so far (a ``Value``), or None when nothing in it drew yet."""
    return _state["key"]


def draw() -> tuple[Value, int]:
    """The step's key and the next offset: what one random op draws from."""
    sync()
    if _state["key"] is None:
        words = (_state["seed"], _state["step"], _state["base"])
        data = np.array([w & 0xFFFFFFFF for w in words], np.uint32)
        _state["key"] = Value(DeviceData(Shape("uint32", (3,)), handle=data))
    offset = _state["offset"]
    _state["offset"] += 1
    return _state["key"], offset


def state() -> tuple[int, int]:
    """Where the stream is: ``(step, offset of the next random op)``."""
    sync()
    return _state["step"], _state["base"] + _state["offset"]


def restore(step: int, offset: int) -> None:
    """Put the stream back at ``(step, offset)`` (after ``state``, or from a checkpoint). The
    key is kept when the stream is there already, made again (its base at ``offset``) when
    not."""
    sync()
    if (step, offset) != (_state["step"], _state["base"] + _state["offset"]):
        _state.update(step=step, base=offset, offset=0, key=None)


def snapshot(reseeds: bool) -> tuple:
    """The stream's state and torch's reseed count, and CPU torch's generator state when
    ``reseeds``: what ``put_back`` restores (a compiled step's replay takes one before it
    reseeds and draws, and puts it back if its launch fails)."""
    return dict(_state), _seedings[0], torch.get_rng_state() if reseeds else None


def put_back(saved: tuple) -> None:
    """The stream (and torch's generator) as ``snapshot`` found them."""
    state, seedings, cpu = saved
    _state.clear()
    _state.update(state)
    _seedings[0] = seedings
    if cpu is not None:
        torch.set_rng_state(cpu)


@contextlib.contextmanager
def keyed(key):
    """Random ops inside draw from ``key`` (a region's own, barriered key) instead of the
    step's; None: the step's, unchanged."""
    if key is None:
        yield
        return
    saved = _state["key"]
    _state["key"] = key
    try:
        yield
    finally:
        if _state["key"] is key:
            _state["key"] = saved


@contextlib.contextmanager
def own_key(key):
    """Random ops inside draw from ``key`` at offsets from 0 (a program traced on its own,
    whose key is an input it is fed per call); the stream is where it was afterwards."""
    sync()
    saved = dict(_state)
    _state.update(key=key, offset=0)
    try:
        yield
    finally:
        _state.clear()
        _state.update(saved)


def random(op, shape: Shape, *operands, **attrs) -> LazyTensor:
    """A lazy tensor of ``shape`` drawn by the ``ir::random_*`` op ``op`` from the step's key
    at the next offset."""
    key, offset = draw()
    attrs = {"offset": offset, **attrs}
    return wrap(Value(Generic(op, [key, *operands], [shape], attrs, None, _fast.origin())))


def bernoulli_mask(x, p: float):
    """A bool tensor like ``x``: True with probability ``p``."""
    return random("ir::random_bernoulli", Shape("bool", tuple(x.shape)), p=float(p))
