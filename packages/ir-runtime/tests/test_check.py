"""The IR verifier (``ir_runtime.check_graph``, docs/dialect.md): each rule fires on a graph built
by hand to break it, every violation is reported at once with its node's op and line, a good
graph passes, a deep chain checks without recursion, and the cache runs it on misses only."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_core import DeviceData, Generic, OutputIndexError, Shape, Value
from ir_runtime import _check
from ir_runtime._lowering.regions.scan import Body, add_body
from ir_runtime._lowering.regions.shard_map import Region, add_region
from ir_sharding import Mesh, ShardingSpec, TupleSharding

F4 = Shape("float32", (4,))
MESH = Mesh(range(8), (4, 2), ("data", "model"))
KEY = Shape("uint32", (3,))
F8 = Shape("float32", (8,))


def leaf(shape=F4, handle=None, sharding=None):
    return Value(DeviceData(shape, handle, sharding))


def node(op, operands, shapes=(F4,), attrs=None, sharding=None, origin=None):
    return Generic(op, list(operands), list(shapes), attrs or {}, sharding, origin)


def rules(roots) -> list:
    return [v.rule for v in irt.check_graph(roots, raise_on_error=False)]


def fires(rule, roots, match=""):
    found = irt.check_graph(roots, raise_on_error=False)
    hits = [v for v in found if v.rule == rule]
    assert hits, f"{rule} did not fire; found {[str(v) for v in found]}"
    assert match in hits[0].message, hits[0].message
    return hits[0]


class Origin:
    """An origin as the front end's renders (``short()``)."""

    def short(self):
        return "model.py:12"


def scan_body():
    carry, param = DeviceData(F4), DeviceData(F4)
    root = Value(node("aten::mul.Tensor", [Value(carry), Value(param)]))
    return add_body(Body(root, carry, [param], [], None))


def region(roots_of=None):
    """A shard_map body over MESH's "data" axis: float32[2] per device -> its negation (or
    ``roots_of(placeholder)``)."""
    ph = DeviceData(Shape("float32", (2,)))
    roots = (
        roots_of(Value(ph))
        if roots_of
        else [Value(node("aten::neg.default", [Value(ph)], [ph.shape]))]
    )
    return add_region(Region(roots, [ph], [], None, MESH.axis_names))


def shard_map(name, shapes=(F8,), sharding="default", operand_shape=(8,)):
    spec = ((("data",),),)
    if sharding == "default":
        sharding = TupleSharding([ShardingSpec(MESH, ("data",))])
    attrs = {"body": name, "in_specs": spec, "out_specs": spec}
    x = leaf(Shape("float32", operand_shape))
    return Value(node("ir::shard_map", [x], shapes, attrs, sharding), 0)


# -- a good graph ------------------------------------------------------------------------------


def test_a_good_graph_has_no_violations():
    x = irt.to_device(np.ones((2, 3), np.float32))
    y = node("aten::mul.Scalar", [Value(x)], [x.shape], {"other": 2.0})
    z = node("aten::add.Tensor", [Value(y), Value(x), leaf(Shape("float32", ()))], [x.shape])
    z = z.clone(attrs={"__lifted__": ("alpha",)})
    idx = leaf(Shape("int64", (2,)))
    picked = node("aten::index.Tensor", [Value(z), idx], [x.shape], {"indexed": (False, True)})
    key = leaf(KEY, np.zeros(3, np.uint32))
    noise = node("ir::random_normal", [key], [x.shape], {"offset": 0, "mean": 0.0, "std": 1.0})
    spec = ShardingSpec(MESH, ("data", None))
    out = node("ir::annotate", [Value(picked)], [x.shape], {}, spec)
    both = node("ir::shard_alike", [Value(out), Value(noise)], [x.shape, x.shape])
    assert irt.check_graph([Value(both, 0), Value(both, 1)]) == []
    assert irt.check_graph(Value(y)) == []


def test_the_graphs_of_scan_and_shard_map_bodies_pass():
    x = leaf(F4)
    stacked = leaf(Shape("float32", (3, 4)))
    attrs = {"body": scan_body(), "params": 1, "layers": 3}
    scan = Value(node("ir::scan_layers", [x, stacked], [F4], attrs))
    assert rules([scan]) == []
    assert rules([shard_map(region())]) == []


# -- each rule fires ---------------------------------------------------------------------------


def test_a_root_that_is_not_a_value():
    v = fires("root", [leaf(), "nope"], "is not an ir_core.Value")
    assert v.node is None
    fires("root", leaf().node, "(DeviceData) is not an ir_core.Value")


def test_an_op_with_no_rule_is_also_the_unsupported_op_error_lowering_raises():
    bad = Value(node("aten::frobnicate.default", [leaf()]))
    fires("op-known", [bad], "no lowering rule for op 'aten::frobnicate.default'")
    with pytest.raises(irt.UnsupportedOpError, match="aten::frobnicate") as e:
        irt.check_graph([bad])
    assert isinstance(e.value, irt.GraphError)
    assert isinstance(e.value, irt.LoweringError)


def test_an_output_dtype_the_runtime_cannot_lower(monkeypatch):
    """ir-core and the runtime know the same dtypes today: a runtime without one is simulated."""
    known = _check.to_numpy_dtype

    def without_float8(name):
        if name == "float8_e5m2":
            raise irt.DTypeError(f"no {name} here")
        return known(name)

    monkeypatch.setattr(_check, "to_numpy_dtype", without_float8)
    x = leaf(Shape("float8_e5m2", (4,)))
    fires("output-dtype", [Value(node("aten::neg.default", [x], [x.shape]))], "float8_e5m2")


def test_a_leaf_whose_handle_is_not_of_its_shape_or_dtype():
    fires("leaf-handle", [leaf(F4, np.ones(5, np.float32))], "shape [5]")
    fires("leaf-handle", [leaf(F4, jnp.ones(4, jnp.int32))], "int32")
    assert rules([leaf(F4, None), leaf(F4, np.ones(4, np.float64))]) == []  # (placed as f32)


def test_wrong_aten_operand_counts():
    x = leaf()
    fires("aten-operands", [Value(node("aten::mul.Tensor", [x]))], "has 1 tensor operand")
    fires("aten-operands", [Value(node("aten::mm.default", [x, x, x]))], "takes 2")
    # An optional tensor given as an attribute set to None has no operand.
    clamp = node("aten::clamp.Tensor", [x, x, x], attrs={"max": None})
    fires("aten-operands", [Value(clamp)], "has 3 tensor operands")
    assert rules([Value(clamp.clone(operands=[x, x]))]) == []
    # A tensor list: `indexed` marks which entries are operands.
    idx = leaf(Shape("int64", (2,)))
    pick = node("aten::index.Tensor", [x, idx], attrs={"indexed": (True, True)})
    fires("aten-operands", [Value(pick)], "marks 2 present entries")


def test_bad_aten_attributes():
    x = leaf()
    fires("aten-attrs", [Value(node("aten::neg.default", [x], attrs={"foo": 1}))], "'foo'")
    fires("aten-attrs", [Value(node("aten::neg.default", [x], attrs={"self": None}))], "tensor")
    clamp = node("aten::clamp.Tensor", [x, x], attrs={"min": 1.0})
    fires("aten-attrs", [Value(clamp)], "optional tensor 'min'")
    s = leaf(Shape("float32", ()))
    lifted = node("aten::neg.default", [x, s], attrs={"__lifted__": ("self",)})
    fires("aten-attrs", [Value(lifted)], "not a Scalar argument")
    both = node("aten::add.Tensor", [x, x, s], attrs={"__lifted__": ("alpha",), "alpha": 2.0})
    fires("aten-attrs", [Value(both)], "both lifted and an attribute")
    fires(
        "aten-attrs",
        [Value(node("aten::index.Tensor", [x, x], attrs={"indexed": (1, 0)}))],
        "tuple of bools",
    )


def test_a_lifted_scalar_that_is_not_0d():
    x = leaf()
    add = node("aten::add.Tensor", [x, x, x], attrs={"__lifted__": ("alpha",)})
    fires("lifted-scalar", [Value(add)], "lifted scalar 'alpha' is float32[4]")


def test_a_scalar_type_attribute_that_is_no_dtype():
    x = leaf()
    total = node("aten::sum.dim_IntList", [x], [Shape("float32", ())], {"dim": (0,)})
    assert rules([Value(total.clone(attrs={"dim": (0,), "dtype": "float64"}))]) == []
    bad = total.clone(attrs={"dim": (0,), "dtype": "float128"})
    fires("aten-dtype-attr", [Value(bad)], "'float128'")


def test_more_outputs_than_the_schema_returns():
    fires("aten-outputs", [Value(node("aten::neg.default", [leaf()], [F4, F4]))], "has 2 outputs")


def test_an_ir_op_of_the_wrong_arity():
    x = leaf()
    fires("ir-arity", [Value(node("ir::annotate", [x, x]))], "takes 1")


def test_a_call_jax_node_names_a_registered_function_and_its_vjp_is_wired():
    x = irt.to_lazy(torch.ones(4))
    called = irt.call_jax(lambda a: a * 2, x)._ir.node
    assert rules([Value(called)]) == []
    made_up = node("ir::call_jax", [leaf()], attrs={"fn": "0" * 32, "name": "f"})
    fires("jax-function", [Value(made_up)], "names no registered JAX function")
    attrs = {**called.attrs, "wrt": (0,), "outs": (0,), "inputs": 1}
    fires("jax-function", [Value(node("ir::call_jax_vjp", [leaf()], attrs=attrs))], "takes 2")
    fires("ir-attrs", [Value(node("ir::call_jax", [leaf()], attrs={"fn": "x"}))], "'name'")


def test_an_attention_node_is_torchs_contract():
    q, k, v = (irt.to_lazy(torch.ones(2, 4, 3, 8)).requires_grad_() for _ in range(3))
    mask = irt.to_lazy(torch.ones(3, 3, dtype=torch.bool))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.sum().backward()
    fwd, back = out._ir.node, q.grad._ir.node
    assert rules([Value(back, 0)]) == []
    a, b = leaf(Shape("float32", (2, 4, 3, 8))), leaf(Shape("float32", (2, 3, 3, 8)))
    lse = Shape("float32", (2, 4, 3))
    attrs = dict(fwd.attrs)
    bad = node("ir::attention", [a, b, b], (a.shape, lse), attrs)
    fires("attention-shapes", [Value(bad)], "q's heads a multiple of k's")
    bad = node("ir::attention", [a, a, a, leaf(Shape("float32", (5, 3)))], (a.shape, lse), attrs)
    fires("attention-shapes", [Value(bad)], "broadcastable to [2, 4, 3, 3]")
    bad = node("ir::attention", [a, a, a], (a.shape, Shape("bfloat16", (2, 4, 3))), attrs)
    fires("attention-shapes", [Value(bad)], "for these operands")
    bad = node("ir::attention", [a, a, a], (a.shape, lse), {**attrs, "scale": 1})
    fires("attention-shapes", [Value(bad)], "a bool and a float")
    fires("ir-attrs", [Value(node("ir::attention", [a, a, a], (a.shape, lse), {}))], "'causal'")
    short = node("ir::attention_backward", list(back.operands[:5]), back.shapes, back.attrs)
    fires("attention-shapes", [Value(short)], "takes 6, or 7 with a mask")


def test_an_annotation_s_open_dims_are_dims_of_its_output_beside_a_sharding():
    from ir_sharding import ShardingSpec

    mesh = irt.Mesh(range(8), (2, 4), ("dp", "tp"))
    x = leaf(Shape("float32", (4, 8)))
    spec = ShardingSpec(mesh, (None, "tp"))
    good = node("ir::annotate", [x], [x.shape], {"open": (0,)}, spec)
    assert rules([Value(good)]) == []
    for dims, match in (
        ((2,), "distinct dims in [0, 2)"),
        ((0, 0), "distinct"),
        ((), "non-empty"),
    ):
        bad = node("ir::annotate", [x], [x.shape], {"open": dims}, spec)
        fires("annotate-open", [Value(bad)], match)
    fires(
        "annotate-open",
        [Value(node("ir::annotate", [x], [x.shape], {"open": (0,)}))],
        "no sharding",
    )


def test_an_ir_op_without_the_attributes_its_rule_reads():
    key = leaf(KEY)
    fires("ir-attrs", [Value(node("ir::random_uniform", [key], attrs={"offset": 0}))], "'low'")


def test_a_random_op_without_its_key_or_offset():
    x = leaf()
    attrs = {"offset": 0, "mean": 0.0, "std": 1.0}
    fires("random-key", [Value(node("ir::random_normal", [x], attrs=attrs))], "uint32[3] key")
    fires("random-key", [Value(node("ir::random_normal", [], attrs=attrs))], "no operand")
    bad = node("ir::random_normal", [leaf(KEY)], attrs={**attrs, "offset": True})
    fires("random-key", [Value(bad)], "`offset` is True")


def test_an_identity_op_that_changes_its_shape():
    bad = node("ir::optimization_barrier", [leaf(), leaf()], [F4, Shape("float32", (5,))])
    fires("same-shapes", [Value(bad)], "output 1 is float32[5]")


def test_an_unknown_body():
    attrs = {"body": "no-such-body", "params": 0, "layers": 2}
    fires(
        "body-registered", [Value(node("ir::scan_layers", [leaf()], attrs=attrs))], "not registered"
    )
    # A body of the other kind.
    attrs = {"body": scan_body(), "in_specs": (), "out_specs": ()}
    fires("body-registered", [shard_map(attrs["body"])], "is a Body, not the body")


def test_a_scan_whose_operands_do_not_fit_its_body():
    attrs = {"body": scan_body(), "params": 1, "layers": 3}
    stacked = leaf(Shape("float32", (3, 5)))
    fires(
        "scan-wiring", [Value(node("ir::scan_layers", [leaf(), stacked], attrs=attrs))], "3 layers"
    )
    fires("scan-wiring", [Value(node("ir::scan_layers", [leaf()], attrs=attrs))], "takes 2")


def test_a_shard_map_whose_shapes_do_not_fit_its_body():
    fires("shard-map-wiring", [shard_map(region(), operand_shape=(4,))], "input 0 is float32[4]")
    out = shard_map(region(), shapes=[Shape("float32", (4,))])
    fires("shard-map-wiring", [out], "output 0 is float32[4]")


def test_a_shard_map_without_its_sharding():
    fires("shard-map-sharding", [shard_map(region(), sharding=None)], "has no sharding")


def test_collectives_outside_a_region_or_over_another_mesh():
    reduce = node("ir::all_reduce", [leaf()], attrs={"axes": ("data",), "op": "sum"})
    fires("collective", [Value(reduce)], "outside a shard_map body")

    def gather(ph):
        attrs = {"axes": ("nope",), "dim": 0}
        return [Value(node("ir::all_gather", [ph], [Shape("float32", (2,))], attrs))]

    v = fires("collective", [shard_map(region(gather))], "not axes of the region's mesh")
    assert v.where.startswith("in the body of `ir::shard_map`")

    def wrong_shape(ph):
        attrs = {"axes": ("data",), "dim": 0}
        return [Value(node("ir::all_gather", [ph], [Shape("float32", (2,))], attrs))]

    fires("collective", [shard_map(region(wrong_shape))], "(8,)")


def test_a_sharding_of_another_type():
    class Annotation:
        def canonical_bytes(self):
            return b"mine"

    bad = node("aten::neg.default", [leaf()], sharding=Annotation())
    fires("sharding-type", [Value(bad)], "not an ir_sharding ShardingSpec")
    two = node("ir::shard_alike", [leaf(), leaf()], [F4, F4])
    spec = ShardingSpec(MESH, ("data",))
    fires("sharding-type", [Value(two.clone(sharding=TupleSharding([spec])))], "1 entries")


def test_a_sharding_of_another_rank():
    bad = node("aten::neg.default", [leaf()], sharding=ShardingSpec(MESH, ("data", None)))
    fires("sharding-rank", [Value(bad)], "has rank 1, but its sharding")
    assert rules([Value(bad.clone(sharding=ShardingSpec.replicated(MESH)))]) == []


def test_shardings_over_two_device_sets():
    a = ShardingSpec(Mesh(range(4), (4,), ("x",)), ("x",))
    b = ShardingSpec(Mesh(range(4, 8), (4,), ("x",)), ("x",))
    x, y = leaf(F4, sharding=a), leaf(F4, sharding=b)
    fires("one-device-set", [Value(node("aten::add.Tensor", [x, y], attrs={"alpha": 1}))], "[4, 5")


def test_a_sharded_node_inside_a_body():
    carry = DeviceData(F4)
    root = Value(node("aten::neg.default", [Value(carry)], sharding=ShardingSpec(MESH, ("data",))))
    attrs = {"body": add_body(Body(root, carry, [], [], None)), "params": 0, "layers": 2}
    v = fires("body-unsharded", [Value(node("ir::scan_layers", [leaf()], attrs=attrs))])
    assert v.where.startswith("in the body of `ir::scan_layers`")


def test_what_ir_core_refuses_is_never_in_a_graph():
    """An output index out of range and an unknown dtype cannot be built, so the verifier does
    not look for them."""
    with pytest.raises(OutputIndexError):
        Value(node("aten::neg.default", [leaf()]), 1)
    with pytest.raises(Exception, match="unknown dtype"):
        Shape("float128", ())


# -- how violations are reported ---------------------------------------------------------------


def test_every_violation_at_once_with_its_op_and_line():
    x = leaf()
    first = node("aten::mul.Tensor", [x], origin=Origin())
    second = node("aten::frobnicate.default", [Value(first)])
    with pytest.raises(irt.GraphError) as e:
        irt.check_graph([Value(second)])
    text = str(e.value)
    assert "in 2 places" in text
    lines = text.splitlines()[1:]
    assert len(lines) == 2
    assert lines[0].startswith("  `aten::mul.Tensor` (node 1) at model.py:12: has 1 tensor")
    assert lines[1].startswith("  `aten::frobnicate.default` (node 2): no lowering rule")
    assert [v.rule for v in e.value.violations] == ["aten-operands", "op-known"]


def test_the_line_is_the_front_ends_origin():
    irt.install()
    from ir_runtime._frontend.recording import _fast

    origin = _fast.origin()  # this line of this file
    bad = node("aten::neg.default", [leaf()], [F4, F4], origin=origin)
    (v,) = irt.check_graph([Value(bad)], raise_on_error=False)
    assert f"test_check.py:{origin.lineno}" in str(v)


def test_a_long_list_is_cut_in_the_message_but_kept_whole(monkeypatch):
    monkeypatch.setattr(_check, "SHOWN", 3)
    x = leaf()
    bad = [Value(node("aten::neg.default", [x], attrs={"k": k})) for k in range(5)]
    with pytest.raises(irt.GraphError, match=r"\.\.\. and 2 more") as e:
        irt.check_graph(bad)
    assert len(e.value.violations) == 5


def test_a_chain_of_a_million_nodes_checks_without_recursion():
    v = leaf()
    for _ in range(1_000_000):
        v = Value(Generic("aten::neg.default", (v,), (F4,)))
    assert irt.check_graph(v) == []


# -- the cache runs it on misses only ------------------------------------------------------------


@pytest.fixture
def calls(monkeypatch):
    seen = []
    check = _check.check_graph

    def counting(roots, **kwargs):
        seen.append(roots)
        return check(roots, **kwargs)

    monkeypatch.setattr(_check, "check_graph", counting)
    return seen


def _graph(n: int):
    x = irt.to_device(np.arange(n, dtype=np.float32))
    return [Value(node("aten::neg.default", [Value(x)], [x.shape]))]


def test_a_cache_miss_is_checked_and_a_hit_is_not(calls, monkeypatch):
    monkeypatch.setattr(_check, "ALWAYS", [True])
    irt.CACHE.clear()
    irt.execute(_graph(7))
    assert len(calls) == 1
    irt.execute(_graph(7))  # the same program: a hit
    assert len(calls) == 1
    irt.execute(_graph(9))
    assert len(calls) == 2


def test_the_check_is_off_unless_asked_for_and_follows_set_debug(calls, monkeypatch):
    monkeypatch.setattr(_check, "ALWAYS", [False])
    irt.CACHE.clear()
    irt.execute(_graph(11))
    assert calls == []
    irt.CACHE.clear()
    irt.set_debug(True)
    try:
        irt.execute(_graph(11))
    finally:
        irt.set_debug(False)
    assert len(calls) == 1


def test_a_bad_graph_fails_before_lowering_and_compiles_nothing(monkeypatch):
    monkeypatch.setattr(_check, "ALWAYS", [True])
    irt.CACHE.clear()
    x = irt.to_device(np.ones(4, np.float32))
    bad = Value(node("aten::mul.Tensor", [Value(x)]))
    with pytest.raises(irt.GraphError, match=r"`aten::mul.Tensor` \(node 1\): has 1 tensor"):
        irt.execute([bad])
    assert len(irt.CACHE) == 0
