"""Manual regions (shard_map) and their collectives, against jax.shard_map and torch eager;
mark_sharding_with_gradients and shard_as."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from jax import lax
from jax._src.lax.parallel import all_gather_invariant  # (the gather whose result is replicated)
from jax.sharding import PartitionSpec as P

import ir_runtime as irt
from ir_runtime._frontend import inspect
from ir_sharding import Mesh, ShardingError, ShardingSpec

MESH = irt.Mesh(list(range(8)), (4, 2), ("data", "model"))
JAX_MESH = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def lazy(a, grad=True):
    t = irt.to_lazy(torch.tensor(np.asarray(a)))
    return t.requires_grad_() if grad else t


def _jax(fn, in_spec, out_spec):
    return jax.jit(jax.shard_map(fn, mesh=JAX_MESH, in_specs=(in_spec,), out_specs=out_spec))


# (name, ours, jax's, out spec): each on an (8, 16) input split ("data", "model"): local (2, 8).
COLLECTIVES = [
    ("all_reduce sum", lambda x: irt.all_reduce(x, "model"), lambda x: lax.psum(x, "model"),
     ("data", None)),
    ("all_reduce max", lambda x: irt.all_reduce(x, ("data", "model"), op="max"),
     lambda x: jnp.max(all_gather_invariant(x, ("data", "model")), axis=0), (None, None)),
    ("all_reduce min", lambda x: irt.all_reduce(x, "data", op="min"),
     lambda x: jnp.min(all_gather_invariant(x, "data"), axis=0), (None, "model")),
    ("all_gather", lambda x: irt.all_gather(x, "model", dim=1),
     lambda x: all_gather_invariant(x, "model", axis=1, tiled=True), ("data", None)),
    ("all_gather two axes", lambda x: irt.all_gather(x, ("data", "model"), dim=0),
     lambda x: all_gather_invariant(x, ("data", "model"), axis=0, tiled=True), (None, None)),
    ("reduce_scatter", lambda x: irt.reduce_scatter(x, "model", dim=1),
     lambda x: lax.psum_scatter(x, "model", scatter_dimension=1, tiled=True),
     ("data", "model")),
    ("all_to_all", lambda x: irt.all_to_all(x, "model", split_dim=1, concat_dim=0),
     lambda x: lax.all_to_all(x, "model", 1, 0, tiled=True), (("data", "model"), None)),
    ("ppermute", lambda x: irt.ppermute(x, "data", [(0, 1), (1, 2), (2, 3), (3, 0)]),
     lambda x: lax.ppermute(x, "data", [(0, 1), (1, 2), (2, 3), (3, 0)]), ("data", "model")),
    ("ppermute partial", lambda x: irt.ppermute(x, ("data", "model"), [(0, 5), (7, 2)]),
     lambda x: lax.ppermute(x, ("data", "model"), [(0, 5), (7, 2)]), ("data", "model")),
    ("axis_index", lambda x: x * irt.axis_index(("data", "model")).float(),
     lambda x: x * lax.axis_index(("data", "model")).astype(jnp.float32), ("data", "model")),
]  # fmt: skip


@pytest.mark.parametrize("ours, theirs, out_spec", [c[1:] for c in COLLECTIVES],
                         ids=[c[0] for c in COLLECTIVES])  # fmt: skip
def test_collectives_match_jax_shard_map_values_and_gradients(ours, theirs, out_spec):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    f = _jax(theirs, P("data", "model"), P(*out_spec))
    want = np.asarray(f(a))
    r = rng.standard_normal(want.shape).astype(np.float32)
    want_grad = np.asarray(jax.grad(lambda x: (f(x) * r).sum())(a))

    x = lazy(a)
    y = irt.shard_map(ours, MESH, in_specs=(("data", "model"),), out_specs=out_spec)(x)
    (y * torch.tensor(r).to("lazy")).sum().backward()
    irt.mark_step()
    np.testing.assert_allclose(y.detach().cpu().numpy(), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(x.grad.cpu().numpy(), want_grad, rtol=1e-6, atol=1e-6)


def _row_parallel(x, w):
    return irt.all_reduce(x @ w, "model")


def test_a_manual_matmul_composes_with_automatic_sharding_like_eager():
    torch.manual_seed(0)
    xc, wc, bc = torch.randn(16, 32), torch.randn(32, 8), torch.randn(8)
    x, w, b = lazy(xc), lazy(wc), lazy(bc)
    irt.mark_sharding(x, MESH, ("data", None))  # moved to the region's in spec by XLA
    mm = irt.shard_map(
        _row_parallel, MESH, in_specs=((None, "model"), ("model", None)), out_specs=(None, None)
    )
    h = torch.relu(mm(x, w) + b)  # automatic sharding again, after the region
    loss = (h * h).mean()
    loss.backward()
    irt.mark_step()
    xe, we, be = (t.clone().requires_grad_() for t in (xc, wc, bc))
    le = (torch.relu(xe @ we + be) ** 2).mean()
    le.backward()
    torch.testing.assert_close(loss.cpu(), le.detach())
    for got, want in ((x, xe), (w, we), (b, be)):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-5, atol=1e-5)


def _vocab_parallel_cross_entropy(logits, target):
    """Cross-entropy of logits whose vocabulary is split over "model": the README's example."""
    local = logits.shape[-1]
    start = irt.axis_index("model") * local
    m = irt.all_reduce(logits.detach().amax(dim=-1), "model", op="max")
    shifted = logits - m[:, None]
    total = irt.all_reduce(shifted.exp().sum(dim=-1), "model")
    mine = (target >= start) & (target < start + local)
    index = (target - start).clamp(0, local - 1)
    picked = shifted.gather(1, index[:, None])[:, 0] * mine
    return total.log() - irt.all_reduce(picked, "model")


def test_a_vocabulary_parallel_cross_entropy_equals_eager():
    torch.manual_seed(1)
    logits_c = torch.randn(8, 64) * 3
    target_c = torch.randint(0, 64, (8,))
    logits, target = lazy(logits_c), lazy(target_c, grad=False)
    xent = irt.shard_map(
        _vocab_parallel_cross_entropy, MESH, in_specs=(("data", "model"), ("data",)),
        out_specs=("data",),
    )  # fmt: skip
    loss = xent(logits, target).mean()
    loss.backward()
    irt.mark_step()
    le = logits_c.clone().requires_grad_()
    want = F.cross_entropy(le, target_c)
    want.backward()
    torch.testing.assert_close(loss.cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits.grad.cpu(), le.grad, rtol=1e-5, atol=1e-6)


def _ring_all_reduce(x):
    """A ring all-reduce over "data" from ppermute: each device passes on what it received."""
    n = 4
    ring = [(i, (i + 1) % n) for i in range(n)]
    total, passing = x, x
    for _ in range(n - 1):
        passing = irt.ppermute(passing, "data", ring)
        total = total + passing
    return total


def test_a_ring_all_reduce_from_ppermute_equals_all_reduce_and_its_gradient():
    a = np.random.default_rng(2).standard_normal((8, 6)).astype(np.float32)
    x1, x2 = lazy(a), lazy(a)
    specs = {"in_specs": (("data", None),), "out_specs": ("data", None)}
    ring = irt.shard_map(_ring_all_reduce, MESH, **specs)(x1)
    plain = irt.shard_map(lambda x: irt.all_reduce(x, "data"), MESH, **specs)(x2)
    w = torch.arange(48.0).reshape(8, 6).to("lazy")
    (ring * w).sum().backward()
    (plain * w).sum().backward()
    irt.mark_step()
    torch.testing.assert_close(ring.cpu(), plain.cpu())
    torch.testing.assert_close(x1.grad.cpu(), x2.grad.cpu())


def test_inside_compile_step_it_replays_and_trains_like_eager():
    torch.manual_seed(3)
    wc = torch.randn(16, 4)
    batches = [torch.randn(8, 16) for _ in range(4)]
    w = lazy(wc)
    opt = torch.optim.SGD([w], lr=0.1)
    mm = irt.shard_map(
        _row_parallel, MESH, in_specs=((None, "model"), ("model", None)), out_specs=(None, None)
    )

    @irt.compile_step
    def step(x):
        opt.zero_grad()
        loss = mm(x, w).square().mean()
        loss.backward()
        opt.step()
        return loss

    we = wc.clone().requires_grad_()
    opt_e = torch.optim.SGD([we], lr=0.1)
    irt.reset_metrics()
    for b in batches:
        got = step(irt.to_lazy(b))
        opt_e.zero_grad()
        want = (b @ we).square().mean()
        want.backward()
        opt_e.step()
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    counters = irt.metrics()["counters"]  # traced on the first two calls, then replayed
    assert step.replaying and counters["StepTraced"] == 2 and counters["StepReplay"] == 2
    torch.testing.assert_close(w.detach().cpu(), we.detach(), rtol=1e-5, atol=1e-6)


def test_each_device_draws_its_own_random_numbers():
    x = irt.to_lazy(torch.zeros(8, 4))
    y = irt.shard_map(
        lambda x: x + torch.rand(x.shape, device="lazy"), MESH, in_specs=(("data", "model"),),
        out_specs=("data", "model"),
    )(x)  # fmt: skip
    blocks = y.cpu().reshape(4, 2, 2, 2).transpose(1, 2).reshape(8, 2, 2)  # one per device
    assert all(not torch.equal(blocks[i], blocks[j]) for i in range(8) for j in range(i))
    assert ((blocks >= 0) & (blocks < 1)).all()


def test_several_outputs_and_an_output_the_loss_ignores():
    a = np.random.default_rng(4).standard_normal((8, 4)).astype(np.float32)
    x = lazy(a)

    def two(x):
        return irt.all_reduce(x, "data"), x * 2

    s, d = irt.shard_map(
        two, MESH, in_specs=(("data", None),), out_specs=((None, None), ("data", None))
    )(x)
    d.sum().backward()  # s unused: its gradient is zeros
    irt.mark_step()
    np.testing.assert_allclose(s.detach().cpu().numpy(), a.reshape(4, 2, 4).sum(0), rtol=1e-6)
    np.testing.assert_allclose(x.grad.cpu().numpy(), np.full_like(a, 2.0))


def _pending():
    t = irt.to_lazy(torch.ones(4)) * 3
    return t


BAD = [
    (lambda x: irt.all_reduce(x, "tensor"), (("data", None),), ("data", None),
     "mesh axis 'tensor' does not exist; the mesh has axes ['data', 'model']"),
    (lambda x: x, (("tensor", None),), ("data", None), "tensor"),
    (lambda x: x, (("model", "model"),), (None, None), "model"),
    (lambda x: x, (("data", None, None),), (None, None), "has rank 2 but its spec"),
    (lambda x: x.sum(0, keepdim=True), (("data", None),), (None, None),
     "out_specs[0] (None, None) cannot hold output 0 of <lambda>: it differs from device to "
     "device over mesh axis 'data'"),
    (lambda x: irt.reduce_scatter(x, "model", dim=1), ((None, None),), (None, "model"),
     "dimension 1 (3) does not divide over mesh axes ('model',)"),
    (lambda x: irt.ppermute(x, "data", [(0, 4)]), (("data", None),), ("data", None),
     "4 in pair (0, 4) is not a position along mesh axes ('data',) (0 to 3)"),
    (lambda x: irt.ppermute(x, "data", [(0, 1), (2, 1)]), (("data", None),), ("data", None),
     "uses a destination twice"),
    (lambda x: irt.all_reduce(x, "data", op="mean"), (("data", None),), ("data", None),
     "op must be 'sum', 'max' or 'min', got 'mean'"),
    (lambda x: x + _pending(), ((None, None),), (None, None), "reads a lazy tensor"),
    (lambda x: x.add_(1), ((None, None),), (None, None), "writes its input 0 in place"),
    (lambda x: x * float(x.sum()), ((None, None),), (None, None), "reads a value to the host"),
]  # fmt: skip


@pytest.mark.parametrize("fn, in_specs, out_specs, message", BAD)
def test_bad_regions_are_refused_by_name_and_nothing_recorded_is_lost(
    fn, in_specs, out_specs, message
):
    kept = irt.to_lazy(torch.arange(4.0)) * 2  # pending work recorded before the error
    x = irt.to_lazy(torch.ones(8, 3) if "3)" in message else torch.ones(8, 4))
    with pytest.raises(ShardingError) as e:
        irt.shard_map(fn, MESH, in_specs=in_specs, out_specs=out_specs)(x)
    assert message in str(e.value)
    assert kept.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert x.cpu().sum().item() == x.numel()


def test_collectives_outside_a_region_and_other_misuse():
    x = irt.to_lazy(torch.ones(8, 4))
    for call in (
        lambda: irt.all_reduce(x, "data"),
        lambda: irt.all_gather(x, "data"),
        lambda: irt.axis_index("data"),
    ):
        with pytest.raises(ShardingError, match=r"inside a function run by ir_runtime\.shard_map"):
            call()
    f = irt.shard_map(lambda a, b: a, MESH, in_specs=(("data", None),), out_specs=("data",))
    with pytest.raises(ShardingError, match="in_specs has 1 specs for 2 arguments"):
        f(x, x)
    two = irt.shard_map(
        lambda a: (a, a), MESH, in_specs=(("data", None),), out_specs=(("data", None),)
    )
    with pytest.raises(ShardingError, match="returns 2 tensors; out_specs must be a sequence"):
        two(x)
    with pytest.raises(ShardingError, match="argument 0 must be a lazy tensor"):
        f(torch.ones(8, 4))


def _layout(t):
    return t._ir.node.handle.sharding.spec


def test_mark_sharding_with_gradients_places_the_parameters_gradient():
    torch.manual_seed(5)
    plain, marked = (irt.to_lazy(torch.nn.Linear(32, 16)) for _ in range(2))
    marked.load_state_dict(plain.state_dict())
    xc = torch.randn(8, 32)
    irt.mark_sharding(plain.weight, MESH, (None, "data"))
    assert irt.mark_sharding_with_gradients(marked.weight, MESH, (None, "data")) is marked.weight
    for m in (plain, marked):
        x = irt.to_lazy(xc)
        irt.mark_sharding(x, MESH, ("data", "model"))
        m(x).square().sum().backward()
    text = irt.dump([marked.weight.grad], format="stablehlo")
    assert "sharding_constraint" in text and '{}, {"data"}' in text
    assert "sharding_constraint" not in irt.dump([plain.weight.grad], format="stablehlo")
    irt.mark_step()
    assert _layout(marked.weight.grad) == P(None, "data")
    torch.testing.assert_close(marked.weight.grad.cpu(), plain.weight.grad.cpu())


def test_mark_sharding_with_gradients_of_an_activation():
    torch.manual_seed(6)
    xc, wc = torch.randn(8, 16), torch.randn(16, 16)
    x, w = lazy(xc), lazy(wc)
    h = irt.mark_sharding_with_gradients(x @ w, MESH, ("data", "model"))
    (h.tanh() ** 2).sum().backward()
    grad_text = irt.dump([w.grad], format="stablehlo")
    assert grad_text.count("sharding_constraint") >= 1
    irt.mark_step()
    we = wc.clone().requires_grad_()
    (torch.tanh(xc @ we) ** 2).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), we.grad, rtol=1e-5, atol=1e-5)
    assert _layout(h) == P("data", "model")


def test_shard_as_gives_two_tensors_one_placement():
    a, b = irt.to_lazy(torch.randn(8, 16)), irt.to_lazy(torch.randn(8, 16))
    irt.mark_sharding(b, MESH, (None, "model"))
    a2, b2 = irt.shard_as(a * 2, b)
    assert b2 is b
    out = a2 + 1
    irt.mark_step()
    assert _layout(out) == P(None, "model")
    torch.testing.assert_close(out.cpu(), a.cpu() * 2 + 1)

    c, d = irt.to_lazy(torch.randn(8, 16)), irt.to_lazy(torch.randn(8, 16))
    irt.mark_sharding(c, MESH, ("data", "model"))
    c2, d2 = irt.shard_as(c.sin(), d.cos())  # neither annotated: XLA picks one for both
    assert "sharding_group" in irt.dump([c2, d2], format="stablehlo")
    irt.mark_step()
    assert c2._ir.node.handle.sharding.is_equivalent_to(d2._ir.node.handle.sharding, 2)
    torch.testing.assert_close(d2.cpu(), d.cpu().cos())
    with pytest.raises(ShardingError, match=r"one shape alike; got \[8, 16\] and \[4\]"):
        irt.shard_as(a, irt.to_lazy(torch.ones(4)))


def test_shard_as_gradients_flow_like_eager():
    ac, bc = torch.randn(8, 4), torch.randn(8, 4)
    a, b = lazy(ac), lazy(bc)
    a2, b2 = irt.shard_as(a.sin(), b.cos())
    (a2 * b2).sum().backward()
    irt.mark_step()
    ae, be = ac.clone().requires_grad_(), bc.clone().requires_grad_()
    (ae.sin() * be.cos()).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), ae.grad)
    torch.testing.assert_close(b.grad.cpu(), be.grad)
    assert inspect is not None


def test_two_functions_of_one_graph_but_another_wiring_are_two_bodies():
    a, b = lazy(np.arange(8.0, dtype=np.float32)[:, None], False), lazy(np.ones((8, 1)), False)
    b = b.float()
    specs = {"in_specs": (("data", None), ("data", None)), "out_specs": ("data", None)}
    first = irt.shard_map(lambda x, y: x - y, MESH, **specs)(a, b)
    second = irt.shard_map(lambda x, y: y - x, MESH, **specs)(a, b)
    twice = irt.shard_map(lambda x, y: y * 2, MESH, **specs)(a, b)
    torch.testing.assert_close(first.cpu(), a.cpu() - 1)
    torch.testing.assert_close(second.cpu(), 1 - a.cpu())
    torch.testing.assert_close(twice.cpu(), torch.full((8, 1), 2.0))


def test_a_region_that_writes_another_tensor_is_refused_and_the_tensor_keeps_its_value():
    buf = irt.to_lazy(torch.zeros(2, 4))
    kept = {}

    def writes(x):
        buf.add_(x.sum(0, keepdim=True)[:, :4].expand(2, 4))
        return x

    def stores(x):
        kept["h"] = x * 2  # an intermediate kept past the trace: never computed by a step
        return x + 1

    x = irt.to_lazy(torch.ones(8, 4))
    with pytest.raises(ShardingError, match=r"writes a tensor \[2, 4\] float32 that is not one"):
        irt.shard_map(writes, MESH, in_specs=(("data", None),), out_specs=("data", None))(x)
    y = irt.shard_map(stores, MESH, in_specs=(("data", None),), out_specs=("data", None))(x)
    z = buf + 1
    irt.mark_step()  # neither the refused write nor the stored intermediate is run
    assert z.cpu().tolist() == [[1.0] * 4] * 2 and y.cpu().sum().item() == 64
    with pytest.raises(ShardingError, match="calls mark_step"):
        irt.shard_map(lambda t: (irt.mark_step(), t)[1], MESH, in_specs=((None, None),),
                      out_specs=(None, None))(x)  # fmt: skip
    inner = irt.shard_map(lambda t: t, MESH, in_specs=((None, None),), out_specs=(None, None))
    with pytest.raises(ShardingError, match="shard_map inside a manual region is not supported"):
        irt.shard_map(inner, MESH, in_specs=((None, None),), out_specs=(None, None))(x)
    with pytest.raises(ShardingError, match="calls mark_sharding"):
        irt.shard_map(lambda t: irt.mark_sharding(t, MESH, (None, None)), MESH,
                      in_specs=((None, None),), out_specs=(None, None))(x)  # fmt: skip
    with pytest.raises(ShardingError, match="at least one dimension, got a 0-d one"):
        irt.shard_map(lambda t: irt.all_gather(t.sum(), "data"), MESH, in_specs=((None, None),),
                      out_specs=(None,))(x)  # fmt: skip


def test_random_numbers_differ_across_data_shards_and_agree_across_replicas():
    x = irt.to_lazy(torch.zeros(8, 4))
    y = irt.shard_map(
        lambda x: torch.nn.functional.dropout(x + 1, 0.5),
        MESH,
        in_specs=(("data", None),),
        out_specs=("data", None),
    )(x)  # split over "data" only: the two "model" replicas of a shard are one computation
    blocks = y.cpu().reshape(4, 2, 4)
    assert all(not torch.equal(blocks[i], blocks[j]) for i in range(4) for j in range(i))
    assert set(y.cpu().unique().tolist()) <= {0.0, 2.0}


def test_second_order_gradients_through_a_region_are_refused_not_wrong():
    x = lazy(np.ones((8, 2), np.float32))
    y = irt.shard_map(lambda t: t**3, MESH, in_specs=(("data", None),), out_specs=("data", None))
    (g,) = torch.autograd.grad((y(x) + x**3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        g.sum().backward()
    (g,) = torch.autograd.grad(y(x).sum(), x)  # first order: as ever
    assert g.cpu().tolist() == [[3.0, 3.0]] * 8


def test_mark_sharding_with_gradients_each_step_keeps_one_constraint():
    lin = irt.to_lazy(torch.nn.Linear(8, 8))
    for _ in range(3):
        irt.mark_sharding_with_gradients(lin.weight, MESH, ("data", None))
        lin(irt.to_lazy(torch.ones(4, 8))).sum().backward()
        text = irt.dump([lin.weight.grad], format="text")
        irt.mark_step()
        lin.weight.grad = None
    assert text.count("ir::annotate") == 1


def test_an_eager_region_left_open_is_pending_and_refused_by_name_where_a_program_would_run():
    """torch_xla's eager manual regions (``regions._eager``, served as
    ``enable_manual_sharding``; tested end to end in test_torch_xla.py): a tensor inside an
    open region is one device's block: lowering it raises LoweringError naming the region,
    reading it ShardingError; closed, the region computes eager's value."""
    from ir_runtime._frontend.regions import _eager

    mesh = Mesh(range(8), (2, 4), ("x", "y"))
    spec = ShardingSpec(mesh, ("x", "y"))
    host = torch.randn(8, 16)
    x = irt.to_lazy(host)
    irt.mark_sharding(x, mesh, ("x", "y"))
    m = _eager.full_to_shard(x, spec, "the test's region")
    assert tuple(m.shape) == (4, 4)
    with pytest.raises(irt.LoweringError, match="inside an open manual region"):
        irt.lower([m._ir])
    with pytest.raises(ShardingError, match="inside a manual region"):
        m.cpu()
    out = _eager.shard_to_full(m * 2, spec, (8, 16), "the test's region", block=True)
    torch.testing.assert_close(irt.to_torch(out), host * 2)


def test_an_embedding_gradient_inside_a_region_equals_eager():
    # Inside a region each value is one device's shard: its graph is lowered as recorded (the
    # program's rewrites, such as a row-split table's gradient reading its ids whole, are the
    # program's, over the mesh).
    torch.manual_seed(0)
    grad_c = torch.randn(8, 4, 6)
    ids_c = torch.randint(0, 16, (8, 4))

    def table_grad(g, i):
        local = torch.ops.aten.embedding_dense_backward(g, i, 16, 3, False)
        return irt.all_reduce(local, "data")

    grad, ids = lazy(grad_c, grad=False), lazy(ids_c, grad=False)
    summed = irt.shard_map(
        table_grad, MESH, in_specs=(("data", None, None), ("data", None)), out_specs=(None, None)
    )
    got = summed(grad, ids)
    irt.mark_step()
    want = torch.ops.aten.embedding_dense_backward(grad_c, ids_c, 16, 3, False)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
