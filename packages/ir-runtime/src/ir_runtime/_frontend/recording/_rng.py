"""Random numbers on the lazy device: a key per step, an offset per op.

The key is a uint32[2] parameter (the seed and a step counter), so every step runs the same
program on a new key, and ``torch.manual_seed(s)`` restarts the stream: the same seed gives the
same numbers (not CPU torch's bits; jax's threefry generator)."""

from __future__ import annotations

import numpy as np
import torch

from ir_core import DeviceData, Generic, Shape, Value
from ir_runtime._frontend.recording import _fast
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap

_state = {"seed": None, "seedings": -1, "step": 0, "offset": 0, "key": None}


def next_step() -> None:
    """Called by mark_step: the next step draws from a new key."""
    _state["step"] += 1
    _state["offset"] = 0
    _state["key"] = None


_seedings = [0]  # how many times torch.manual_seed has been called
_torch_manual_seed = torch.manual_seed


def _manual_seed(seed):
    """torch.manual_seed, counted: the lazy stream restarts when the user reseeds."""
    _seedings[0] += 1
    return _torch_manual_seed(seed)


def install() -> None:
    """Count torch's reseeds (``torch.manual_seed`` replaced by a counting wrapper)."""
    torch.manual_seed = _manual_seed
    torch.random.manual_seed = _manual_seed


def sync() -> None:
    """The stream restarted if torch was reseeded since it last drew (also in the middle of a
    step), as torch's does."""
    seed = torch.initial_seed()
    if seed != _state["seed"] or _seedings[0] != _state["seedings"]:
        _state.update(seed=seed, seedings=_seedings[0], step=0, offset=0, key=None)


def _key() -> tuple[Value, int]:
    sync()
    seed = _state["seed"]
    if _state["key"] is None:
        data = np.array([seed & 0xFFFFFFFF, _state["step"] & 0xFFFFFFFF], dtype=np.uint32)
        _state["key"] = Value(DeviceData(Shape("uint32", (2,)), handle=data))
    offset = _state["offset"]
    _state["offset"] += 1
    return _state["key"], offset


def random(op, shape: Shape, *operands, **attrs) -> LazyTensor:
    """A lazy tensor of ``shape`` drawn by the ``ir::random_*`` op ``op`` from the step's key
    at the next offset."""
    key, offset = _key()
    attrs = {"offset": offset, **attrs}
    return wrap(Value(Generic(op, [key, *operands], [shape], attrs, None, _fast.origin())))


def bernoulli_mask(x, p: float):
    """A bool tensor like ``x``: True with probability ``p``."""
    return random("ir::random_bernoulli", Shape("bool", tuple(x.shape)), p=float(p))
