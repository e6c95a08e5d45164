"""torch.compile(backend="ir_runtime") on plain tensors, against torch eager: training (values,
gradients, AdamW steps), inference, dropout drawing afresh per call, BatchNorm's running
statistics (an input mutation AOTAutograd hands back), an op the lazy device cannot run split
out to run eagerly (and refused under fullgraph=True), compile counts, modes and options, and
the backend found by name with nothing imported first."""

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch

import ir_runtime as irt


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    irt.CACHE.clear()  # (compile counts are the test's own)
    yield
    torch._dynamo.reset()


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.GELU(),
        torch.nn.LayerNorm(32, eps=1e-12),
        torch.nn.Linear(32, 4),
    )


def data(k, shape=(8, 16)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(k))


def counters():
    return irt.metrics()["counters"]


def test_training_steps_equal_eager_and_compile_once():
    eager = mlp()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="ir_runtime", dynamic=False)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2, weight_decay=0.1)
    opt_c = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    irt.reset_metrics()
    for k in range(20):
        x = data(k)
        loss_e = eager(x).square().mean()
        loss_e.backward()
        loss_c = compiled(x).square().mean()
        loss_c.backward()
        if k == 0:
            for pe, pc in zip(eager.parameters(), model.parameters(), strict=True):
                np.testing.assert_allclose(pc.grad.numpy(), pe.grad.numpy(), rtol=1e-4, atol=1e-6)
        opt_e.step()
        opt_e.zero_grad()
        opt_c.step()
        opt_c.zero_grad()
        np.testing.assert_allclose(loss_c.item(), loss_e.item(), rtol=1e-4)
    c = counters()
    assert c["DynamoGraphs"] == 1 and c["DynamoPrograms"] == 2  # a forward and a backward
    assert c["CompileCount"] == 2  # compiled once, in the first step, for 20 steps
    for pe, pc in zip(eager.parameters(), model.parameters(), strict=True):
        np.testing.assert_allclose(pc.detach().numpy(), pe.detach().numpy(), rtol=1e-3, atol=1e-5)


def test_inference_and_a_new_batch_shape():
    eager = mlp()
    compiled = torch.compile(copy.deepcopy(eager), backend="ir_runtime", dynamic=False)
    irt.reset_metrics()
    with torch.no_grad():
        for shape in ((8, 16), (8, 16), (3, 16), (1, 16)):
            x = data(1, shape)
            np.testing.assert_allclose(compiled(x).numpy(), eager(x).numpy(), rtol=1e-5, atol=1e-6)
    assert counters()["DynamoPrograms"] == 3  # one per shape, the repeat none


def test_dropout_draws_afresh_each_call_and_manual_seed_reproduces():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5)).train()
    compiled = torch.compile(model, backend="ir_runtime", dynamic=False)
    x = torch.ones(4, 64)
    torch.manual_seed(5)
    a, b = compiled(x).detach(), compiled(x).detach()
    assert not torch.equal(a == 0, b == 0)  # two masks
    for mask in (a == 0, b == 0):
        assert 0.3 < mask.float().mean().item() < 0.7
    kept = a != 0
    y = model[0](x).detach()
    np.testing.assert_allclose(a[kept].numpy(), (2 * y)[kept].numpy(), rtol=1e-5)
    torch.manual_seed(5)
    np.testing.assert_array_equal(compiled(x).detach().numpy(), a.numpy())


def test_batch_norm_running_statistics_are_updated_as_eager():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.BatchNorm1d(6, momentum=0.3))
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="ir_runtime", dynamic=False)
    for k in range(3):
        x = data(k, (10, 8))
        eager(x).sum().backward()
        compiled(x).sum().backward()
    bn_e, bn_c = eager[1], model[1]
    np.testing.assert_allclose(bn_c.running_mean.numpy(), bn_e.running_mean.numpy(), rtol=1e-4)
    np.testing.assert_allclose(bn_c.running_var.numpy(), bn_e.running_var.numpy(), rtol=1e-4)
    assert bn_c.num_batches_tracked.item() == 3
    eager.eval(), model.eval()
    with torch.no_grad():
        x = data(9, (4, 8))
        np.testing.assert_allclose(compiled(x).numpy(), eager(x).numpy(), rtol=1e-5, atol=1e-6)


@torch.library.custom_op("irt_test::cpu_cube", mutates_args=(), device_types="cpu")
def cpu_cube(x: torch.Tensor) -> torch.Tensor:
    return x * x * x


@cpu_cube.register_fake
def _(x):
    return torch.empty_like(x)


cpu_cube.register_autograd(
    lambda ctx, grad: grad * 3 * ctx.saved_tensors[0] ** 2,
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]),
)


class WithCpuOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.b(cpu_cube(torch.tanh(self.a(x))))


def test_an_op_the_device_cannot_run_runs_eagerly_between_programs():
    eager = WithCpuOp()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="ir_runtime", dynamic=False)
    irt.reset_metrics()
    x = data(2, (5, 8))
    eager(x).square().sum().backward()
    compiled(x).square().sum().backward()
    for pe, pc in zip(eager.parameters(), model.parameters(), strict=True):
        np.testing.assert_allclose(pc.grad.numpy(), pe.grad.numpy(), rtol=1e-4, atol=1e-6)
    eager_ops = {k: v for k, v in counters().items() if k.startswith("DynamoEagerOps::")}
    assert eager_ops and all("cpu_cube" in k for k in eager_ops), eager_ops
    # The forward: a program on each side of it; the backward (its gradient is ordinary ops)
    # one program.
    assert counters()["DynamoPrograms"] == 3


def test_under_fullgraph_or_without_partition_such_an_op_is_an_error_naming_it():
    for kwargs in ({"fullgraph": True}, {"options": {"partition": False}}):
        torch._dynamo.reset()
        compiled = torch.compile(WithCpuOp(), backend="ir_runtime", dynamic=False, **kwargs)
        with pytest.raises(Exception, match=r"irt_test.cpu_cube.* cannot run on the lazy device"):
            compiled(data(2, (5, 8)))


def test_modes_are_taken():
    x = data(3)
    want = mlp()(x).detach().numpy()
    for mode in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        got = torch.compile(mlp(), backend="ir_runtime", mode=mode)(x).detach().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# In a process of its own: after Dynamo has failed a compile (here, the backend refusing a
# mode), later compile_step steps in the same process donate fewer buffers (they trace once
# more; their values are right). Not understood yet; kept out of the other tests' way.
REFUSALS = """
import pytest, torch
import ir_runtime
x = torch.randn(8, 16)
m = torch.nn.Linear(16, 4)
for kwargs, message in (
    ({"mode": "fastest"}, "mode 'fastest' is not one of"),
    ({"options": {"donate": True}}, "unknown option 'donate'"),
    ({"options": {"max_programs": 0}}, "max_programs must be an int of at least 1, got 0"),
    ({"options": {"partition": 1}}, "partition must be a bool, got 1"),
):
    torch._dynamo.reset()
    with pytest.raises(Exception, match=message):
        torch.compile(m, backend="ir_runtime", **kwargs)(x)
"""


def test_unknown_modes_and_options_are_refused_by_name():
    subprocess.run([sys.executable, "-c", REFUSALS], check=True, timeout=300)


def test_the_backend_is_found_by_name_with_nothing_imported():
    code = (
        "import torch\n"
        "f = torch.compile(lambda x: torch.sin(x) * 2, backend='ir_runtime')\n"
        "x = torch.linspace(-3, 3, 7)\n"
        "assert torch.allclose(f(x), torch.sin(x) * 2, atol=1e-6)\n"
        "import sys; assert 'ir_runtime' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.parametrize(
    "kwargs, heads",
    [
        ({"is_causal": True}, (4, 4)),
        ({"is_causal": True, "enable_gqa": True}, (4, 2)),
        ({}, (2, 2)),
    ],
)
def test_attention_values_and_gradients_equal_eager(kwargs, heads):
    """On CPU tensors AOTAutograd's graphs hold the CPU flash kernel's own forward and backward
    ops; both run on the device, the log-sum-exp passed between them as the kernel's."""
    g = torch.Generator().manual_seed(0)
    hq, hk = heads
    q, k, v = (torch.randn(2, h, 12, 8, generator=g) for h in (hq, hk, hk))
    mask = None if kwargs else torch.randn(2, 1, 12, 12, generator=g)

    def f(q, k, v):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
        return (o * o.flip(-1)).sum()

    compiled = torch.compile(f, backend="ir_runtime", dynamic=False, fullgraph=True)
    leaves = [[t.clone().requires_grad_() for t in (q, k, v)] for _ in range(2)]
    for fn, ls in ((f, leaves[0]), (compiled, leaves[1])):
        fn(*ls).backward()
    for e, c in zip(*leaves, strict=True):
        np.testing.assert_allclose(c.grad.numpy(), e.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_parameters_not_written_since_the_last_call_are_not_placed_again():
    model = mlp()
    compiled = torch.compile(model, backend="ir_runtime", dynamic=False)
    with torch.no_grad():
        compiled(data(0))
        irt.reset_metrics()
        compiled(data(1))
        assert counters()["DynamoInputsPlaced"] == 1  # the new input only
        model[0].weight.mul_(0.5)  # (an optimizer's in-place write)
        irt.reset_metrics()
        want = model(data(2))
        np.testing.assert_allclose(compiled(data(2)).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
        assert counters()["DynamoInputsPlaced"] == 2  # the input and the written weight


def test_what_the_forward_saves_stays_on_the_device_for_the_backward():
    """The forward's saved activations reach the backward's program as the device arrays the
    forward made: nothing saved is read to the host or placed again. A hook that packs them as
    copies reads each one, and the gradients are still eager's."""
    from ir_runtime._frontend.dynamo._resident import Resident

    eager = mlp()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="ir_runtime", dynamic=False)
    compiled(data(0)).square().mean().backward()  # (compiles both programs)
    seen = []

    def pack(t):
        seen.append(type(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        compiled(data(1)).square().mean()
    assert Resident in seen  # (the forward saved device arrays)
    model.zero_grad()
    x = data(1)
    irt.reset_metrics()
    compiled(x).square().mean().backward()
    c = counters()
    # the forward places x; the backward only its cotangent; nothing saved is read
    assert c["DynamoInputsPlaced"] == 2, c
    assert c.get("DynamoResidentReads", 0) == 0, c
    eager(x).square().mean().backward()
    for pe, pc in zip(eager.parameters(), model.parameters(), strict=True):
        np.testing.assert_allclose(pc.grad.numpy(), pe.grad.numpy(), rtol=1e-4, atol=1e-6)
    eager.zero_grad()
    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(torch.clone, lambda t: t):  # (reads each)
        compiled(x).square().mean().backward()
    assert counters()["DynamoResidentReads"] > 0
    eager(x).square().mean().backward()
    for pe, pc in zip(eager.parameters(), model.parameters(), strict=True):
        np.testing.assert_allclose(pc.grad.numpy(), pe.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_a_resident_tensor_reads_as_its_values_and_a_write_makes_the_host_copy_the_value():
    import jax.numpy as jnp

    from ir_runtime._frontend.dynamo._resident import Resident, device_array

    a = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    r = Resident(a)
    assert r.shape == (2, 3) and r.dtype == torch.float32 and r.device.type == "cpu"
    assert device_array(r, a.sharding) is a
    d = r.detach()  # (a view of the same array: still resident)
    assert type(d) is Resident and device_array(d, a.sharding) is a
    np.testing.assert_array_equal((r * 2).numpy(), np.arange(6).reshape(2, 3) * 2)
    r.add_(1)  # (lands on the host copy, which is the value from now on)
    assert device_array(r, a.sharding) is None
    np.testing.assert_array_equal((r + 0).numpy(), np.arange(6).reshape(2, 3) + 1)
    b = Resident(jnp.ones((2,), jnp.bfloat16))
    assert b.dtype == torch.bfloat16 and b.tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(copy.deepcopy(b).float().numpy(), [1.0, 1.0])
    # aliases share the data: a write through one is the value through the other
    c = Resident(jnp.zeros((3,), jnp.float32))
    alias = c.detach()
    torch._foreach_add_([c], 5.0)  # (a write inside a list argument)
    assert device_array(alias, a.sharding) is None
    np.testing.assert_array_equal(alias.numpy(), [5.0, 5.0, 5.0])
    kept = Resident(jnp.ones((3,), jnp.float32))
    torch.zeros(3).copy_(kept)  # (read by a mutable op, not written: still on the device)
    assert device_array(kept, kept.array.sharding) is not None
    with pytest.raises(RuntimeError, match="would change the shape"):
        kept.unsqueeze_(0)


def test_saved_tensors_never_reach_the_user_as_device_tensors():
    """Outputs stay plain tensors where the forward graph opens with effect tokens (the
    linear-algebra error checks), and a backward that returns what its forward saved gives a
    plain gradient."""
    from ir_runtime._frontend.dynamo._resident import Resident

    def f(a):
        y = torch.linalg.inv(a)
        return y.exp() * 2, y.sum()

    a = torch.randn(3, 3, generator=torch.Generator().manual_seed(0)) + 3 * torch.eye(3)
    a_c = a.clone().requires_grad_()
    outs = torch.compile(f, backend="ir_runtime", dynamic=False)(a_c)
    assert [type(o) for o in outs] == [torch.Tensor, torch.Tensor]
    a_e = a.clone().requires_grad_()
    want = f(a_e)
    for o, w in zip(outs, want, strict=True):
        np.testing.assert_allclose(o.detach().numpy(), w.detach().numpy(), rtol=1e-5, atol=1e-6)
    sum(o.sum() for o in outs).backward()
    sum(w.sum() for w in want).backward()
    np.testing.assert_allclose(a_c.grad.numpy(), a_e.grad.numpy(), rtol=1e-4, atol=1e-5)

    class Precomputed(torch.autograd.Function):  # (a fused loss: the gradient made forward)
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x * 2)
            return (x * x).sum()

        @staticmethod
        def backward(ctx, go):
            return ctx.saved_tensors[0]

    x = torch.randn(4, requires_grad=True)
    torch.compile(Precomputed.apply, backend="ir_runtime", dynamic=False)(x).backward()
    assert type(x.grad) is torch.Tensor and type(x.grad) is not Resident
    np.testing.assert_allclose(x.grad.numpy(), (x * 2).detach().numpy(), rtol=1e-6)


def test_outputs_that_alias_inputs_are_views_and_input_mutations_land():
    """AOTAutograd's contract: an output that is a view of an input is that view (it shares
    the input's memory, as eager's does), and an input written in place is written."""

    def f(x, y):
        y.add_(1)
        return x.view(-1), x.t(), (x * 2).sum()

    compiled = torch.compile(f, backend="ir_runtime", dynamic=False)
    x, y = torch.arange(6.0).reshape(2, 3), torch.zeros(3)
    flat, transposed, total = compiled(x, y)
    assert total.item() == 30.0 and torch.equal(y, torch.ones(3))
    assert flat.data_ptr() == x.data_ptr() == transposed.data_ptr()
    x.mul_(10)
    assert torch.equal(flat, x.view(-1)) and torch.equal(transposed, x.t())


def test_dynamic_shapes_compile_each_concrete_shape_once():
    """Dynamo's default: the second shape makes the graph symbolic (one more Dynamo graph);
    each concrete shape is then one program, a shape seen before none."""
    eager = mlp()
    compiled = torch.compile(copy.deepcopy(eager), backend="ir_runtime")
    irt.reset_metrics()
    with torch.no_grad():
        for n in (8, 4, 2, 4, 6):
            x = data(n, (n, 16))
            np.testing.assert_allclose(compiled(x).numpy(), eager(x).numpy(), rtol=1e-5, atol=1e-6)
    c = counters()
    assert (c["DynamoGraphs"], c["DynamoPrograms"], c["CompileCount"]) == (2, 4, 4)


def test_a_copy_of_an_input_is_a_new_tensor():
    for fn in (lambda x: x.clone(), lambda x: x.to(torch.float32, copy=True)):
        torch._dynamo.reset()
        x = torch.arange(4.0)
        y = torch.compile(fn, backend="ir_runtime", dynamic=False)(x)
        y[0] = 42.0
        assert x[0].item() == 0.0 and y.data_ptr() != x.data_ptr()


def test_inputs_written_behind_the_version_counter_and_inference_tensors():
    """A copied input (a transposed weight) is placed again every call, so a ``.data`` write
    is seen; a shared one reads the tensor's memory as it is; inference tensors work."""
    compiled = torch.compile(lambda x, w: x @ w, backend="ir_runtime", dynamic=False)
    x = data(0, (2, 4))
    for w in (torch.ones(3, 4).t(), torch.ones(4, 3)):
        torch.testing.assert_close(compiled(x, w), x @ w)
        w.data.mul_(2)  # (no version bump)
        torch.testing.assert_close(compiled(x, w), x @ w)
    with torch.inference_mode():
        xi, wi = data(1, (2, 4)), torch.ones(4, 3)
        torch.testing.assert_close(compiled(xi, wi), xi @ wi)


def test_dropout_under_checkpoint_and_fork_rng_draws_as_eager_does():
    """The key comes from torch's generator: checkpoint's recompute draws the forward's mask
    (the gradient is the mask the output shows), and fork_rng leaves the stream as it was."""
    from torch.utils.checkpoint import checkpoint

    drop = torch.compile(
        lambda x: torch.nn.functional.dropout(x, 0.5, training=True),
        backend="ir_runtime",
        dynamic=False,
    )
    x = torch.ones(64, requires_grad=True)
    y = checkpoint(drop, x, use_reentrant=False)
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())
    torch.manual_seed(5)
    a = drop(x).detach()
    torch.manual_seed(5)
    with torch.random.fork_rng():
        torch.manual_seed(7)
        drop(x)
    b = drop(x).detach()
    torch.testing.assert_close(a, b)  # (as eager: the fork's draws leave no trace)


def test_the_backend_as_a_callable_and_registered_under_another_name():
    from torch._dynamo.backends.registry import list_backends, register_backend

    if "ir_runtime_test_name" not in list_backends(exclude_tags=()):
        register_backend(compiler_fn=irt.dynamo_backend, name="ir_runtime_test_name")
    x = data(4)
    want = mlp()(x).detach()
    for backend in (irt.dynamo_backend, "ir_runtime_test_name"):
        torch._dynamo.reset()
        irt.reset_metrics()
        got = torch.compile(mlp(), backend=backend, dynamic=False)(x).detach()
        torch.testing.assert_close(got, want)
        assert counters()["DynamoGraphs"] == 1


MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def _train_lazy(compiled, opt, k, mesh=MESH):
    x = irt.to_lazy(data(k))
    irt.mark_sharding(x, mesh, ("data", None))
    loss = compiled(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    irt.mark_step()
    return irt.to_torch(loss).item()


def _train_eager(model, opt, k):
    loss = model(data(k)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def test_lazy_sharded_inputs_are_captured_in_one_graph_and_run_spmd_at_mark_step():
    """Dynamo takes lazy tensors in as tensors of the lazy device (fullgraph=True holds): the
    graph records its ops on them per call, pending until mark_step runs them with the
    parameters' and the batch's shardings; a changed sharding is a new XLA program, not a
    new Dynamo graph."""
    eager = mlp()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    irt.mark_sharding(lazy[0].weight, MESH, ("model", None))
    irt.mark_sharding(lazy[3].weight, MESH, (None, "model"))
    compiled = torch.compile(lazy, backend="ir_runtime", fullgraph=True)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1)
    irt.reset_metrics()
    for k in range(3):
        want = _train_eager(eager, opt_e, k)
        np.testing.assert_allclose(_train_lazy(compiled, opt_l, k), want, rtol=1e-5)
    c = counters()
    assert c["DynamoGraphs"] == 1 and c["DynamoLazyCalls"] == 6  # forward and backward, 3x
    assert "DynamoPrograms" not in c  # (no program of the backend's own: mark_step's)
    compiles = c["CompileCount"]
    irt.mark_sharding(lazy[0].weight, MESH, (None, "model"))  # another layout
    want = _train_eager(eager, opt_e, 3)
    np.testing.assert_allclose(_train_lazy(compiled, opt_l, 3), want, rtol=1e-5)
    c = counters()
    assert c["CompileCount"] > compiles and c["DynamoGraphs"] == 1
    for k, v in eager.state_dict().items():
        np.testing.assert_allclose(irt.to_torch(lazy.state_dict()[k]), v, rtol=1e-5, atol=1e-6)


def test_a_compiled_lazy_model_inside_compile_step_is_replayed_and_its_guards_hold():
    """Inside compile_step the graph's ops are recorded into the step's program, which then
    replays; eval() switches both Dynamo's graph and the step's program."""
    eager = torch.nn.Sequential(*mlp(), torch.nn.Dropout(0.5))
    lazy = irt.to_lazy(copy.deepcopy(eager))
    irt.mark_sharding(lazy[0].weight, MESH, ("model", None))
    compiled = torch.compile(lazy, backend="ir_runtime", fullgraph=True)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1)

    @irt.compile_step
    def step(x):
        irt.mark_sharding(x, MESH, ("data", None))
        loss = compiled(x).square().mean()
        loss.backward()
        opt_l.step()
        opt_l.zero_grad()
        return loss

    irt.reset_metrics()
    losses = [irt.to_torch(step(irt.to_lazy(data(0)))).item() for _ in range(4)]
    assert step.replaying and len(set(losses)) == 4  # (dropout draws afresh at each replay)
    c = counters()
    assert c["StepReplay"] >= 2 and c["DynamoGraphs"] == 1
    lazy.eval()
    eager.load_state_dict({k: irt.to_torch(v) for k, v in lazy.state_dict().items()})
    eager.eval()
    x = data(5)
    got = irt.to_torch(step(irt.to_lazy(x))).item()
    np.testing.assert_allclose(got, eager(x).square().mean().item(), rtol=1e-5)
    assert counters()["DynamoGraphs"] == 2


def test_lazy_batch_norm_statistics_land_and_outputs_alias_as_eager():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.BatchNorm1d(6, momentum=0.3))
    lazy = irt.to_lazy(copy.deepcopy(eager))
    compiled = torch.compile(lazy, backend="ir_runtime", fullgraph=True)
    for k in range(3):
        x = data(k, (10, 8))
        eager(x).exp().mean().backward()
        compiled(irt.to_lazy(x)).exp().mean().backward()
        irt.mark_step()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        want = getattr(eager[1], name)
        np.testing.assert_allclose(irt.to_torch(getattr(lazy[1], name)), want, rtol=1e-4)
    for p, q in zip(lazy.parameters(), eager.parameters(), strict=True):
        np.testing.assert_allclose(irt.to_torch(p.grad), q.grad, rtol=1e-4, atol=1e-6)

    def f(x):
        return x.view(2, -1), x.sin()

    x = irt.to_lazy(data(1, (4, 3)))
    view, sin = torch.compile(f, backend="ir_runtime", fullgraph=True)(x)
    with torch.no_grad():
        x.add_(1.0)  # the view sees the write, as a view of x does in eager
    np.testing.assert_array_equal(irt.to_torch(view), (data(1, (4, 3)) + 1).view(2, -1))
    np.testing.assert_allclose(irt.to_torch(sin), data(1, (4, 3)).sin(), rtol=1e-6)


def test_another_backend_on_lazy_inputs_runs_the_frames_as_written_and_host_writes_are_seen():
    """Only this backend takes lazy tensors into its graphs; under another (aot_eager) Dynamo
    runs the frames as written, recording lazily. Inside a traced step such a backend's frames
    are not compiled (a host write its kernels made would be hidden from the step)."""
    model = irt.to_lazy(mlp())
    x = data(2)
    want = mlp()(x)
    got = torch.compile(model, backend="aot_eager")(irt.to_lazy(x))
    np.testing.assert_allclose(irt.to_torch(got), want.detach(), rtol=1e-5, atol=1e-6)

    count = torch.zeros(())

    def bump(y):
        count.add_(1)  # a host tensor written in place
        return y * 2

    for backend in ("aot_eager", "ir_runtime"):
        torch._dynamo.reset()
        count.zero_()
        compiled = torch.compile(bump, backend=backend)
        step = irt.compile_step(lambda y, f=compiled: f(y) + 1)
        for _ in range(3):
            step(irt.to_lazy(torch.ones(2)))
        assert count.item() == 3 and not step.replaying, backend  # traced on every call


@pytest.mark.parametrize("how", ["module", "function", "Module.compile", "forward"])
def test_a_step_guards_the_modules_a_compiled_region_reads(how):
    """However the region is compiled, a compile_step around it sees a module inside it
    switch to eval() (the graph calls no module hooks: the capture notes what it read)."""
    eager = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5))
    lazy = irt.to_lazy(copy.deepcopy(eager))
    kw = {"backend": "ir_runtime", "fullgraph": True}
    if how == "module":
        region = torch.compile(lazy, **kw)
    elif how == "function":
        region = torch.compile(lambda x: lazy(x), **kw)
    elif how == "Module.compile":
        lazy.compile(**kw)
        region = lazy
    else:
        lazy.forward = torch.compile(lazy.forward, **kw)
        region = lazy
    step = irt.compile_step(lambda x: region(x).sum())
    x = data(3, (4, 16))
    for _ in range(4):
        step(irt.to_lazy(x))
    assert step.replaying
    lazy[1].eval()
    eager[1].eval()
    got = irt.to_torch(step(irt.to_lazy(x))).item()
    np.testing.assert_allclose(got, eager(x).sum().item(), rtol=1e-5)


def test_lazy_inputs_that_share_data_written_in_the_graph_read_as_eager():
    """A tensor and its view (or detach()) are one memory to the front end, not to torch:
    a graph that writes one and reads the other runs as written on them."""

    def f(x, v):
        x.add_(1)
        return v * 2

    def g(x, v):
        v.mul_(10)
        return x.sum(0)

    for fn in (f, g):
        torch._dynamo.reset()
        base = data(4, (3, 3))
        want_x = base.clone()
        want = fn(want_x, want_x[1])
        x = irt.to_lazy(base)
        got = torch.compile(fn, backend="ir_runtime", fullgraph=True)(x, x[1])
        np.testing.assert_allclose(irt.to_torch(got), want, rtol=1e-6)
        np.testing.assert_allclose(irt.to_torch(x), want_x, rtol=1e-6)
    assert counters()["DynamoLazyAliasedCalls"] == 2


def test_a_host_tensor_in_a_lazy_op_is_taken_as_lazy_mode_takes_it():
    mask = torch.tensor([1.0, 0.0, 2.0])
    x = irt.to_lazy(data(5, (2, 3)))
    got = torch.compile(lambda t: t * mask + 1, backend="ir_runtime", fullgraph=True)(x)
    np.testing.assert_allclose(irt.to_torch(got), data(5, (2, 3)) * mask + 1, rtol=1e-6)
