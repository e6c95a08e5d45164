"""What the family's rules share: torch's opmath dtype, and the check for a floating input."""

from __future__ import annotations

import jax.numpy as jnp


def compute_dtype(dtype):
    """torch's opmath type: float64 stays, every other float computes in float32."""
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def require_float(x, op: str):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{op}: input of dtype {x.dtype} is not supported (floating only)")
