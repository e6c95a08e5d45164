"""layer_norm under autograd is recorded as the ops it is made of (its gradient autograd's of
them, as jax's autodiff gives it), without autograd as the one fused node: values and
gradients against eager with non-default arguments, and what each records."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ir_runtime as irt


def _run(x, shape, w, b, eps, dtype):
    """Values and the gradients of x, w and b (those given) under eager and lazy."""
    g = torch.Generator().manual_seed(3)
    out = []
    for lazy in (False, True):
        leaves = [t if t is None else t.detach().clone() for t in (x, w, b)]
        leaves = [t if t is None else (irt.to_lazy(t) if lazy else t) for t in leaves]
        leaves = [t if t is None else t.requires_grad_() for t in leaves]
        y = F.layer_norm(leaves[0], shape, leaves[1], leaves[2], eps)
        cot = torch.randn(y.shape, generator=g, dtype=torch.float32).to(dtype)
        if lazy:
            cot = irt.to_lazy(cot)
        grads = torch.autograd.grad(y, [t for t in leaves if t is not None], cot)
        got = [y, *grads]
        out.append([(irt.to_torch(t) if lazy else t).detach().float().numpy() for t in got])
        g = torch.Generator().manual_seed(3)
    return out


@pytest.mark.parametrize(
    "xshape, shape, affine, eps",
    [
        ((4, 7, 16), (16,), True, 1e-12),
        ((4, 7, 16), (7, 16), True, 1e-5),
        ((16,), (16,), False, 0.5),
        ((3, 5), (5,), True, 1e-6),
    ],
)
def test_values_and_gradients_equal_eager(xshape, shape, affine, eps):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(xshape, generator=g) * 3 + 1
    w = torch.randn(shape, generator=g) if affine else None
    b = torch.randn(shape, generator=g) if affine else None
    want, got = _run(x, shape, w, b, eps, torch.float32)
    for e, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_bfloat16_input_with_float32_parameters_is_computed_in_float32_as_eager():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(8, 64, generator=g) * 4).bfloat16()
    w, b = torch.randn(64, generator=g), torch.randn(64, generator=g)
    want, got = _run(x, (64,), w, b, 1e-5, torch.bfloat16)
    np.testing.assert_allclose(got[0], want[0], rtol=2**-7, atol=2**-7)  # one bfloat16 step
    for e, g in zip(want[1:], got[1:], strict=True):
        np.testing.assert_allclose(g, e, rtol=2e-2, atol=2e-2)


def test_autograd_records_the_ops_and_no_grad_the_fused_node():
    x = irt.to_lazy(torch.randn(4, 8)).requires_grad_()
    w = irt.to_lazy(torch.ones(8)).requires_grad_()
    y = F.layer_norm(x, (8,), w, None, 1e-5)
    (gx,) = torch.autograd.grad(y.sum(), [x])
    text = irt.dump([y, gx])
    assert "native_layer_norm" not in text and "aten::rsqrt" in text
    with torch.no_grad():
        z = F.layer_norm(x, (8,), w, None, 1e-5)
    assert "aten::native_layer_norm" in irt.dump(z)
    np.testing.assert_allclose(irt.to_torch(z).numpy(), irt.to_torch(y).detach().numpy())


def test_a_shape_that_does_not_end_the_input_is_torchs_error():
    x = irt.to_lazy(torch.randn(4, 8)).requires_grad_()
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(x, (4,))
