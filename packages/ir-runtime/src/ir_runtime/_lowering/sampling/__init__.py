"""Resampling, distances and a few losses: interpolation (nearest, nearest-exact, linear, cubic,
antialiased), grid sampling, embedding bags, cdist/pdist, ``_trilinear`` (bilinear layers), CTC
and margin losses, replicate padding, hard/soft shrinkage and ``Tensor.unfold``, with their
backward ops.

Resampling indices and weights depend only on shapes and Python-float scales, so they are
computed at trace time with NumPy, in the float type torch's CPU kernels use (float32 for
float32 and narrower inputs), following those kernels step by step. Backward ops that are the
transpose of a linear forward go through ``jax.vjp`` of the forward rule, so the pair always
agrees; where torch's backward is not the derivative of its forward (cdist's inf-norm, CTC) it
is written out as torch computes it.

The family's modules: ``interpolate``, ``grid_sample``, ``embedding_bag``, ``distances`` (cdist,
pdist, ``_trilinear``), ``losses`` (CTC, margin losses), ``misc`` (replicate padding, shrinkage,
``Tensor.unfold``); ``_common`` holds their shared helpers.
"""

from ir_runtime._lowering.sampling import (  # noqa: F401  (importing registers the rules)
    distances,
    embedding_bag,
    grid_sample,
    interpolate,
    losses,
    misc,
)
