"""Linear algebra: factorizations, solves, inverses, determinants, eigen- and singular-value
decompositions, through jax.numpy.linalg and jax.scipy.linalg."""

from __future__ import annotations
