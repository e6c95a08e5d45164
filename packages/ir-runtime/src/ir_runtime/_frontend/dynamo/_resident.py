"""Where a plain-tensor call's arrays live between torch and the device.

A call's inputs become device arrays and its results torch tensors (``to_device``,
``to_torch``); on a CPU both are DLPack views of the same memory, on an accelerator copies,
started together so that their transfers overlap. What a forward saves for its backward never
crosses at all: it is handed to torch as a ``Resident``, a tensor that holds the device array,
and the backward's program takes that array as it is. Any other use of a ``Resident`` reads
it to the host once, so it behaves as the CPU tensor it stands for.
"""

from __future__ import annotations

import jax
import numpy as np
import torch
from torch.utils._pytree import tree_map

from ir_runtime import _metrics
from ir_runtime._dtypes import name_of
from ir_runtime._frontend.recording._convert import IR_TO_TORCH, host_numpy, host_tensor

_VIEWS = None  # (detach and alias: a new Resident of the same array)


class Resident(torch.Tensor):
    """A program's result that stays on the device: a CPU tensor of its shape and dtype to
    torch, its array to the next program that reads it."""

    array: jax.Array | None  # None once the host copy was written in place (it is the value)
    host: torch.Tensor | None  # the host copy, read at the first use that needs it

    @staticmethod
    def __new__(cls, array, host=None):
        t = torch.Tensor._make_wrapper_subclass(
            cls, array.shape, dtype=IR_TO_TORCH[name_of(array.dtype)], device="cpu"
        )
        t.array, t.host = array, host
        return t

    def read(self) -> torch.Tensor:
        if self.host is None:
            self.host = _host(self.array)
            _metrics.count("DynamoResidentReads")
        return self.host

    def __repr__(self, *, tensor_contents=None):
        return f"Resident({self.read()!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        global _VIEWS
        if _VIEWS is None:
            _VIEWS = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)
        kwargs = kwargs or {}
        if func in _VIEWS and type(args[0]) is Resident and args[0].array is not None:
            return Resident(args[0].array, args[0].host)
        out = func(*tree_map(_read, args), **tree_map(_read, kwargs))
        if func._schema.is_mutable:  # (a write lands on the host copy: that is the value now)
            for a in (*args, *kwargs.values()):
                if type(a) is Resident:
                    a.array = None
        return out


def _read(x):
    return x.read() if type(x) is Resident else x


def _host(a) -> torch.Tensor:
    """A device array as a CPU tensor: its memory through DLPack where it is on the CPU, else a
    copy."""
    try:
        return torch.from_dlpack(a)
    except Exception:  # (an accelerator's array, or a dtype DLPack does not carry)
        return host_tensor(np.asarray(a), name_of(a.dtype))


def to_torch(arrays: list, resident=frozenset()) -> list:
    """The program's results as torch tensors; the positions in ``resident`` as ``Resident``.
    Copies to the host are all started before the first is waited for."""
    for k, a in enumerate(arrays):
        if k not in resident and not _on_cpu(a):
            a.copy_to_host_async()
    return [Resident(a) if k in resident else _host(a) for k, a in enumerate(arrays)]


def _on_cpu(a) -> bool:
    try:
        return all(d.platform == "cpu" for d in a.devices())
    except Exception:
        return False


def device_array(t: torch.Tensor, sharding):
    """``t``'s array if it is a ``Resident`` still holding one (placed on ``sharding``), else
    None."""
    if type(t) is not Resident or t.array is None:
        return None
    a = t.array
    return a if a.sharding == sharding else jax.device_put(a, sharding)


def host_array(src: torch.Tensor):
    """A contiguous CPU tensor's memory as an array jax can place: through DLPack (no copy),
    or numpy where DLPack would leave strides ambiguous or lacks the dtype."""
    if src.dim() < 2 or 1 not in src.shape:
        # (a dim of size 1 leaves DLPack's strides ambiguous, and jax may read another
        # layout than the one the program was compiled for: those go through numpy, which
        # jax also places on a CPU device without a copy)
        try:
            return jax.dlpack.from_dlpack(src, copy=None)
        except Exception:  # (a dtype DLPack does not carry)
            pass
    return host_numpy(src, copy=False)
