"""Special functions: the gamma family, Bessel functions, zeta, orthogonal polynomials, error
functions, and float decomposition (frexp, nextafter, signbit), through jax.scipy.special."""

from __future__ import annotations
