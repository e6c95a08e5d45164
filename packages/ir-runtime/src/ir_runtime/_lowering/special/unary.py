"""The rules of the unary special functions, one table (jax.scipy.special where it gives torch's
values, else the ports of gamma, erf and bessel), and of zeta's three overloads.
"""

from __future__ import annotations

import jax.numpy as jnp
import jax.scipy.special as jss

from ir_runtime._lowering._registry import register
from ir_runtime._lowering.special._common import float_rule
from ir_runtime._lowering.special.bessel import (
    _modified_bessel_i0,
    airy_ai,
    bessel_j0,
    bessel_j1,
    bessel_y0,
    bessel_y1,
    modified_bessel_i1,
    modified_k,
    spherical_bessel_j0,
)
from ir_runtime._lowering.special.erf import _erfcx, _log_ndtr
from ir_runtime._lowering.special.gamma import _digamma, _lgamma, zeta_acc

# -- unary functions -----------------------------------------------------------------------

_UNARY = {
    "lgamma": _lgamma,
    "digamma": _digamma,
    "erfc": jss.erfc,
    "i0": jss.i0,
    "special_i0e": jss.i0e,
    "special_i1": jss.i1,
    "special_i1e": jss.i1e,
    "special_erfcx": _erfcx,
    "special_ndtri": jss.ndtri,
    "special_log_ndtr": _log_ndtr,
    "special_airy_ai": airy_ai,
    "special_bessel_j0": bessel_j0,
    "special_bessel_j1": bessel_j1,
    "special_bessel_y0": bessel_y0,
    "special_bessel_y1": bessel_y1,
    "special_modified_bessel_i0": _modified_bessel_i0,
    "special_modified_bessel_i1": modified_bessel_i1,
    "special_modified_bessel_k0": lambda x: modified_k(x, 0, scaled=False),
    "special_modified_bessel_k1": lambda x: modified_k(x, 1, scaled=False),
    "special_scaled_modified_bessel_k0": lambda x: modified_k(x, 0, scaled=True),
    "special_scaled_modified_bessel_k1": lambda x: modified_k(x, 1, scaled=True),
    "special_spherical_bessel_j0": spherical_bessel_j0,
}
for _name, _fn in _UNARY.items():
    register(f"aten::{_name}.default")(float_rule(_fn))


# -- zeta ----------------------------------------------------------------------------------


@register("aten::special_zeta.default")
def _zeta_tt(node, x, q):
    return float_rule(zeta_acc, arity=2)(node, x, q)


@register("aten::special_zeta.self_scalar")
def _zeta_st(node, q):
    return float_rule(zeta_acc, arity=2)(node, jnp.asarray(node.attrs["self"]), q)


@register("aten::special_zeta.other_scalar")
def _zeta_ts(node, x):
    return float_rule(zeta_acc, arity=2)(node, x, jnp.asarray(node.attrs["other"]))
