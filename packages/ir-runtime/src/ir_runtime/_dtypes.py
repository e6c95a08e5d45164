"""ir-core dtype names <-> numpy/jax dtypes. torch's dtypes, not jax's defaults: int64 stays
int64, which needs jax's x64 mode (``enable_x64``)."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np

from ir_runtime._errors import DTypeError

_BY_NAME = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "complex64": np.dtype(np.complex64),
    "complex128": np.dtype(np.complex128),
}
_BY_DTYPE = {v: k for k, v in _BY_NAME.items()}


def to_numpy_dtype(name: str) -> np.dtype:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise DTypeError(
            f"dtype {name!r} has no XLA equivalent here; use one of {sorted(_BY_NAME)}"
        ) from None


def name_of(dtype) -> str:
    try:
        return _BY_DTYPE[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise DTypeError(
            f"dtype {dtype!r} has no ir-core name; use one of {sorted(_BY_NAME)}"
        ) from None


X64 = [False]


def enable_x64() -> None:
    """Turn on jax's x64 mode, once: torch's int64 and float64 stay 64-bit. ``init``, the first
    placement and the first compile call it; importing ir_runtime changes no jax setting."""
    if not X64[0]:
        jax.config.update("jax_enable_x64", True)
        X64[0] = True
