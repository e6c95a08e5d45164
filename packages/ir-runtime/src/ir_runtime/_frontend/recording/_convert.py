"""torch <-> ir-core and numpy: the lazy device, the dtype table, host tensors as arrays.

The one table of torch dtypes (ir-core names map to numpy dtypes in ``ir_runtime._dtypes``),
and the one way each direction converts a host tensor's memory: bfloat16, which numpy lacks,
goes as its bits (ml_dtypes' bfloat16 has torch's layout), never through float32.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from ir_core import Shape
from ir_runtime._errors import DTypeError, UnsupportedOpError

# The device the engine's tensors report: "lazy", or "xla" once ``ir_runtime.torch_xla.install()``
# names it so (``_install.name_device``). One engine under either name; a process uses one.
DEVICE = torch.device("lazy", 0)
# The dispatch key of each name: torch's factories (``torch.zeros(3, device=...)``) reach it.
DISPATCH_KEYS = {"lazy": "Lazy", "xla": "XLA"}

TORCH_TO_IR = {
    torch.bool: "bool",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.uint16: "uint16",
    torch.uint32: "uint32",
    torch.uint64: "uint64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
}
IR_TO_TORCH = {v: k for k, v in TORCH_TO_IR.items()}


def ir_dtype(dtype: torch.dtype) -> str:
    try:
        return TORCH_TO_IR[dtype]
    except KeyError:
        raise DTypeError(
            f"torch dtype {dtype} has no XLA equivalent here; use one of "
            f"{', '.join(str(d) for d in TORCH_TO_IR)}"
        ) from None


def shape_of(t: torch.Tensor) -> Shape:
    return Shape(ir_dtype(t.dtype), tuple(t.shape))


def movable(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached, its conjugate and negative bits applied, once it is known to be a tensor
    the lazy device can hold: dense, of a dtype XLA takes (else a clear error, before any copy)."""
    if x.layout != torch.strided:
        raise UnsupportedOpError(
            f"a {x.layout} tensor {tuple(x.shape)} cannot move to the lazy device: only dense "
            f"(strided) tensors can; use t.to_dense() first"
        )
    ir_dtype(x.dtype)
    return x.detach().resolve_conj().resolve_neg()


def host_numpy(x: torch.Tensor, copy: bool = True) -> np.ndarray:
    """A host tensor's value as numpy, bfloat16 kept. A copy unless ``copy=False`` (to read
    it only): jax places a numpy array on a CPU device without copying it, and the lazy value
    must not change when the host tensor is written afterwards."""
    host = movable(x).cpu()
    if host.dtype == torch.bfloat16:
        a = host.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        a = host.numpy()
    return np.array(a) if copy else a


def host_tensor(array: np.ndarray, dtype: str) -> torch.Tensor:
    """A CPU torch tensor of ir-core dtype ``dtype`` holding a copy of ``array``."""
    a = np.array(array)  # writable and owned: torch.from_numpy shares its memory
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a).to(IR_TO_TORCH[dtype])
