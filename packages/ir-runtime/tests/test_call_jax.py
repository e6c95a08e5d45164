"""JAX from torch: ``call_jax`` and ``jax_op`` on lazy tensors, against torch eager (values and
gradients), sharded, inside compiled steps and manual regions, with a Pallas kernel; the node's
name the same in another process; refusals by name."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.experimental import pallas as pl

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def lazy_leaf(t):
    return irt.to_lazy(t.detach()).requires_grad_()


def close(lazy, eager, tol=1e-5):
    np.testing.assert_allclose(irt.to_torch(lazy).numpy(), eager.detach().numpy(), tol, tol)


def tanh_head(x, w, *, scale):
    h = jnp.tanh(x["in"] @ w) * scale
    return {"h": h, "best": jnp.argmax(h, axis=-1)}


def test_a_jnp_routine_on_a_tree_of_tensors_gives_eagers_values_and_gradients():
    torch.manual_seed(0)
    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 3, requires_grad=True)
    lx, lw = lazy_leaf(x), lazy_leaf(w)
    out = irt.call_jax(tanh_head, {"in": lx}, lw, scale=0.5)
    want = torch.tanh(x @ w) * 0.5
    assert set(out) == {"h", "best"} and out["best"].dtype == torch.int64
    close(out["h"], want)
    assert torch.equal(irt.to_torch(out["best"]), want.argmax(-1))
    assert not out["best"].requires_grad
    (out["h"] ** 2).sum().backward()
    (want**2).sum().backward()
    close(lx.grad, x.grad)
    close(lw.grad, w.grad)


def test_a_jax_nn_op_as_a_torch_function():
    gelu = irt.jax_op(jax.nn.gelu, approximate=True)
    x = torch.randn(5, 7, requires_grad=True)
    lx = lazy_leaf(x)
    y = gelu(lx)
    want = torch.nn.functional.gelu(x, approximate="tanh")
    close(y, want)
    y.sum().backward()
    want.sum().backward()
    close(lx.grad, x.grad)
    assert gelu.__name__ == "gelu"


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.bfloat16])
def test_torchs_dtypes_stay_what_they_are(dtype):
    x = (torch.arange(12) - 5).reshape(3, 4).to(dtype)
    y = irt.call_jax(lambda a: jnp.cumsum(a, axis=1), irt.to_lazy(x))
    assert y.dtype == dtype
    assert torch.equal(irt.to_torch(y), torch.cumsum(x, dim=1).to(dtype))


def test_sharded_inputs_and_a_compiled_step_replay_with_eagers_values():
    torch.manual_seed(0)
    eager = torch.nn.Linear(8, 16)
    lazy = irt.to_lazy(torch.nn.Linear(8, 16))
    lazy.load_state_dict(eager.state_dict())
    irt.mark_sharding(lazy.weight, MESH, ("model", None))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, lazy)]
    swish = irt.jax_op(jax.nn.swish)

    @irt.compile_step
    def step(x):
        irt.mark_sharding(x, MESH, ("data", None))
        loss = swish(lazy(x)).square().mean()
        loss.backward()
        opts[1].step()
        opts[1].zero_grad()
        return loss

    irt.reset_metrics()
    for k in range(5):
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(k))
        loss = torch.nn.functional.silu(eager(x)).square().mean()
        loss.backward()
        opts[0].step()
        opts[0].zero_grad()
        close(step(x), loss)
    assert irt.metrics()["counters"]["StepReplay"] == 5 - 2
    close(lazy.weight, eager.weight)


def _gate_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * jax.nn.sigmoid(y_ref[...])


@jax.custom_vjp
def pallas_gate(x, y):
    """x * sigmoid(y) as a Pallas kernel (interpreted on the CPU), with its own vjp."""
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.pallas_call(_gate_kernel, out_shape=out, interpret=True)(x, y)


def _gate_fwd(x, y):
    return pallas_gate(x, y), (x, y)


def _gate_bwd(res, g):
    x, y = res
    s = jax.nn.sigmoid(y)
    return g * s, g * x * s * (1 - s)


pallas_gate.defvjp(_gate_fwd, _gate_bwd)


@pytest.mark.parametrize("where", ["gspmd", "shard_map"])
def test_a_pallas_kernel_with_its_custom_vjp(where):
    torch.manual_seed(0)
    x, y = torch.randn(8, 4, requires_grad=True), torch.randn(8, 4, requires_grad=True)
    lx, ly = lazy_leaf(x), lazy_leaf(y)
    for t in (lx, ly):
        irt.mark_sharding(t, MESH, ("data", "model"))
    if where == "gspmd":
        out = irt.call_jax(pallas_gate, lx, ly)
    else:  # per device's shards: jax's Pallas interpreter needs check_vma=False, as in jax
        spec = ("data", "model")
        region = irt.shard_map(
            lambda a, b: irt.call_jax(pallas_gate, a, b),
            MESH,
            (spec, spec),
            spec,
            check_vma=False,
        )
        out = region(lx, ly)
    want = x * torch.sigmoid(y)
    close(out, want)
    (out * out).sum().backward()
    (want * want).sum().backward()
    close(lx.grad, x.grad)
    close(ly.grad, y.grad)


SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import ir_runtime as irt

    irt.init(cpu_devices=8)
    sys.path.insert(0, {here!r})
    from test_call_jax import tanh_head

    x, w = irt.to_lazy(torch.ones(4, 6)), irt.to_lazy(torch.ones(6, 3))
    print(irt.call_jax(tanh_head, {{"in": x}}, w, scale=0.5)["h"]._ir.node.attrs["fn"])
    """
)


def test_the_node_names_the_function_the_same_in_another_process():
    x, w = irt.to_lazy(torch.ones(4, 6)), irt.to_lazy(torch.ones(6, 3))
    here = irt.call_jax(tanh_head, {"in": x}, w, scale=0.5)["h"]._ir.node.attrs["fn"]
    other = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(here=os.path.dirname(os.path.abspath(__file__)))],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.split()[-1]
    assert here == other
    again = irt.call_jax(tanh_head, {"in": x}, w, scale=0.25)["h"]._ir.node.attrs["fn"]
    assert again != here  # a static value is part of what the function computes


def test_a_function_is_traced_once_per_signature():
    traced = []

    def double(a):
        traced.append(a.shape)
        return a * 2

    x = irt.to_lazy(torch.ones(3))
    for _ in range(3):
        close(irt.call_jax(double, x), torch.full((3,), 2.0))
    irt.call_jax(double, irt.to_lazy(torch.ones(4)))
    assert traced.count((3,)) <= 2 and traced.count((4,)) >= 1  # (eval_shape, lowering)
    n = len(traced)
    irt.call_jax(double, x)
    assert len(traced) == n


def test_refusals_name_the_function_and_the_rule():
    x = irt.to_lazy(torch.ones(2, 3))

    def reads_a_value(a):
        return np.asarray(a) + 1

    with pytest.raises(TypeError, match=r"jax cannot trace .*reads_a_value on float32\[2, 3\]"):
        irt.call_jax(reads_a_value, x)
    with pytest.raises(TypeError, match=r"argument leaf 1 is a cpu tensor; pass lazy tensors"):
        irt.call_jax(jnp.add, x, torch.ones(2, 3))
    with pytest.raises(TypeError, match=r"static arguments .* must be hashable.*axes"):
        irt.call_jax(lambda a, axes: a.sum(axes), x, axes=[0])
    with pytest.raises(TypeError, match="takes a JAX function"):
        irt.call_jax(3, x)
