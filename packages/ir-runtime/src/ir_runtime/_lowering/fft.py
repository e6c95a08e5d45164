"""Complex numbers and Fourier transforms: real/imag views, conj, angle, and _fft_c2c,
_fft_r2c, _fft_c2r.

The lazy device keeps no conjugate or negative bit: ``_conj`` (what ``Tensor.conj()`` calls on
a complex tensor) records the conjugated value, so ``is_conj()`` is False on the lazy device
and ``resolve_conj`` has nothing to do. ``real``/``imag`` are torch's own composites
(``view_as_real`` and ``select``).

torch's FFT primitives take ``normalization`` as its ``fft_norm_mode``: 0 none, 1 by
1/sqrt(n), 2 by 1/n, n the product of the signal sizes (the output's for c2r). Every transform
here is the unnormalized one (``exp(-2 pi i ...)`` forward, ``exp(+2 pi i ...)`` backward),
then scaled.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import cast, norm_dim, out_dims, out_dtype, register

# -- views and conjugation -----------------------------------------------------------------


@register("aten::view_as_real.default")
def _view_as_real(node, z):
    if not jnp.iscomplexobj(z):
        raise ValueError(f"view_as_real takes a complex tensor, got {z.dtype}")
    return cast(jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1), out_dtype(node))


@register("aten::view_as_complex.default")
def _view_as_complex(node, x):
    if x.ndim == 0 or x.shape[-1] != 2:
        raise ValueError(f"view_as_complex takes a tensor whose last dim is 2, got {x.shape}")
    return cast(lax.complex(x[..., 0], x[..., 1]), out_dtype(node))


# conj_physical is _conj_physical's composite; resolve_conj and resolve_neg never reach the
# device (no tensor here carries the bits: torch returns the tensor itself).
@register("aten::_conj.default", "aten::_conj_physical.default")
def _conj(node, z):
    return cast(jnp.conj(z), out_dtype(node))


def _real_parts(node, *xs):
    """``xs`` in the real precision of the complex output, broadcast to its shape."""
    part = np.float32 if out_dtype(node) == np.complex64 else np.float64
    return [jnp.broadcast_to(cast(x, part), out_dims(node)) for x in xs]


@register("aten::complex.default")
def _complex(node, re, im):
    return lax.complex(*_real_parts(node, re, im))


@register("aten::polar.default")
def _polar(node, r, theta):
    r, theta = _real_parts(node, r, theta)
    return lax.complex(r * jnp.cos(theta), r * jnp.sin(theta))


@register("aten::angle.default")
def _angle(node, x):
    dt = out_dtype(node)
    if jnp.iscomplexobj(x):
        return cast(jnp.arctan2(jnp.imag(x), jnp.real(x)), dt)
    x = cast(x, dt)
    # torch: pi for negative numbers, 0 otherwise (-0.0 too), NaN kept.
    angle = jnp.where(x < 0, jnp.asarray(math.pi, dt), jnp.zeros((), dt))
    return jnp.where(jnp.isnan(x), x, angle)


# -- Fourier transforms --------------------------------------------------------------------


def _dims(node, rank):
    return [norm_dim(d, rank) for d in node.attrs["dim"]]


def _normalize(y, n: int, normalization: int):
    if normalization == 0:
        return y
    if normalization == 1:
        return y * jnp.asarray(1.0 / math.sqrt(n), jnp.real(y).dtype)
    if normalization == 2:
        return y * jnp.asarray(1.0 / n, jnp.real(y).dtype)
    raise ValueError(
        f"FFT normalization must be 0, 1 or 2 (torch's fft_norm_mode), got {normalization}"
    )


def _signal_size(shape, dims) -> int:
    return int(np.prod([shape[d] for d in dims], dtype=np.int64)) if dims else 1


@register("aten::_fft_c2c.default")
def _fft_c2c(node, z):
    dt = out_dtype(node)
    z = cast(z, dt)
    dims = _dims(node, z.ndim)
    if not dims:
        return z
    if node.attrs["forward"]:
        y = jnp.fft.fftn(z, axes=dims)
    else:  # the unnormalized inverse: ifft's 1/n undone
        y = jnp.fft.ifftn(z, axes=dims, norm="forward")
    return cast(_normalize(y, _signal_size(z.shape, dims), node.attrs["normalization"]), dt)


@register("aten::_fft_r2c.default")
def _fft_r2c(node, x):
    dt = out_dtype(node)
    real = np.float32 if dt == np.complex64 else np.float64
    x = cast(x, real)
    dims = _dims(node, x.ndim)
    if not dims:
        return cast(x, dt)
    if node.attrs["onesided"]:
        y = jnp.fft.rfftn(x, axes=dims)
    else:
        y = jnp.fft.fftn(cast(x, dt), axes=dims)
    return cast(_normalize(y, _signal_size(x.shape, dims), node.attrs["normalization"]), dt)


@register("aten::_fft_c2r.default")
def _fft_c2r(node, z):
    dt = out_dtype(node)
    z = cast(z, np.complex64 if dt == np.float32 else np.complex128)
    dims = _dims(node, z.ndim)
    shape = out_dims(node)
    sizes = [shape[d] for d in dims]
    # The unnormalized inverse (irfft's 1/n undone); the last dim is the Hermitian one.
    y = jnp.fft.irfftn(z, s=sizes, axes=dims, norm="forward")
    return cast(_normalize(y, _signal_size(shape, dims), node.attrs["normalization"]), dt)


# -- framing (stft) ------------------------------------------------------------------------


# torch.stft frames its signal with as_strided: its rule is in shape.py (the lead's).
