"""torch.autocast on the lazy device, against eager CPU autocast (torch's own policy)."""

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ir_runtime as irt

BF16_TOLERANCE = {"rtol": 3e-2, "atol": 3e-3}  # a few bfloat16 roundings apart


def both(x):
    return x, irt.to_lazy(x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_each_op_computes_in_the_dtype_eager_autocast_gives_it(dtype):
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(4, 8, generator=g), torch.randn(6, 8, generator=g)
    target = torch.randint(0, 6, (4,), generator=g)
    results = []
    for dev, (x, wt, t) in (("cpu", (a, w, target)), ("lazy", map(irt.to_lazy, (a, w, target)))):
        with torch.autocast(dev, dtype=dtype):
            y = F.linear(x, wt)  # lower precision
            z = torch.relu(y)  # not listed: the dtype it is given
            m = x @ wt.T  # lower precision, as an operator
            c = torch.cat([y, x[:, :6]])  # promoted to the widest
            loss = F.cross_entropy(y, t)  # float32
            p = torch.prod(x, 1)  # float32
            with torch.autocast(dev, enabled=False):
                off = x @ wt.T  # off inside: float32
        results.append([y, z, m, c, loss, p, off])
    for e, lz in zip(*results, strict=True):
        assert lz.dtype == e.dtype
        np.testing.assert_allclose(
            irt.to_torch(lz).float().numpy(), e.float().numpy(), **BF16_TOLERANCE
        )


def test_a_training_step_keeps_float32_weights_and_gradients():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    lazy = irt.to_lazy(copy.deepcopy(eager))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    losses = []
    for model, dev, xs, ys in ((eager, "cpu", x, y), (lazy, "lazy", *map(irt.to_lazy, (x, y)))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(xs), ys)
        loss.backward()
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())
        opt.step()
        losses.append(loss)
    irt.mark_step()
    assert losses[1].dtype == torch.float32
    np.testing.assert_allclose(irt.to_torch(losses[1]).item(), losses[0].item(), rtol=1e-2)
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        assert p_l.dtype == torch.float32
        np.testing.assert_allclose(
            irt.to_torch(p_l.grad).numpy(), p_e.grad.numpy(), **BF16_TOLERANCE
        )


def test_as_a_decorator_and_off_by_default_outside():
    @torch.autocast("lazy")
    def f(a, b):
        return a @ b

    a = irt.to_lazy(torch.ones(2, 2))
    assert f(a, a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32


def test_host_tensors_inside_are_left_to_cpu_autocast():
    with torch.autocast("lazy", dtype=torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast(device_type="lazy", enabled=False):  # changes nothing on the host
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.float8_e4m3fn])
def test_a_dtype_autocast_cannot_take_is_refused_by_name(dtype):
    a = irt.to_lazy(torch.ones(2, 2))
    with pytest.raises(
        irt.DTypeError, match=r"autocast computes in torch.bfloat16 or torch.float16"
    ):
        with torch.autocast("lazy", dtype=dtype):
            pass
    assert (a @ a).dtype == torch.float32  # nothing left switched on


def test_cpu_autocast_around_lazy_ops_warns_once_and_names_the_lazy_one(monkeypatch):
    """torch's autocast is per device: ``autocast("cpu")`` changes nothing on the lazy device.
    Said once, naming ``autocast("lazy")``; CPU tensors inside are still cast."""
    from ir_runtime._frontend.recording import _dispatch

    monkeypatch.setattr(_dispatch, "_CPU_AUTOCAST_WARNED", [False])
    m = irt.to_lazy(torch.nn.Linear(4, 3))
    x = irt.to_lazy(torch.ones(2, 4))
    with pytest.warns(irt.AutocastWarning, match=r"torch.autocast\('lazy', dtype"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert y.dtype == torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(x)  # said once
        with torch.autocast("lazy", dtype=torch.bfloat16):
            assert m(x).dtype == torch.bfloat16
    assert _dispatch.CPU_AUTOCAST == [0]
