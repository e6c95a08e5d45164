"""Random numbers on the lazy device: a key per step, an offset per op.

The key is a uint32[2] parameter (the seed and a step counter), so every step runs the same
program on a new key, and ``torch.manual_seed(s)`` restarts the stream: the same seed gives the
same numbers (not CPU torch's bits; jax's threefry generator)."""

from __future__ import annotations

import numpy as np
import torch

from ir_core import DeviceData, Generic, Shape, Value
from ir_runtime._frontend import _record

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


torch.manual_seed = _manual_seed
torch.random.manual_seed = _manual_seed


def _key() -> tuple[Value, int]:
    seed = torch.initial_seed()
    if _state["key"] is None and (seed != _state["seed"] or _seedings[0] != _state["seedings"]):
        _state.update(seed=seed, seedings=_seedings[0], step=0, offset=0, key=None)
    if _state["key"] is None:
        data = np.array([seed & 0xFFFFFFFF, _state["step"] & 0xFFFFFFFF], dtype=np.uint32)
        _state["key"] = Value(DeviceData(Shape("uint32", (2,)), handle=data))
    offset = _state["offset"]
    _state["offset"] += 1
    return _state["key"], offset


def _random(op, shape: Shape, **attrs):
    from ir_runtime._frontend._tensor import wrap

    key, offset = _key()
    return wrap(Value(Generic(op, [key], [shape], {"offset": offset, **attrs})))


def bernoulli_mask(x, p: float):
    """A bool tensor like ``x``: True with probability ``p``."""
    return _random("ir::random_bernoulli", Shape("bool", tuple(x.shape)), p=float(p))


def random_like(func, t, args, kwargs):
    shape = _record.shape_of(t)
    name = func._schema.name
    if name == "aten::uniform_":
        low = args[0] if args else kwargs.get("from", 0.0)
        high = args[1] if len(args) > 1 else kwargs.get("to", 1.0)
        return _random("ir::random_uniform", shape, low=float(low), high=float(high))
    if name == "aten::normal_":
        mean = args[0] if args else kwargs.get("mean", 0.0)
        std = args[1] if len(args) > 1 else kwargs.get("std", 1.0)
        return _random("ir::random_normal", shape, mean=float(mean), std=float(std))
    p = args[0] if args else kwargs.get("p", 0.5)
    return _random("ir::random_bernoulli", shape, p=float(p))
