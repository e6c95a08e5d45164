"""Execution: results against numpy, sharded runs against the unsharded run, placement of
results, donation, lowering text."""

import ml_dtypes
import numpy as np
import pytest
from models import data, leaf, linear_sgd_step, numpy_sgd_step, params

import ir_runtime as irt
from ir_core import DeviceData, Generic, Shape, Value
from ir_sharding import Mesh, ShardingKind, ShardingSpec, with_sharding

N_IN, N_OUT, BATCH = 16, 8, 32


def run_step(x, y, w, b, xs=None, ws=None, bs=None):
    roots = linear_sgd_step(leaf(x, xs), leaf(y, xs), leaf(w, ws), leaf(b, bs))
    return [irt.to_host(r) for r in irt.execute(roots)]


def test_unsharded_step_matches_numpy():
    x, y = data(0, BATCH, N_IN, N_OUT)
    w, b = params(0, N_IN, N_OUT)
    got = run_step(x, y, w, b)
    for g, want in zip(got, numpy_sgd_step(x, y, w, b), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


MESHES = {
    "8x1": (Mesh(range(8), (8, 1), ("data", "model")), ("data", None), (None, "model")),
    "4x2": (Mesh(range(8), (4, 2), ("data", "model")), ("data", None), (None, "model")),
    "2x2x2": (
        Mesh([3, 1, 0, 2, 7, 5, 4, 6], (2, 2, 2), ("a", "b", "c")),
        (("a", "b"), None),
        ("c", None),
    ),
    "partial": (Mesh(range(8), (4, 2), ("data", "model")), (None, None), ("model", None)),
}


@pytest.mark.parametrize("name", sorted(MESHES))
def test_sharded_step_equals_unsharded(name):
    mesh, x_spec, w_spec = MESHES[name]
    x, y = data(1, BATCH, N_IN, N_OUT)
    w, b = params(1, N_IN, N_OUT)
    plain = run_step(x, y, w, b)
    xs, ws = ShardingSpec(mesh, x_spec), ShardingSpec(mesh, w_spec)
    sharded = run_step(x, y, w, b, xs=xs, ws=ws)
    for a, c in zip(sharded, plain, strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


def test_results_carry_where_xla_put_them():
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    ws = ShardingSpec(mesh, (None, "model"))
    x, y = data(2, BATCH, N_IN, N_OUT)
    w, b = params(2, N_IN, N_OUT)
    roots = linear_sgd_step(
        leaf(x, ShardingSpec(mesh, ("data", None))), leaf(y), leaf(w, ws), leaf(b)
    )
    roots[0] = with_sharding(roots[0], ws)  # pin the new W where the old one was
    new_w, new_b, loss = irt.execute(roots)
    assert new_w.sharding == ws
    assert loss.sharding is None  # replicated over the program's devices
    for out in (new_w, new_b, loss):
        spec = out.sharding or ShardingSpec.replicated(mesh)
        theirs = {
            d.id: tuple(s.indices(n)[:2] for s, n in zip(idx, out.shape.dims, strict=True))
            for d, idx in out.handle.sharding.devices_indices_map(out.shape.dims).items()
        }
        ours = {
            d: tuple(s.indices(n)[:2] for s, n in zip(idx, out.shape.dims, strict=True))
            for d, idx in spec.device_indices(out.shape.dims).items()
        }
        assert theirs == ours


def test_interior_sharding_becomes_a_constraint_and_lowering_is_visible():
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    x = leaf(np.ones((8, 4)))
    h = Value(Generic("aten::mul.Scalar", [x], [x.shape], {"other": 3.0}))
    h = with_sharding(h, ShardingSpec(mesh, ("data", None)))
    out = Value(Generic("aten::add.Scalar", [h], [x.shape], {"other": 1.0, "alpha": 1}))
    text = irt.lower([out])
    assert "sharding_constraint" in text or "sdy.sharding_constraint" in text
    assert "stablehlo.multiply" in text
    (result,) = irt.execute([out])
    np.testing.assert_array_equal(irt.to_host(result), np.full((8, 4), 4.0, np.float32))


def test_int64_and_float64_stay_64_bit():
    big = np.array([2**40, -(2**40) + 3], np.int64)
    x = Value(DeviceData(Shape("int64", (2,)), handle=big))
    y = Value(Generic("aten::add.Scalar", [x], [Shape("int64", (2,))], {"other": 1, "alpha": 1}))
    (out,) = irt.execute([y])
    assert irt.to_host(out).dtype == np.int64
    np.testing.assert_array_equal(irt.to_host(out), big + 1)


def test_donated_buffers_are_reused_and_marked():
    w = irt.to_device(np.ones((4, 4), np.float32))
    out = Value(Generic("aten::mul.Scalar", [Value(w)], [w.shape], {"other": 2.0}))
    (res,) = irt.execute([out], donate=[w])
    assert w.handle.is_deleted()
    np.testing.assert_array_equal(irt.to_host(res), np.full((4, 4), 2.0, np.float32))
    with pytest.raises(irt.ExecutionError, match="deleted"):
        irt.execute([out])


def test_to_device_places_per_spec():
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    spec = ShardingSpec(mesh, ("data", "model"))
    d = irt.to_device(np.arange(32, dtype=np.float32).reshape(8, 4), spec)
    assert d.sharding is spec and spec.kind is ShardingKind.TILED
    shards = {s.device.id: s.data.shape for s in d.handle.addressable_shards}
    assert shards == dict.fromkeys(range(8), (2, 2))


def test_specs_with_one_placement_and_different_ranks_convert_separately():
    # On an 8x1 mesh, (None, "model") splits nothing: it places a matrix exactly as the
    # replicated spec places a vector. Each must still convert for its own rank.
    mesh = Mesh(range(8), (8, 1), ("data", "model"))
    matrix_spec, vector_spec = ShardingSpec(mesh, (None, "model")), ShardingSpec.replicated(mesh)
    assert matrix_spec == vector_spec
    m = leaf(np.ones((4, 3)), matrix_spec)
    v = leaf(np.arange(3), vector_spec)
    out = Value(Generic("aten::add.Tensor", [m, v], [m.shape], {"alpha": 1}))
    (res,) = irt.execute([out])
    np.testing.assert_array_equal(irt.to_host(res), np.ones((4, 3)) + np.arange(3))


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("aten::t.default", {}),
        ("aten::transpose.int", {"dim0": -1, "dim1": 0}),
        ("aten::permute.default", {"dims": (1, 0)}),
    ],
)
def test_a_transposed_product_is_computed_as_the_swapped_product(op, attrs):
    rng = np.random.default_rng(0)
    a, b = (
        rng.standard_normal((5, 3)).astype(np.float32),
        rng.standard_normal((3, 4)).astype(np.float32),
    )
    la, lb = leaf(a), leaf(b)
    prod = Value(Generic("aten::mm.default", [la, lb], [Shape("float32", (5, 4))]))
    out = Value(Generic(op, [prod], [Shape("float32", (4, 5))], attrs))
    (res,) = irt.execute([out])
    np.testing.assert_allclose(irt.to_host(res), (a @ b).T, rtol=1e-5)
    assert "transpose" not in irt.lower([out]).split("dot_general")[-1]
    # With a second use of the product, both are computed as written.
    other = Value(Generic("aten::neg.default", [prod], [prod.shape]))
    r1, r2 = irt.execute([out, other])
    np.testing.assert_allclose(irt.to_host(r1), (a @ b).T, rtol=1e-5)
    np.testing.assert_allclose(irt.to_host(r2), -(a @ b), rtol=1e-5)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("bias", [None, (0.5, 2.0), (0.0, -1.0)])
def test_products_of_transposed_operands_fold_into_one_dot(ta, tb, bias):
    """mm / addmm of transposed operands (t, t(t(..)), permute) lower as one dot_general of the
    operands themselves, with eager's values (addmm's beta and alpha, a NaN bias ignored at
    beta 0, as torch does)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5) if ta else (5, 3)).astype(np.float32)
    b = rng.standard_normal((4, 3) if tb else (3, 4)).astype(np.float32)

    def t(v, twice=False):
        s = v.shape
        once = Value(Generic("aten::t.default", [v], [Shape("float32", s.dims[::-1])]))
        if not twice:
            return once
        return Value(Generic("aten::permute.default", [once], [s], {"dims": (1, 0)}))

    la, lb = leaf(a), leaf(b)
    la, lb = t(la) if ta else t(la, twice=True), t(lb) if tb else lb
    want = (a.T if ta else a) @ (b.T if tb else b)
    if bias is None:
        out = Value(Generic("aten::mm.default", [la, lb], [Shape("float32", (5, 4))]))
    else:
        beta, alpha = bias
        c = np.full((4,), np.nan if beta == 0 else 1.5, np.float32)
        attrs = {"beta": beta, "alpha": alpha}
        out = Value(
            Generic("aten::addmm.default", [leaf(c), la, lb], [Shape("float32", (5, 4))], attrs)
        )
        want = alpha * want + (0 if beta == 0 else beta * c)
    (res,) = irt.execute([out])
    np.testing.assert_allclose(irt.to_host(res), want, rtol=1e-5, atol=1e-6)
    text = irt.lower([out])
    assert text.count("dot_general") == 1 and "transpose" not in text, text


def test_an_fsdp_weight_is_gathered_once_for_its_forward_and_backward():
    """A Linear's weight split FSDP-style over all 8 devices is all-gathered once per step (the
    forward's and the backward's dots read the weight itself, not two layouts of it), and the
    step's temporaries stay at most what jax.grad's own step of the same MLP takes."""
    import re

    import jax
    import jax.numpy as jnp
    import torch
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from ir_runtime._executable import memory_of
    from ir_runtime._frontend import inspect

    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    fsdp = ("data", "model")
    d = 256
    torch.manual_seed(0)
    up, down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
    model = irt.to_lazy(torch.nn.Sequential(up, torch.nn.GELU(), down))
    for p in model.parameters():
        irt.mark_sharding(p, mesh, (fsdp,) + (None,) * (p.dim() - 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = irt.to_lazy(torch.randn(8, 32, d))
    irt.mark_sharding(x, mesh, ("data", None, None))
    model(x).square().mean().backward()
    opt.step()
    irt.mark_step()
    exe = inspect.last_executable()
    text = exe.compiled.as_text()
    weights = {(4 * d, d), (d, 4 * d)}
    gathered = [
        tuple(int(k) for k in m.group(1).split(","))
        for m in re.finditer(r"= f32\[([\d,]+)\]\{[\d,]*\} all-gather\(", text)
    ]
    assert len([s for s in gathered if s in weights]) <= 1, gathered

    jm = ShardingSpec(mesh, ()).to_jax().mesh
    shapes = {"w1": (4 * d, d), "b1": (4 * d,), "w2": (d, 4 * d), "b2": (d,)}
    sh = {k: NamedSharding(jm, P(fsdp, *([None] * (len(s) - 1)))) for k, s in shapes.items()}
    xs = NamedSharding(jm, P("data", None, None))

    def step(p, x):
        def loss(p):
            h = jax.nn.gelu(x @ p["w1"].T + p["b1"], approximate=False)
            return jnp.square(h @ p["w2"].T + p["b2"]).mean()

        return jax.tree.map(lambda a, g: a - 1e-3 * g, p, jax.grad(loss)(p))

    fn = jax.jit(step, in_shardings=(sh, xs), out_shardings=sh, donate_argnums=(0,))
    args = (
        {k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=sh[k]) for k, s in shapes.items()},
        jax.ShapeDtypeStruct((8, 32, d), jnp.float32, sharding=xs),
    )
    theirs = memory_of(fn.lower(*args).compile())
    assert exe.memory()["temporaries"] <= theirs["temporaries"], (exe.memory(), theirs)


def test_out_shardings_pin_results_and_key_the_cache():
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    rows, cols = ShardingSpec(mesh, ("data", None)), ShardingSpec(mesh, (None, "model"))
    x = leaf(np.arange(32, dtype=np.float32).reshape(8, 4))
    y = Value(Generic("aten::mul.Scalar", [x], [x.shape], {"other": 2.0}))
    irt.CACHE.clear()
    irt.reset_metrics()
    (a,) = irt.execute([y], out_shardings=[rows])
    (b,) = irt.execute([y], out_shardings=[cols])
    (c,) = irt.execute([y], out_shardings=[rows])
    assert (a.sharding, b.sharding, c.sharding) == (rows, cols, rows)
    assert irt.metrics()["counters"]["CompileCount"] == 2
    np.testing.assert_array_equal(irt.to_host(b), np.arange(32).reshape(8, 4) * 2)
    with pytest.raises(irt.LoweringError, match="out_shardings has 2 entries for 1 roots"):
        irt.execute([y], out_shardings=[rows, cols])
    with pytest.raises(ValueError, match=r"has 1 entries but root 0 \(float32\[8,4\]\) has rank 2"):
        irt.execute([y], out_shardings=[ShardingSpec(mesh, ("data",))])


def test_a_roots_own_annotation_wins_over_its_pin_and_chooses_the_mesh():
    """A root that carries an annotation lands there; its pin is not used at all, not even to
    choose the program's devices (a pin over other devices would make two device sets), and
    one that does not fit its rank is not an error."""
    low = Mesh(range(4), (4,), ("d",))
    high = Mesh(range(4, 8), (4,), ("d",))
    x = leaf(np.arange(8, dtype=np.float32))
    y = Value(Generic("aten::mul.Scalar", [x], [x.shape], {"other": 2.0}))
    on_high = ShardingSpec(high, ("d",))
    annotated = Value(with_sharding(y, on_high).node)
    for pin in (ShardingSpec(low, ("d",)), ShardingSpec(low, (None, "d"))):
        (r,) = irt.execute([annotated], out_shardings=[pin])
        assert r.sharding == on_high
        assert {d.id for d in r.handle.sharding.device_set} == {4, 5, 6, 7}
        np.testing.assert_array_equal(irt.to_host(r), np.arange(8) * 2)


def test_a_tuple_sharding_of_no_specs_is_no_mesh():
    from ir_sharding import TupleSharding

    x = leaf(np.array([3.0, 1.0, 2.0], np.float32))
    node = Generic(
        "aten::sort.default",
        [x],
        [x.shape, Shape("int64", (3,))],
        {"dim": -1, "descending": False},
        TupleSharding([None, None]),
    )
    values, indices = irt.execute([Value(node, 0), Value(node, 1)])
    assert irt.to_host(values).tolist() == [1.0, 2.0, 3.0]
    assert irt.to_host(indices).tolist() == [1, 2, 0]


def test_to_device_copies_the_array():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = irt.to_device(a)
    a += 10  # jax would place it on a CPU device without a copy
    np.testing.assert_array_equal(irt.to_host(d), np.arange(6).reshape(2, 3))


@pytest.mark.parametrize(
    "entries, host",
    [
        (("data", "model"), np.arange(32, dtype=np.float32).reshape(8, 4)),
        ((("data", "model"),), np.arange(16, dtype=np.int64)),
        ((None, "model"), np.arange(20, dtype=np.int32).reshape(5, 4)),
        (("model", "data"), np.arange(8, dtype=np.float64).reshape(2, 4)[:, ::-1]),  # strided
        ((), np.array(7, dtype=np.int64)),  # 0-d, replicated
        ((None,), np.array([True, False, True])),
        (("data",), np.arange(8, dtype=np.float32).astype(ml_dtypes.bfloat16)),
    ],
)
def test_placing_host_data_matches_jax_device_put(entries, host):
    """A host array placed as a spec (the per-device slices worked out once per shape) lands
    as jax.device_put places it: the same shards, on the same devices, with the same values;
    placing it again reuses that plan and still gives this array's values."""
    import jax

    from ir_runtime._data import put

    spec = ShardingSpec(Mesh(range(8), (4, 2), ("data", "model")), entries)
    want = jax.device_put(host, spec.to_jax())
    for value in (host, host + host):  # the second placement goes through the cached plan
        got = put(np.array(value), spec.to_jax())
        assert got.sharding == want.sharding and got.dtype == want.dtype
        assert [(s.device, s.index) for s in got.addressable_shards] == [
            (s.device, s.index) for s in want.addressable_shards
        ]
        np.testing.assert_array_equal(np.asarray(got), value)
        for s in got.addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), value[s.index])


def test_placing_unusual_host_data_is_checked_as_jax_checks_it():
    """What the cached placement cannot take (another byte order, a masked array, a spec longer
    than the array's rank) is jax.device_put's to convert or refuse, never placed wrong."""
    import jax

    from ir_runtime._data import put

    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    rows = ShardingSpec(mesh, ("data", None)).to_jax()
    for _ in range(2):  # the second time, a plan for the native array of this kind exists
        np.testing.assert_array_equal(
            np.asarray(put(np.arange(8.0).reshape(4, 2), rows)), np.arange(8.0).reshape(4, 2)
        )
        big = np.arange(8, dtype=">f4").reshape(4, 2)
        try:
            want = np.asarray(jax.device_put(big, rows))
        except TypeError:
            with pytest.raises(TypeError):
                put(big, rows)
        else:
            np.testing.assert_array_equal(np.asarray(put(big, rows)), want)
        with pytest.raises(ValueError):
            put(np.ma.masked_array(np.ones((4, 2)), mask=np.zeros((4, 2))), rows)
        with pytest.raises(ValueError):
            put(np.ones(4), rows)  # a 2-entry spec for a 1-D array
