"""Every product the rules lower asks XLA for its operands' own precision.

XLA's default precision for a float32 product depends on the backend: on a TPU it is one
bfloat16 pass (about three digits), on a GPU TF32 where the hardware has it; only the CPU
computes it in float32 whatever the program says. torch's float32 products are float32, so
every ``dot_general`` and ``convolution`` a rule emits must carry ``HIGHEST``. XLA on this CPU
ignores the setting, so the check reads the lowered program: every op of torch's OpInfo suite
whose program has a product, its first float32 sample, values and input gradients.
"""

from __future__ import annotations

import re

import opinfo
import pytest
import torch

import ir_runtime as irt

PRODUCT = re.compile(r"stablehlo\.(dot_general|convolution)\b.*")
# How the printer spells both operands' precision: a dot's, a convolution's.
HIGHEST = (
    "precision = [HIGHEST, HIGHEST]",
    "precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]",
)
OPS = {opinfo.op_id(op): op for op in opinfo.population()}


def _tensors(x) -> list:
    flat, _ = torch.utils._pytree.tree_flatten(x)
    return [t for t in flat if isinstance(t, irt.LazyTensor)]


def _products(op) -> list[str] | None:
    """The products in the program of ``op``'s first float32 sample and its input gradients;
    None where the lazy device refuses the op (``test_opinfo`` lists those)."""
    samples = opinfo.samples_of(op, 1, requires_grad=op.supports_autograd)
    if not samples:
        return []
    try:
        run = opinfo._record(op, samples[0], with_grad=op.supports_autograd)
        roots = _tensors(run.got) + _tensors(run.grads or [])
        text = irt.dump(roots, "stablehlo") if roots else ""
    except Exception:
        return None
    return [m.group(0) for m in PRODUCT.finditer(text)]


@pytest.mark.parametrize("name", OPS)
def test_products_ask_for_highest_precision(name):
    found = _products(OPS[name]) or []
    low = [p for p in found if not any(h in p for h in HIGHEST)]
    assert not low, f"{name}: products below float32 precision: {low[:3]}"


@pytest.mark.parametrize(
    "name",
    [
        "matmul",
        "addmm",
        "bmm",
        "tensordot",
        "nn.functional.linear",
        "linalg.solve",
        "nn.functional.conv2d",
        "nn.functional.conv_transpose2d",
        "nn.functional.scaled_dot_product_attention",
    ],
)
def test_the_check_sees_each_family_of_products(name):
    """The check above reads products where the rules emit them (so it can fail)."""
    assert _products(OPS[name]), f"no product found in {name}'s program"
