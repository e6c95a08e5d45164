"""Resampling, distances and a few losses: interpolation (nearest, linear, cubic, antialiased)
and grid sampling with their backward ops, embedding bags, cdist/pdist, CTC and margin losses,
replicate padding, shrinkage, windowed unfold. Backward ops go through jax.vjp of the forward
rule where there is no short closed form, so the pair always agrees."""

from __future__ import annotations
