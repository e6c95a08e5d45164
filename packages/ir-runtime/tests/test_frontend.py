"""The PyTorch front end, op by op and feature by feature, against torch eager."""

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_runtime._frontend import inspect

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def same(lazy, eager, **tol):
    np.testing.assert_allclose(irt.to_torch(lazy).numpy(), eager.detach().numpy(), **tol)


def test_device_printing_item_cpu():
    t = irt.to_lazy(torch.tensor([[1.5, -2.0], [3.0, 4.0]]))
    assert t.device == torch.device("lazy", 0)
    assert str(t.device) == "lazy:0"
    s = (t * 2).sum()
    assert s.item() == 13.0
    assert isinstance(t.cpu(), torch.Tensor) and t.cpu().device.type == "cpu"
    assert "lazy:0" in repr(t) and "1.5000" in repr(t)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.int64,
        torch.int32,
        torch.float64,
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.bool,
    ],
)
def test_dtypes_follow_torch(dtype):
    x = torch.arange(6).reshape(2, 3).to(dtype)
    lx = irt.to_lazy(x)
    assert lx.dtype == dtype
    back = irt.to_torch(lx)
    assert back.dtype == dtype and torch.equal(back, x)
    if dtype not in (torch.bool,):
        out = irt.to_torch(lx + lx)
        assert out.dtype == (x + x).dtype
        assert torch.equal(out, x + x)


def test_big_int64_values_survive():
    x = torch.tensor([2**40 + 1, -(2**50)], dtype=torch.int64)
    assert torch.equal(irt.to_torch(irt.to_lazy(x) * 3), x * 3)


VIEWS = [
    lambda t: t[1].add_(5.0),
    lambda t: t[:, 1:3].mul_(2.0),
    lambda t: t.view(-1).add_(1.0),
    lambda t: t.t().sub_(3.0),
    lambda t: t.__setitem__((0, 0), 7.0),
    lambda t: t.detach().zero_(),
    lambda t: t[1][1:].fill_(9.0),
]


@pytest.mark.parametrize("write", VIEWS)
def test_writes_through_views_reach_the_base(write):
    a = torch.arange(12.0).reshape(3, 4)
    b = irt.to_lazy(a.clone())
    write(a)
    write(b)
    same(b, a)


def test_factories_on_the_lazy_device():
    z = torch.zeros(2, 3, device="lazy")
    assert isinstance(z, irt.LazyTensor)
    assert torch.equal(irt.to_torch(z), torch.zeros(2, 3))
    t = torch.tensor([1.0, 2.0], device="lazy")
    assert torch.equal(irt.to_torch(t), torch.tensor([1.0, 2.0]))
    r = torch.arange(5, device="lazy")
    assert torch.equal(irt.to_torch(r), torch.arange(5))
    f = torch.full((2,), 3.5, device="lazy")
    assert torch.equal(irt.to_torch(f), torch.full((2,), 3.5))


def test_copy_from_and_to_the_host():
    lx = irt.to_lazy(torch.zeros(3))
    lx.copy_(torch.tensor([1.0, 2.0, 3.0]))
    host = torch.empty(3)
    host.copy_(lx * 2)
    assert torch.equal(host, torch.tensor([2.0, 4.0, 6.0]))


def test_unsupported_op_names_the_aten_op():
    x = irt.to_lazy(torch.randn(4, 4))
    with pytest.raises(irt.UnsupportedOpError, match=r"aten::_to_sparse"):
        x.to_sparse()
    with pytest.raises(irt.UnsupportedOpError, match=r"torch.sparse_coo tensor .*to_dense"):
        irt.to_lazy(torch.eye(3).to_sparse())
    with pytest.raises(irt.UnsupportedOpError, match=r"sparse_csr"):
        x + torch.eye(4).to_sparse_csr()
    with pytest.raises(irt.DTypeError, match=r"complex32"):
        x.to(torch.complex32)


def test_negative_zero_keeps_its_sign():
    """-0.0 equals 0.0 as a number, but not as a lifted leaf: 1 / (x * -0.0) is -inf. Each
    order twice, so the Python path (first sighting) and the C path both see it."""
    x = torch.ones(3)
    lx = irt.to_lazy(x)
    for v in (0.0, -0.0, -0.0, 0.0, 0.0):
        same(1 / (lx * v), 1 / (x * v))
        same(torch.add(lx, v, alpha=-1.0), torch.add(x, v, alpha=-1.0))


def test_a_python_float_beside_no_floating_tensor_takes_the_default_dtype():
    """torch promotes an integer tensor and a Python float to its default dtype; a 0-d float32
    tensor in the same place gives float32."""
    xi = torch.tensor([1, 2])
    lxi = irt.to_lazy(xi)
    default = torch.get_default_dtype()
    for dtype in (torch.float64, torch.float32, torch.float64):
        torch.set_default_dtype(dtype)
        try:
            for _ in range(2):
                r = lxi + 0.1
                assert r.dtype == dtype
                np.testing.assert_array_equal(irt.to_torch(r).numpy(), (xi + 0.1).numpy())
                zero_d = torch.tensor(0.1, dtype=torch.float32)
                assert (lxi + zero_d).dtype == (xi + zero_d).dtype == torch.float32
        finally:
            torch.set_default_dtype(default)


def test_dispatch_takes_a_list_of_arguments_as_torch_would_a_tuple():
    LazyTensor = irt.LazyTensor
    x = irt.to_lazy(torch.tensor([1.0, 2.0]))
    for _ in range(2):  # first sighting, then seen
        out = LazyTensor.__torch_dispatch__(torch.ops.aten.sub.Tensor, (), [x, x * 3.0])
        same(out, torch.tensor([-2.0, -4.0]))


# An op of this test's own with kernels for the CPU and for shapes only: nothing the lazy
# device can run (an op with one kernel for every device runs it: the last tests of this file).
_TEST_LIB = torch.library.Library("ir_runtime_test", "FRAGMENT")
_TEST_LIB.define("twice(Tensor x) -> Tensor")
_TEST_LIB.impl("twice", lambda x: x * 2, "CPU")
_TEST_LIB.impl("twice", lambda x: torch.empty_like(x), "Meta")


def _twice(x):
    return torch.ops.ir_runtime_test.twice(x)


def test_a_rule_registered_after_an_op_was_refused_is_used_from_then_on():
    """The error tells the user to register a rule: doing so must take effect for an op the
    front end has already seen (and refused). The op is a custom op of this test's own."""
    from ir_runtime._lowering import _registry

    x = torch.rand(5) + 0.5
    lx = irt.to_lazy(x)
    with pytest.raises(irt.UnsupportedOpError, match=r"ir_runtime_test::twice"):
        _twice(lx)
    irt.register_lowering("ir_runtime_test::twice.default")(lambda node, v: v * 2)
    try:
        same(_twice(lx) * 2.0, x * 4.0)
    finally:
        _registry.unregister("ir_runtime_test::twice.default")


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW"])
def test_optimizers_single_tensor_and_foreach(opt_name, foreach):
    torch.manual_seed(0)
    eager = torch.nn.Linear(6, 3)
    lazy = irt.to_lazy(torch.nn.Linear(6, 3))
    with torch.no_grad():
        for pl, pe in zip(lazy.parameters(), eager.parameters(), strict=True):
            pl.copy_(pe)
    kw = {"lr": 0.05, "foreach": foreach}
    if opt_name == "SGD":
        kw["momentum"] = 0.9
    opt_e = getattr(torch.optim, opt_name)(eager.parameters(), **kw)
    opt_l = getattr(torch.optim, opt_name)(lazy.parameters(), **kw)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    for _ in range(4):
        for model, opt, xx, yy in (
            (eager, opt_e, x, y),
            (lazy, opt_l, irt.to_lazy(x), irt.to_lazy(y)),
        ):
            loss = torch.nn.functional.mse_loss(model(xx), yy)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
        irt.mark_step()
    for pl, pe in zip(lazy.parameters(), eager.parameters(), strict=True):
        same(pl, pe, rtol=1e-4, atol=1e-5)


def test_a_changing_learning_rate_does_not_recompile():
    torch.manual_seed(0)
    model = irt.to_lazy(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)
    irt.CACHE.clear()
    irt.reset_metrics()
    for _ in range(5):
        loss = model(irt.to_lazy(torch.randn(3, 4))).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        irt.mark_step()
    assert irt.metrics()["counters"]["CompileCount"] == 1


def test_dropout_is_reproducible_and_sound():
    x = irt.to_lazy(torch.ones(4000))

    def draw(seed):
        torch.manual_seed(seed)
        out = torch.nn.functional.dropout(x, p=0.25, training=True)
        irt.mark_step()
        return irt.to_torch(out)

    a, b, c = draw(1), draw(1), draw(2)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    kept = (a != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.03  # 4000 draws: 4.5 standard deviations
    assert torch.allclose(a[a != 0], torch.full_like(a[a != 0], 1 / 0.75))
    # Consecutive steps draw different masks from one seed.
    torch.manual_seed(1)
    first = torch.nn.functional.dropout(x, p=0.5, training=True)
    irt.mark_step()
    second = torch.nn.functional.dropout(x, p=0.5, training=True)
    irt.mark_step()
    assert not torch.equal(irt.to_torch(first), irt.to_torch(second))


def _sample(model, idx, n, read_each: bool):
    """nanoGPT's generate: top-k filtering by a boolean mask, a multinomial draw per token;
    ``read_each``: a value read to the host per token (a stopping test), which cuts the graph."""
    for _ in range(n):
        logits = model(idx)[:, -1, :]
        v, _ = torch.topk(logits, 3)
        logits[logits < v[:, [-1]]] = -float("inf")
        nxt = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
        idx = torch.cat((idx, nxt), dim=1)
        if read_each and bool((nxt < 0).any()):
            break
    return idx.tolist()


@pytest.mark.parametrize("read_each", [False, True], ids=["one-graph", "read-each-token"])
def test_a_second_identical_sampling_loop_compiles_nothing(read_each):
    """Random ops draw at an offset from a base that is data: a graph cut in the middle of a
    step (each token read) starts again at offset 0, so every token's program and a second
    identical loop hit the cache, and the numbers are those of the uncut loop."""
    torch.manual_seed(0)
    model = irt.to_lazy(
        torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    ).eval()
    idx = irt.to_lazy(torch.tensor([[1, 2], [3, 4]]))
    irt.mark_step()

    def run(seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            return _sample(model, idx, 6, read_each)

    first = run(7)
    irt.reset_metrics()
    second = run()  # the stream goes on: other draws, the same programs
    counters = irt.metrics()["counters"]
    assert counters["CompileCount"] == 0 and counters["CacheMiss"] == 0
    assert counters["ExecuteCount"] == (6 if read_each else 1)
    assert first != second
    assert run(7) == first
    torch.manual_seed(7)
    with torch.no_grad():
        assert _sample(model, idx, 6, not read_each) == first  # cut or not, the same draws


def test_out_resizes_and_host_conversions_follow_torch():
    """``out=`` of another shape is resized (a non-empty one with torch's warning); ``tolist``
    reads the value; ``numpy()`` is refused as for any device but the CPU, unless forced."""
    a = irt.to_lazy(torch.tensor([1.0, 2.0]))
    empty = torch.empty(0, device="lazy")
    assert torch.add(a, 1, out=empty) is empty and empty.tolist() == [2.0, 3.0]
    full = torch.zeros(3, device="lazy")
    with pytest.warns(UserWarning, match=r"resized since it had shape \[3\]"):
        torch.mul(a, 2, out=full)
    assert full.shape == (2,) and full.tolist() == [2.0, 4.0]
    assert a[1].tolist() == 2.0 and (a > 1).tolist() == [False, True]
    with pytest.raises(TypeError, match="can't convert lazy:0 device type tensor to numpy"):
        a.numpy()
    np.testing.assert_array_equal(a.numpy(force=True), np.array([1.0, 2.0], np.float32))


def test_mark_sharding_places_data_and_errors_change_nothing():
    t = irt.to_lazy(torch.arange(32.0).reshape(8, 4))
    before = inspect.value_of(t)
    with pytest.raises(ValueError, match="has 1 entries but the tensor"):
        irt.mark_sharding(t, MESH, ("data",))
    with pytest.raises(ValueError, match="names mesh axis 'nope'"):
        irt.mark_sharding(t, MESH, ("nope", None))
    assert inspect.value_of(t) is before and inspect.annotation_of(t) is None
    irt.mark_sharding(t, MESH, ("data", "model"))
    shards = {s.device.id: tuple(s.data.shape) for s in inspect.data_of(t).addressable_shards}
    assert shards == dict.fromkeys(range(8), (2, 2))
    assert "TILED" in irt.visualize_sharding(t)
    irt.clear_sharding(t)
    assert inspect.annotation_of(t) is None
    assert torch.equal(irt.to_torch(t), torch.arange(32.0).reshape(8, 4))


def test_dump_formats():
    t = irt.to_lazy(torch.ones(2, 2)) * 3.0
    assert "aten::mul" in irt.dump(t)
    assert irt.dump(t, format="dot").startswith("digraph")
    assert "stablehlo" in irt.dump(t, format="stablehlo")
    with pytest.raises(ValueError, match="format must be"):
        irt.dump(t, format="svg")


def test_dump_shows_the_graph_after_the_rewrite_rules():
    # torch's linear backward computes a weight gradient as t(mm(a, b)); it is lowered as
    # mm(t(b), t(a)), one ir::dot of b and a contracting b's dim 0 with a's dim 1 (no
    # transpose left). The recorded graph stays as it was.
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    out = (irt.to_lazy(a) @ irt.to_lazy(b)).t()
    recorded, rewritten = irt.dump(out), irt.dump(out, format="rewritten")
    assert recorded.index("aten::mm") < recorded.index("aten::t")
    assert "aten::" not in rewritten and "ir::dot" in rewritten, rewritten
    assert "dims=(((0,), (1,)), ((), ()))" in rewritten, rewritten
    assert irt.dump(out) == recorded
    torch.testing.assert_close(irt.to_torch(out), (a @ b).t())


@pytest.mark.parametrize(
    "table_spec, whole, dtype",
    [((("data", "model"), None), True, None), ((("data", "model"), None), True, torch.bfloat16),
     (("model", None), False, None), ((None, "model"), False, None), (None, False, None)],
    ids=["rows over every device", "rows over every device, a bfloat16 copy", "rows over model",
         "columns", "whole"],
)  # fmt: skip
def test_the_gradient_of_an_fsdp_embedding_reads_its_ids_whole(table_spec, whole, dtype):
    # A table split over its rows on every device takes every token's gradient for its own
    # rows: its gradient reads the ids whole (an annotation the rewrite adds), where XLA's
    # partitioner otherwise tried the ids' batch split first and fell back to replicating.
    # Elsewhere the ids stay as the user placed them.
    torch.manual_seed(0)
    table = torch.randn(64, 16, requires_grad=True)
    ids = torch.randint(0, 64, (8, 4))
    lazy = irt.to_lazy(table.detach())
    if table_spec is not None:
        irt.mark_sharding(lazy, MESH, table_spec)
    lazy.requires_grad_()
    lids = irt.to_lazy(ids)
    irt.mark_sharding(lids, MESH, ("data", None))

    def loss(t, i):
        return (torch.nn.functional.embedding(i, t if dtype is None else t.to(dtype)) ** 2).sum()

    loss(lazy, lids).backward()
    loss(table, ids).backward()
    recorded, rewritten = irt.dump(lazy.grad), irt.dump(lazy.grad, format="rewritten")
    assert "ir::annotate" not in recorded
    lines = rewritten.splitlines()
    backward = next(line for line in lines if "aten::embedding_dense_backward" in line)
    ids_read = backward.split("(")[1].split(")")[0].split(", ")[1]  # its second operand
    read = next(line for line in lines if line.startswith(ids_read + " = "))
    replicated = "ir::annotate" in read and "sharding=ShardingSpec.replicated(" in read
    assert replicated == whole, rewritten
    tol = dict(rtol=1e-5, atol=1e-6) if dtype is None else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(irt.to_torch(lazy.grad), table.grad, **tol)


def test_ids_an_fsdp_table_shares_with_a_whole_one_stay_as_placed():
    # One ids tensor indexing a table split over every device and a whole one: reading the
    # ids whole would gather them for the whole table's gradient too (data parallel's
    # all-gather for nothing), so neither gradient's ids are annotated.
    a, b = torch.randn(64, 16), torch.randn(64, 16)
    ids = torch.randint(0, 64, (8, 4))
    la, lb = irt.to_lazy(a), irt.to_lazy(b)
    irt.mark_sharding(la, MESH, (("data", "model"), None))
    la.requires_grad_(), lb.requires_grad_()
    lids = irt.to_lazy(ids)
    irt.mark_sharding(lids, MESH, ("data", None))
    F = torch.nn.functional
    (F.embedding(lids, la) * F.embedding(lids, lb)).sum().backward()
    assert "ir::annotate" not in irt.dump([la.grad, lb.grad], format="rewritten")
    ea, eb = a.clone().requires_grad_(), b.clone().requires_grad_()
    (F.embedding(ids, ea) * F.embedding(ids, eb)).sum().backward()
    torch.testing.assert_close(irt.to_torch(la.grad), ea.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(irt.to_torch(lb.grad), eb.grad, rtol=1e-5, atol=1e-6)


def _products(mesh):
    """Eager's and the lazy gradients of a step with torch's batched products (matmul of 4-d
    tensors, linear on a 3-d input: both merge the batch dims into one, a view, around bmm /
    mm), and the StableHLO of the lazy ones; ``mesh``: the inputs' batch placed over "data"."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 24)
    q, k, x = (torch.randn(*s, requires_grad=True) for s in ((4, 4, 8, 16),) * 2 + ((4, 8, 16),))

    def f(q, k, x, lin):
        return (q @ k.transpose(-1, -2)).softmax(-1).sum() + lin(x).square().mean()

    lq, lk, lx = (irt.to_lazy(t.detach()) for t in (q, k, x))
    if mesh is not None:
        for t in (lq, lk, lx):
            irt.mark_sharding(t, mesh, ("data",) + (None,) * (t.dim() - 1))
    for t in (lq, lk, lx):
        t.requires_grad_()
    llin = irt.to_lazy(copy.deepcopy(lin))
    f(q, k, x, lin).backward()
    f(lq, lk, lx, llin).backward()
    grads = [lq.grad, lk.grad, lx.grad, llin.weight.grad]
    text = irt.dump(grads, format="stablehlo")
    for got, want in zip(grads, [q.grad, k.grad, x.grad, lin.weight.grad], strict=True):
        torch.testing.assert_close(irt.to_torch(got), want, rtol=1e-5, atol=1e-6)
    return text


def test_batched_products_keep_their_batch_dims_as_jax_writes_them_under_a_mesh():
    """Under a mesh, the products are one dot_general over the dims torch merged, apart (as
    jax.grad writes the same product, so XLA's partitioner sees the same graph)."""
    text = _products(MESH)
    assert "tensor<16x8x16xf32>" not in text and "tensor<32x16xf32>" not in text, text
    assert "batching_dims = [0, 1] x [0, 1]" in text, text
    assert "contracting_dims = [0, 1] x [0, 1]" in text, text  # the weight's gradient


def test_batched_products_on_one_device_are_matrix_products():
    """On one device, a linear layer's products, forward and backward, are matrix products of
    the batch flattened (what XLA's CPU emitter runs without copying a transposed operand);
    attention's batched products keep their batch dims."""
    text = _products(None)
    assert "contracting_dims = [0, 1]" not in text, text  # the weight's gradient: one dim
    assert "(tensor<32x24xf32>, tensor<32x16xf32>) -> tensor<24x16xf32>" in text, text
    assert "(tensor<32x16xf32>, tensor<24x16xf32>) -> tensor<32x24xf32>" in text, text
    assert "batching_dims = [0, 1] x [0, 1]" in text, text  # q @ k^T as before


def test_tensors_no_longer_alive_are_not_computed():
    irt.reset_metrics()
    x = irt.to_lazy(torch.ones(3))
    kept = x + 1.0
    dropped = x * 100.0
    del dropped
    irt.mark_step()
    # x, the 0-d input holding 1.0, and the add: nothing of the dropped tensor.
    assert irt.metrics()["timers"]["GraphNodes"]["last"] == 3
    assert torch.equal(irt.to_torch(kept), torch.full((3,), 2.0))


def test_in_place_ops_keep_torchs_rules():
    t = irt.to_lazy(torch.arange(4))  # int64
    with pytest.raises(RuntimeError, match=r"can't be cast|not possible"):  # meta's wording
        t.add_(1.5)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        irt.to_lazy(torch.ones(3)).add_(irt.to_lazy(torch.ones(2, 3)))
    assert torch.equal(irt.to_torch(t), torch.arange(4))  # the failed op changed nothing
    t.add_(2)
    assert torch.equal(irt.to_torch(t), torch.arange(4) + 2)


def test_metrics_count_decomposed_and_unsupported_ops_and_time_the_trace():
    irt.reset_metrics()
    x = irt.to_lazy(torch.randn(4, 4))
    torch.nn.functional.smooth_l1_loss(x, x * 2.0)  # no rule: torch's decomposition
    with pytest.raises(irt.UnsupportedOpError):
        x.to_sparse()
    irt.mark_step()
    irt.mark_step()
    m = irt.metrics()
    assert m["counters"]["Decomposed::aten::smooth_l1_loss.default"] == 1
    assert m["counters"]["Unsupported::aten::_to_sparse.default"] == 1
    assert m["timers"]["TraceTime"]["count"] >= 1
    assert "Decomposed::aten::smooth_l1_loss.default: 1" in irt.metrics_report()


SIBLINGS = [
    lambda t: (t[0], t[0], t[:, 1]),
    lambda t: (t.view(-1), t[1:], t.t()),
    lambda t: (t.detach(), t[2], t[0][1:]),
]


@pytest.mark.parametrize("views", SIBLINGS)
def test_a_write_through_one_view_shows_in_the_others(views):
    a = torch.arange(12.0).reshape(3, 4)
    b = irt.to_lazy(a.clone())
    va, vb = views(a), views(b)
    va[0].mul_(10.0)
    vb[0].mul_(10.0)
    same(b, a)
    for lazy_view, eager_view in zip(vb, va, strict=True):
        same(lazy_view, eager_view)


def test_keyword_and_positional_calls_record_the_same_node():
    """One preparation: a call with keyword arguments is laid out by position first, so it
    records what the positional call does (defaults included, lifted scalars alike)."""
    aten = torch.ops.aten
    x, y = irt.to_lazy(torch.randn(3, 4)), irt.to_lazy(torch.randn(3, 4))
    for positional, keywords in (
        ((x, y, 0.3), {}),
        ((x, y), {"alpha": 0.3}),
        ((x,), {"other": y, "alpha": 0.3}),
    ):
        key, operands, attrs = inspect.prepared(aten.add.Tensor, positional, keywords)
        want = inspect.prepared(aten.add.Tensor, (x, y, 0.3), {})
        assert key == want[0] and attrs == want[2]
        assert [v.node.dag_hash for v in operands] == [v.node.dag_hash for v in want[1]]
    got = aten.sum.dim_IntList(x, dim=[1], keepdim=True)
    assert irt.dump(got) == irt.dump(aten.sum.dim_IntList(x, [1], True))
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        inspect.prepared(aten.add.Tensor, (x, y), {"bogus": 1})


def test_the_live_registry_is_outside_the_cyclic_collector():
    """Each lazy tensor is registered by a weak reference without a callback (which cannot be
    part of a cycle), kept out of the cyclic collector; dead ones still drop out of live()."""
    import gc

    x = irt.to_lazy(torch.ones(3))
    ys = [x + 1.0 for _ in range(3)]  # the first through the Python path, the rest in C
    refs = [r for r in inspect.live_references() if any(r() is t for t in (x, *ys))]
    assert len(refs) == 4
    assert not any(gc.is_tracked(r) for r in refs)
    del ys
    alive = inspect.live_tensors()
    assert any(t is x for t in alive) and sum(1 for r in refs if r() is not None) == 1


def test_forward_passes_without_backward_leave_nothing_alive():
    """The autograd engine saves a result for backward as its detached alias; that alias must
    not hold the result (and its graph) alive once the output is dropped."""
    live = inspect.live_tensors

    model = irt.to_lazy(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()))
    x = irt.to_lazy(torch.randn(4, 8))
    counts = []
    for _ in range(30):
        out = model(x).sum()  # grad enabled, never backward
        irt.mark_step()
        out.item()
        counts.append(len(live()))
    assert counts[-1] <= counts[5], counts


def test_tied_weights_stay_tied_and_train_like_eager():
    torch.manual_seed(0)
    eager = torch.nn.ModuleDict(
        {"emb": torch.nn.Embedding(10, 8), "head": torch.nn.Linear(8, 10, bias=False)}
    )
    eager["head"].weight = eager["emb"].weight
    lazy = irt.to_lazy(copy.deepcopy(eager))
    assert lazy["head"].weight is lazy["emb"].weight
    assert len(list(lazy.parameters())) == 1
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (eager, lazy)]
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for _ in range(3):
        for m, opt, t in ((eager, opts[0], tokens), (lazy, opts[1], irt.to_lazy(tokens))):
            logits = m["head"](m["emb"](t))
            torch.nn.functional.cross_entropy(logits.reshape(-1, 10), t.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
        irt.mark_step()
    same(lazy["emb"].weight, eager["emb"].weight, rtol=1e-5, atol=1e-6)


def test_a_storage_is_shared_by_a_tensor_its_views_and_aliases_as_on_the_cpu():
    """What safetensors and save_pretrained ask of a storage: which tensors share memory, and
    where each starts in it (tied weights saved once, slices told apart), as on the CPU; a
    storage's identity is never reused."""
    e = torch.arange(12.0).reshape(3, 4)
    x = irt.to_lazy(e)
    assert x.data_ptr() == x.untyped_storage().data_ptr() != 0
    views = (
        lambda t: t.detach(),
        lambda t: t.data,
        torch.nn.Parameter,
        lambda t: t[1],
        lambda t: t.t(),
        lambda t: t[:, 2],
        lambda t: t.view(12)[5:],
        lambda t: t.view(-1)[-1],
    )
    for view in views:
        lazy, eager = view(x), view(e)
        assert lazy.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert lazy.data_ptr() - x.data_ptr() == eager.data_ptr() - e.data_ptr()
        assert lazy.untyped_storage().nbytes() == eager.untyped_storage().nbytes() == 48
    other = irt.to_lazy(torch.zeros(3, 4))
    assert other.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert not x.is_shared()
    with pytest.raises(RuntimeError, match="no host memory to share"):
        x.share_memory_()
    seen = set()
    for _ in range(50):  # made and dropped: a new tensor at a freed address is a new storage
        seen.add(irt.to_lazy(torch.zeros(2)).data_ptr())
    assert len(seen) == 50


def test_module_to_a_dtype_converts_the_values():
    torch.manual_seed(0)
    eager = torch.nn.Linear(4, 3)
    lazy = irt.to_lazy(torch.nn.Linear(4, 3))
    lazy.load_state_dict(eager.state_dict())
    eager.to(torch.bfloat16)
    lazy.to(torch.bfloat16)
    assert lazy.weight.dtype == torch.bfloat16 and irt.to_torch(lazy.weight).dtype == torch.bfloat16
    assert torch.equal(irt.to_torch(lazy.weight), eager.weight.detach())
    x = torch.randn(2, 4).bfloat16()
    out = lazy(irt.to_lazy(x))
    assert out.dtype == torch.bfloat16
    same(out.float(), eager(x).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_gradients_in_both_modes(training):
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm1d(5)
    with torch.no_grad():
        eager.running_mean.uniform_(-1, 1)
        eager.running_var.uniform_(0.5, 2.0)
        eager.weight.uniform_(0.5, 1.5)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    eager.train(training)
    lazy.train(training)
    x = torch.randn(8, 5)
    w = torch.randn(8, 5)
    (eager(x) * w).sum().backward()
    lx = irt.to_lazy(x).requires_grad_()
    (lazy(lx) * irt.to_lazy(w)).sum().backward()
    same(
        lx.grad,
        torch.autograd.grad((eager(x.requires_grad_()) * w).sum(), x)[0],
        rtol=1e-4,
        atol=1e-5,
    )
    same(lazy.weight.grad, eager.weight.grad, rtol=1e-4, atol=1e-5)
    same(lazy.bias.grad, eager.bias.grad, rtol=1e-4, atol=1e-5)


def test_views_held_by_the_user_see_writes_to_their_base():
    torch.manual_seed(0)
    eager = torch.nn.Linear(4, 3)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    views_e = [eager.weight.detach(), eager.weight[1], eager.weight.t()[:, :2]]
    views_l = [lazy.weight.detach(), lazy.weight[1], lazy.weight.t()[:, :2]]
    opts = [torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.5) for m in (eager, lazy)]
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, opt, xx in ((eager, opts[0], x), (lazy, opts[1], irt.to_lazy(x))):
            m(xx).square().sum().backward()
            opt.step()
            opt.zero_grad()
        irt.mark_step()
    with torch.no_grad():
        eager.weight.mul_(2.0)
        lazy.weight.mul_(2.0)
    for v_l, v_e in zip(views_l, views_e, strict=True):
        same(v_l, v_e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("accumulate", [False, True])
def test_a_mask_assignment_of_a_broadcast_value_reads_nothing(accumulate):
    """``x[mask] = v`` with a mask over leading dims and a value that broadcasts over what each
    True element selects is a ``where``: eager's values, no count read from the device (a
    sampling loop's ``logits[logits < v[:, [-1]]] = -inf`` every token)."""
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(3, 4, 5, generator=g)
    cases = [
        (x0[..., 0] > 0, torch.randn(5, generator=g)),  # a row per True element
        (x0 > 0.5, torch.tensor(-float("inf") if not accumulate else 2.0)),  # 0-d
        (x0[:, 0, 0] < 0, torch.randn(1, 5, generator=g)),  # a block, broadcast over dim 1
        (x0[..., 0] > 9, torch.randn(1)),  # no True element
    ]
    for mask, v in cases:
        e = x0.clone().index_put_((mask,), v, accumulate=accumulate)
        x = irt.to_lazy(x0.clone())
        before = irt.metrics()["counters"].get("DataDependentSync", 0)
        x.index_put_((irt.to_lazy(mask),), irt.to_lazy(v), accumulate=accumulate)
        assert irt.metrics()["counters"].get("DataDependentSync", 0) == before
        torch.testing.assert_close(irt.to_torch(x), e)
    # A value of one element per True element still reads the count (its shape needs it).
    mask = x0 > 0
    v = torch.arange(float(mask.sum()))
    x = irt.to_lazy(x0.clone())
    before = irt.metrics()["counters"].get("DataDependentSync", 0)
    x[irt.to_lazy(mask)] = irt.to_lazy(v)
    torch.testing.assert_close(irt.to_torch(x), x0.clone().index_put_((mask,), v))
    assert irt.metrics()["counters"]["DataDependentSync"] == before + 1


def test_data_dependent_shapes_read_one_number_and_match_eager():
    """nonzero, masked_select and a boolean mask index give eager's values and gradients; each
    reads its size once (DataDependentSync), and the values stay on the device."""
    x0 = torch.tensor([[0.0, 1.5, -2.0], [3.0, 0.0, 0.25]])
    x = irt.to_lazy(x0).requires_grad_()
    e = x0.clone().requires_grad_()
    before = irt.metrics()["counters"].get("DataDependentSync", 0)
    assert torch.equal(irt.to_torch(torch.nonzero(x)), torch.nonzero(x0))
    picked = torch.masked_select(x, x > 0)
    masked = x[x < 1]
    loss = (picked * 2).sum() + (masked**2).sum()
    assert irt.metrics()["counters"]["DataDependentSync"] - before == 3
    loss.backward()  # masked_select's backward puts the gradient back through its mask
    ((torch.masked_select(e, e > 0) * 2).sum() + (e[e < 1] ** 2).sum()).backward()
    torch.testing.assert_close(irt.to_torch(picked), torch.masked_select(x0, x0 > 0))
    torch.testing.assert_close(irt.to_torch(masked), x0[x0 < 1])
    torch.testing.assert_close(irt.to_torch(x.grad), e.grad)
    counters = irt.metrics()["counters"]
    assert counters["DataDependentSync"] - before == 4
    assert counters["DataDependentSync::aten::masked_select"] >= 1
    values, inverse, counts = torch.unique(
        irt.to_lazy(torch.tensor([3, 1, 3, 2])), return_inverse=True, return_counts=True
    )
    want = torch.unique(torch.tensor([3, 1, 3, 2]), return_inverse=True, return_counts=True)
    for got, w in zip((values, inverse, counts), want, strict=True):
        assert torch.equal(irt.to_torch(got), w)


def _syncs():
    return irt.metrics()["counters"].get("DataDependentSync", 0)


def test_repeat_interleave_with_tensor_repeats_matches_eager():
    """Tensor repeats: with ``output_size`` nothing is read; without, their sum (one read).
    Values, dtypes and the gradient through ``dim`` are eager's; bad repeats are refused."""
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(4, 3, generator=g)
    for dtype in (torch.int64, torch.int32):
        reps = torch.tensor([2, 0, 3, 1], dtype=dtype)
        before = _syncs()
        got = torch.repeat_interleave(irt.to_lazy(reps), output_size=6)
        assert _syncs() == before
        assert torch.equal(irt.to_torch(got), torch.repeat_interleave(reps))
        got = torch.repeat_interleave(irt.to_lazy(reps))
        assert _syncs() == before + 1
        assert torch.equal(irt.to_torch(got), torch.repeat_interleave(reps))
    reps = torch.tensor([2, 0, 3, 1])
    x, e = irt.to_lazy(x0).requires_grad_(), x0.clone().requires_grad_()
    cot = torch.randn(6, 3, generator=g)
    out = torch.repeat_interleave(x, irt.to_lazy(reps), dim=0, output_size=6)
    want = torch.repeat_interleave(e, reps, dim=0)
    torch.testing.assert_close(irt.to_torch(out), want.detach())
    (out * irt.to_lazy(cot)).sum().backward()
    (want * cot).sum().backward()
    torch.testing.assert_close(irt.to_torch(x.grad), e.grad)
    with pytest.raises(RuntimeError, match="repeats can not be negative"):
        torch.repeat_interleave(irt.to_lazy(torch.tensor([1, -1])))
    with pytest.raises(RuntimeError, match="Long or Int"):
        torch.repeat_interleave(irt.to_lazy(torch.tensor([1.0, 2.0])))


def test_bincount_reads_its_length_and_matches_eager():
    ids = torch.tensor([0, 3, 1, 3, 3, 7])
    for weights in (None, torch.linspace(0, 1, 6), torch.linspace(0, 1, 6).half(), ids * 2):
        for minlength in (0, 4, 11):
            want = torch.bincount(ids, weights, minlength)
            before = _syncs()
            lw = None if weights is None else irt.to_lazy(weights)
            got = torch.bincount(irt.to_lazy(ids), lw, minlength)
            assert _syncs() == before + 1
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(irt.to_torch(got), want)
    empty = torch.zeros(0, dtype=torch.int64)
    assert torch.equal(
        irt.to_torch(torch.bincount(irt.to_lazy(empty), minlength=3)),
        torch.zeros(3, dtype=torch.int64),
    )
    with pytest.raises(RuntimeError, match="non-negative integral"):
        torch.bincount(irt.to_lazy(torch.tensor([0, -1])))
    with pytest.raises(RuntimeError, match="non-negative integral"):
        torch.bincount(irt.to_lazy(torch.tensor([0.0, 1.0])))


def test_in_place_overloads_record_the_functional_overload_of_the_same_arguments():
    """pow_.Scalar is pow.Tensor_Scalar (pow.Scalar takes its operands the other way round):
    an in-place op is recorded as the overload with its argument names and types."""
    _functional = inspect.functional_of
    aten = torch.ops.aten
    assert _functional(aten.pow_.Scalar) is aten.pow.Tensor_Scalar
    assert _functional(aten.float_power_.Scalar) is aten.float_power.Tensor_Scalar
    assert _functional(aten.dropout_.default) is aten.dropout.default
    assert _functional(aten.add_.Tensor) is aten.add.Tensor
    x0 = torch.tensor([0.5, 2.0, 3.0], dtype=torch.float64)
    for op in (lambda t: t.pow_(3), lambda t: t.float_power_(2.5), lambda t: t.squeeze_()):
        x = irt.to_lazy(x0.clone())
        op(x)
        torch.testing.assert_close(irt.to_torch(x), op(x0.clone()))


def test_in_place_shape_ops_change_the_tensors_shape():
    a = torch.arange(6.0).reshape(2, 3)
    for op in (
        lambda t: t.unsqueeze_(0),
        lambda t: t.t_(),
        lambda t: t.transpose_(0, 1),
        lambda t: t.resize_(3, 2),
        lambda t: t.as_strided_((3,), (2,)),
    ):
        x = irt.to_lazy(a.clone())
        op(x)
        want = op(a.clone())
        assert x.shape == want.shape
        assert torch.equal(irt.to_torch(x), want)
    # matmul of a 1-D operand squeezes its product in place inside torch
    v, m = torch.randn(3), torch.randn(3, 4)
    got = irt.to_torch(irt.to_lazy(v) @ irt.to_lazy(m))
    assert got.shape == (4,)
    torch.testing.assert_close(got, v @ m)


def test_torch_lazy_mark_step_is_this_devices_step():
    """torch's own helpers sync the lazy device with torch._lazy.mark_step()."""
    x = irt.to_lazy(torch.ones(3)) * 2
    steps = irt.metrics()["counters"].get("ExecuteCount", 0)
    torch._lazy.mark_step()
    torch._lazy.wait_device_ops()
    assert inspect.data_of(x) is not None
    assert irt.metrics()["counters"]["ExecuteCount"] == steps + 1
    assert torch.equal(irt.to_torch(x), torch.full((3,), 2.0))


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.sum(0),
        lambda t: t.mean(-1),
        lambda t: t.amax(0),
        lambda t: t.argmax(0),
        lambda t: t.cumsum(0),
        lambda t: torch.logsumexp(t, 0),
        lambda t: t.max(0).values,
        lambda t: t.max(-1).indices,
        lambda t: t.index_select(0, torch.tensor([0])),
        lambda t: (t > 0).all(0),
        lambda t: (t > 0).any(-1),
        lambda t: t.var(0, correction=0),
        lambda t: t.gather(0, torch.tensor(0)),
    ],
)
def test_reductions_and_indexing_take_dim_0_and_minus_1_on_0_d_tensors(op):
    t = torch.tensor(1.25)
    got = op(irt.to_lazy(t))
    want = op(t)
    out = irt.to_torch(got)
    assert out.shape == want.shape and out.dtype == want.dtype
    torch.testing.assert_close(out, want, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_python_numbers_are_lifted_in_the_tensors_precision(dtype):
    """A complex number has no attribute encoding: it is a lifted leaf, complex128 beside
    double precision (and a float beside a complex tensor keeps that precision too)."""
    x0 = torch.tensor([1 + 2j, 3 - 1j], dtype=dtype)
    for op in (
        lambda t: t * 1j,
        lambda t: t + (2 - 1j),
        lambda t: torch.mul(t, 0.1),
        lambda t: torch.add(t, 0.7, alpha=0.3 + 1j),
        lambda t: t.real * (0.1 + 0.3j),
    ):
        got, want = irt.to_torch(op(irt.to_lazy(x0))), op(x0)
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


def test_unreduced_margin_losses_of_a_1_d_input_are_0_d_as_on_the_cpu():
    """torch's meta kernels say [1] here; the CPU kernel (the oracle) gives []."""
    x, t = torch.randn(5), torch.tensor(2)
    labels = torch.tensor([3, 0, -1, 1, 1])
    for loss, target in (
        (torch.nn.functional.multi_margin_loss, t),
        (torch.nn.functional.multilabel_margin_loss, labels),
    ):
        want = loss(x, target, reduction="none")
        got = irt.to_torch(loss(irt.to_lazy(x), irt.to_lazy(target), reduction="none"))
        assert got.shape == want.shape == ()
        torch.testing.assert_close(got, want)


def test_writes_through_real_imag_and_view_as_real_reach_the_complex_tensor():
    x0 = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex128)
    for write in (
        lambda t: t.real.mul_(2),
        lambda t: t.imag.add_(1),
        lambda t: torch.view_as_real(t)[:, 1].mul_(3),
    ):
        want, got = x0.clone(), irt.to_lazy(x0.clone())
        write(want)
        write(got)
        assert torch.equal(irt.to_torch(got), want)
    # complex QR's backward writes through view_as_real
    a = torch.randn(4, 3, dtype=torch.complex128, requires_grad=True)
    lazy = irt.to_lazy(a.detach()).requires_grad_()
    for m in (a, lazy):
        q, r = torch.linalg.qr(m)
        (q.abs().sum() + r.abs().sum()).backward()
    torch.testing.assert_close(irt.to_torch(lazy.grad), a.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_a_lazy_tensor_keeps_its_value_when_its_host_source_is_written(dtype):
    """jax places a numpy array on a CPU device without copying it: the front end copies host
    memory first, so writing the host tensor afterwards changes no lazy value."""
    t = torch.arange(4).to(dtype)
    x = irt.to_lazy(t)
    y = irt.to_lazy(torch.zeros(4, dtype=dtype)) + t  # a host operand, read when recorded
    irt.mark_step()
    t.add_(10)
    want = torch.arange(4).to(dtype)
    assert torch.equal(irt.to_torch(x), want)
    assert torch.equal(irt.to_torch(y), want)


def test_a_host_read_runs_the_pending_tensors_that_share_its_graph_once():
    """Reading a tensor computes it with every live pending tensor whose graph shares a node
    with it, so nothing later runs that history again; unrelated pending work stays pending."""
    x, y = irt.to_lazy(torch.arange(4.0)), irt.to_lazy(torch.ones(4))
    a = x * 2.0
    b = a + 1.0
    c = a * 3.0  # shares a with b
    d = y + 1.0  # shares only a data leaf with b (the lifted 1.0): nothing computed
    irt.reset_metrics()
    assert b.sum().item() == 16.0
    counters = irt.metrics()["counters"]
    assert (counters["HostRead"], counters["ExecuteCount"]) == (1, 1)
    assert counters["HostReadTensors"] == 4  # the sum, a, b and c
    assert all(inspect.data_of(t) is not None for t in (a, b, c))
    assert inspect.data_of(d) is None
    assert torch.equal(irt.to_torch(c), torch.arange(4.0) * 6)  # no program: it is data
    assert irt.metrics()["counters"]["ExecuteCount"] == 1
    irt.mark_step()  # only d is left
    assert irt.metrics()["counters"]["ExecuteCount"] == 2
    assert torch.equal(irt.to_torch(d), torch.full((4,), 2.0))


def test_a_decoding_loop_runs_one_tokens_program_per_read():
    """The shape of generation: a state carried from step to step, a flag read every step.
    Each read's program holds that step only, so its size does not grow with the steps."""
    state = irt.to_lazy(torch.zeros(3))
    irt.mark_step()
    irt.reset_metrics()
    sizes = []
    for _ in range(6):
        state = torch.tanh(state + 1.0) * 0.5
        done = (state > 10.0).all()
        sizes.append(len(irt.dump(done).splitlines()))  # the graph the read will run
        assert not bool(done)
    assert len(set(sizes)) == 1, sizes
    counters = irt.metrics()["counters"]
    assert (counters["CompileCount"], counters["CacheHit"]) == (1, 5)  # one program, reused
    assert counters["HostReadTensors"] == 12  # each read: the flag and the new state


def test_a_write_in_place_keeps_the_tensors_placement():
    """``u.copy_(host)`` changes ``u``'s value, not where it lives (torch_xla's ``copy_`` keeps
    its destination's sharding): its next result lands sharded, as before the write."""
    t = irt.to_lazy(torch.arange(8.0))
    irt.mark_sharding(t, MESH, ("data",))
    u = t * 2  # not annotated: lands where XLA puts it, sharded like t
    irt.mark_step()
    placed = inspect.data_of(u).sharding
    assert not placed.is_fully_replicated
    u.copy_(torch.ones(8))
    u.add_(t)
    irt.mark_step()
    assert inspect.data_of(u).sharding.is_equivalent_to(placed, 1)
    assert irt.to_torch(u).tolist() == (torch.ones(8) + torch.arange(8.0)).tolist()


def test_out_arguments_record_their_functional_form_and_spectral_norm_equals_eager():
    """``torch.div(a, b, out=o)`` and friends rebind ``o`` to the functional op's value
    (``div.out`` -> ``div.Tensor``, matched by its arguments); ``spectral_norm``'s power
    iteration writes its vectors that way."""
    a0, b0 = torch.arange(1.0, 5.0), torch.tensor([2.0, -2.0, 4.0, 8.0])
    a, b = irt.to_lazy(a0), irt.to_lazy(b0)
    for op, kw in (
        (torch.div, {}),
        (torch.div, {"rounding_mode": "floor"}),
        (torch.add, {"alpha": 3}),
        (torch.sub, {"alpha": 2}),
        (torch.mul, {}),
    ):
        o = irt.to_lazy(torch.zeros(4))
        op(a, b, out=o, **kw)
        assert torch.equal(irt.to_torch(o), op(a0, b0, **kw)), (op, kw)
    torch.manual_seed(0)
    eager = torch.nn.utils.spectral_norm(torch.nn.Linear(4, 3))
    lazy = irt.to_lazy(copy.deepcopy(eager))
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(3):  # each training forward runs one power iteration, writing u and v
        torch.testing.assert_close(irt.to_torch(lazy(irt.to_lazy(x))), eager(x))
    torch.testing.assert_close(irt.to_torch(lazy.weight_u), eager.weight_u)


def test_first_contact_a_module_moved_to_the_lazy_device_after_init_trains(tmp_path):
    """In a fresh process, as a new user writes it: init, then .to("lazy") (the front end
    installs itself), a step, and the values eager gives."""
    script = tmp_path / "first.py"
    script.write_text(
        "import torch\n"
        "import ir_runtime as irt\n"
        "irt.init(cpu_devices=2)\n"
        "torch.manual_seed(0)\n"
        "eager = torch.nn.Linear(4, 2)\n"
        "lazy = torch.nn.Linear(4, 2)\n"
        "lazy.load_state_dict(eager.state_dict())\n"
        "lazy = lazy.to('lazy')\n"
        "x = torch.randn(3, 4)\n"
        "for m, t in ((eager, x), (lazy, x.to('lazy'))):\n"
        "    opt = torch.optim.SGD(m.parameters(), lr=0.5)\n"
        "    m(t).square().sum().backward()\n"
        "    opt.step()\n"
        "print(type(lazy.weight).__name__, lazy.weight.device)\n"
        "print(torch.allclose(lazy.weight.cpu(), eager.weight, atol=1e-6))\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["LazyTensor lazy:0", "True"]


def test_a_subtraction_with_a_bool_operand_is_refused_as_eager_refuses_it():
    """torch's sub_check, which its meta kernel skips for a number operand: at the call."""
    b, f = torch.tensor([True, False]), torch.tensor([1.0, 2.0])
    for x, y in ((b, b), (b, True), (f, True), (b, 1), (b, 1.5)):
        for op in (torch.sub, torch.rsub):
            with pytest.raises(RuntimeError) as eager:
                op(x, y)
            with pytest.raises(RuntimeError) as lazy:
                op(irt.to_lazy(x), irt.to_lazy(y) if isinstance(y, torch.Tensor) else y)
            assert str(lazy.value) == str(eager.value)
    same(torch.sub(irt.to_lazy(f), 1), f - 1)


@torch.library.custom_op("ir_runtime_tests::scaled_sin", mutates_args=())
def _scaled_sin(t: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(t) * scale


@_scaled_sin.register_fake
def _scaled_sin_fake(t, scale):
    return torch.empty_like(t)


def test_another_librarys_op_runs_its_kernel_on_lazy_tensors():
    """A torch.library.custom_op (one kernel for every device) records its ops, as eager runs
    them; an op with no kernel for this device is still refused by name."""
    x = torch.randn(4, 3)
    got = _scaled_sin(irt.to_lazy(x), 2.5)
    assert isinstance(got, irt.LazyTensor)
    torch.testing.assert_close(irt.to_torch(got), torch.sin(x) * 2.5)
    lib = torch.library.Library("ir_runtime_tests", "FRAGMENT")
    lib.define("cpu_only(Tensor t) -> Tensor")
    lib.impl("cpu_only", lambda t: t + 1, "CPU")
    with pytest.raises(irt.UnsupportedOpError, match="ir_runtime_tests::cpu_only"):
        torch.ops.ir_runtime_tests.cpu_only(irt.to_lazy(x))


class _Tagged(torch.Tensor):
    """A wrapper subclass of another library: its own __torch_dispatch__ unwraps and re-wraps."""

    @staticmethod
    def __new__(cls, inner):
        r = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=inner.device
        )
        r.inner = inner
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        def unwrap(t):
            return t.inner if isinstance(t, _Tagged) else t

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda t: _Tagged(t) if isinstance(t, torch.Tensor) else t, out)


def test_a_foreign_wrapper_beside_a_lazy_tensor_gets_its_own_dispatch():
    """torch's protocol: the lazy dispatch returns NotImplemented for an argument of another
    __torch_dispatch__ class (which it cannot read as a host tensor), and that class's runs."""
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    bias = torch.randn(2)
    got = torch.addmm(irt.to_lazy(bias), _Tagged(irt.to_lazy(a)), irt.to_lazy(b))
    assert isinstance(got, _Tagged) and isinstance(got.inner, irt.LazyTensor)
    torch.testing.assert_close(irt.to_torch(got.inner), torch.addmm(bias, a, b))


def test_a_tensor_written_by_another_thread_while_a_step_runs_keeps_what_was_written(
    monkeypatch,
):
    """A loader's thread moves a batch to the device: torch's ``.to`` is ``empty()`` on the
    device (a pending tensor) then ``copy_``. When the main thread's step takes the pending
    ``empty()`` as a root between the two and its program finishes after the copy, the batch
    keeps the copied values (the step's zeros are of the value it replaced); the rest of the
    step is bound as usual. The interleaving is forced with two events."""
    import threading

    from ir_runtime._frontend.steps import _step

    taken, written = threading.Event(), threading.Event()
    real = _step.run_graph

    def run_graph(roots, *args, **kwargs):
        taken.set()  # the step has its roots: the other thread writes now
        assert written.wait(30)
        return real(roots, *args, **kwargs)

    monkeypatch.setattr(_step, "run_graph", run_graph)
    batch = torch.arange(12.0).reshape(4, 3)
    other = irt.to_lazy(torch.ones(2)) * 3  # pending work of the main thread's step
    placeholder = torch.empty(4, 3, device="lazy")
    assert _step.pending(placeholder)

    def loader():
        assert taken.wait(30)
        placeholder.copy_(batch)
        written.set()

    thread = threading.Thread(target=loader)
    thread.start()
    irt.mark_step()
    thread.join()
    monkeypatch.undo()
    assert torch.equal(irt.to_torch(placeholder), batch)
    assert torch.equal(irt.to_torch(other), torch.full((2,), 3.0))
    assert not _step.pending(other)
