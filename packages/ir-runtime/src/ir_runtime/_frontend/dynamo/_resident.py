"""Where a plain-tensor call's arrays live between torch and the device.

A call's inputs become device arrays and its results torch tensors (``host_array``,
``to_torch``); on a CPU both are DLPack views of the same memory, on an accelerator copies,
started together so that their transfers overlap. What a forward saves for its backward never
crosses at all: it is handed to torch as a ``Resident``, a tensor that holds the device array,
and the backward's program takes that array as it is. Any other use of a ``Resident`` reads
it to the host once, so it behaves as the CPU tensor it stands for.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map

from ir_runtime import _metrics
from ir_runtime._dtypes import name_of
from ir_runtime._execute import same_sharding
from ir_runtime._frontend.recording._convert import IR_TO_TORCH, host_numpy, host_tensor

# Ops that give a new Resident of the same data.
_VIEWS = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


class _Cell:
    """The data a Resident and its aliases (``detach``, ``alias``) share: the device array,
    and the host copy once read; a write makes the host copy the value (``array`` None)."""

    __slots__ = ("array", "host", "lock")

    def __init__(self, array):
        self.array, self.host, self.lock = array, None, threading.Lock()


class Resident(torch.Tensor):
    """A program's result that stays on the device: a CPU tensor of its shape and dtype to
    torch, its array to the next program that reads it."""

    cell: _Cell

    @staticmethod
    def __new__(cls, array, cell=None):
        t = torch.Tensor._make_wrapper_subclass(
            cls, array.shape, dtype=IR_TO_TORCH[name_of(array.dtype)], device="cpu"
        )
        t.cell = cell if cell is not None else _Cell(array)
        return t

    @property
    def array(self):
        """The device array, or None once the host copy was written (it is the value)."""
        return self.cell.array

    def read(self) -> torch.Tensor:
        """The value as a plain CPU tensor (read from the device once)."""
        cell = self.cell
        with cell.lock:
            if cell.host is None:
                cell.host = _host(cell.array)
                _metrics.count("DynamoResidentReads")
            return cell.host

    # What torch refuses for a tensor subclass, answered as the CPU tensor it stands for.
    def numpy(self, *, force: bool = False):
        return self.read().numpy(force=force)

    def tolist(self):
        return self.read().tolist()

    def data_ptr(self) -> int:
        return self.read().data_ptr()

    def __deepcopy__(self, memo):
        return self.read().clone()

    def __reduce_ex__(self, protocol):
        return self.read().__reduce_ex__(protocol)

    def __repr__(self, *, tensor_contents=None):
        return repr(self.read())

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _VIEWS and type(args[0]) is Resident and args[0].array is not None:
            return Resident(args[0].array, args[0].cell)
        written = _written(func, args, kwargs)
        if written and (
            torch.Tag.inplace_view in func.tags or func.__name__.split(".")[0] in _RESHAPING
        ):
            raise RuntimeError(
                f"{func} would change the shape of a tensor that holds a program's result on "
                f"the device (what a compiled forward saved); use the out-of-place op"
            )
        out = func(*tree_map(plain, args), **tree_map(plain, kwargs))
        for r in written:  # (the write landed on the host copy: that is the value now)
            r.cell.array = None
        return out


_RESHAPING = frozenset(("resize_", "resize_as_", "set_", "as_strided_"))


def _written(func, args, kwargs) -> list:
    """The Residents among the arguments ``func`` writes (``Tensor(a!)``, also in lists)."""
    if not func._schema.is_mutable:
        return []
    out = []
    for k, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[k] if k < len(args) else kwargs.get(arg.name)
        for x in tree_flatten(value)[0]:
            if type(x) is Resident:
                out.append(x)
    return out


def plain(x):
    """``x``, or a Resident's value as a plain CPU tensor (what torch hands a user)."""
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
    if type(t) is not Resident:
        return None
    a = t.array
    if a is None:
        return None
    return a if same_sharding(a.sharding, sharding) else jax.device_put(a, sharding)


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
