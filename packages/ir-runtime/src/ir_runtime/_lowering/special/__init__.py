"""Special functions: the gamma family, Bessel functions, zeta, orthogonal polynomials, error
functions, and float decomposition (frexp, nextafter, signbit), through jax.scipy.special.

Where torch's own algorithm gives values jax.scipy.special does not (its edge values, digamma
and polygamma at poles, zeta for q <= 0, the incomplete gamma functions, the Bessel and Airy
functions, the orthogonal polynomials), the rule is a vectorized port of torch's CPU kernel
(aten/src/ATen/native/Math.h, itself derived from the Cephes Math Library, 3-clause BSD, and
SciPy/Boost for igamma: see torch's NOTICE), so the lazy device gives eager's values. Loops
that run "until converged" are while loops over the whole tensor, each element frozen once its
own test passes, as torch's scalar loop would stop.

Computation is in the output dtype torch inferred (integer inputs are promoted), float16 and
bfloat16 in float32 (as torch's CPU kernels upcast them), then cast back.

The family's modules: ``gamma`` (lgamma to polygamma and mvlgamma, with the Hurwitz zeta),
``igamma``, ``erf`` (erfcx, log_ndtr), ``bessel`` (Bessel and Airy functions), ``polynomials``
(the orthogonal polynomials), ``unary`` (the rules of the unary functions, and zeta's),
``floats`` (frexp, nextafter, signbit, fmax, fmin, round with decimals); ``_common`` holds their
shared helpers and ``_tables`` torch's coefficient tables.
"""

from ir_runtime._lowering.special import (  # noqa: F401  (importing registers the rules)
    bessel,
    erf,
    floats,
    gamma,
    igamma,
    polynomials,
    unary,
)
