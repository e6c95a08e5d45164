"""Construction, immutability, clone, pickling, threads, and every bad input."""

import copy
import gc
import math
import pickle
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ir_core import (
    DTYPES,
    AttributeTypeError,
    DeviceData,
    Generic,
    IRError,
    Node,
    NodeSpecError,
    OperandError,
    OutputIndexError,
    Shape,
    ShapeError,
    ShardingTypeError,
    Value,
    graph_hash,
)

from graphs import Sharding, attrs

F32 = Shape("float32", (4, 8))


def small_graph():
    x = DeviceData(F32, handle="x-buffer")
    w = DeviceData(Shape("float32", (8, 2)), sharding=Sharding(b"w"))
    mm = Generic("aten::mm", [Value(x), Value(w)], [Shape("float32", (4, 2))])
    top = Generic(
        "aten::topk", [Value(mm)], [Shape("float32", (4, 1)), Shape("int64", (4, 1))], {"k": 1}
    )
    out = Generic("aten::add.Tensor", [Value(top, 0), Value(mm)], [Shape("float32", (4, 2))])
    return x, w, mm, top, out


# --- Shape -----------------------------------------------------------------------------------


def test_shape_fields_and_equality():
    s = Shape("bfloat16", [2, 3, 0])
    assert s.dtype == "bfloat16" and s.dims == (2, 3, 0) and s.rank == 3 and s.numel == 0
    assert s == Shape("bfloat16", (2, 3, 0)) and hash(s) == hash(Shape("bfloat16", (2, 3, 0)))
    assert s != Shape("float16", (2, 3, 0))
    assert str(s) == "bfloat16[2,3,0]" and Shape("bool", ()).numel == 1


def test_shape_accepts_integer_like_dims():
    class Dim:
        def __index__(self):
            return 7

    assert Shape("int64", (Dim(), 2)).dims == (7, 2)


@pytest.mark.parametrize(
    "dtype, dims, message",
    [
        ("float", (1,), "unknown dtype 'float'"),
        ("Float32", (1,), "unknown dtype 'Float32'"),
        (None, (1,), "unknown dtype None"),
        ("float32", (2, -1), "dim 1 of (2, -1) is -1"),
        ("float32", (2**63,), "dims must be in [0, 2**63)"),
        ("float32", (1.5,), "dim 0 of (1.5,) is 1.5 (float)"),
        ("float32", (True,), "is a bool"),
        ("float32", 3, "dims must be a sequence of ints, got 3"),
        ("float32", "12", "dims must be a sequence of ints"),
    ],
)
def test_shape_errors(dtype, dims, message):
    with pytest.raises(ShapeError) as info:
        Shape(dtype, dims)
    assert message in str(info.value)
    assert isinstance(info.value, (ValueError, IRError))


def test_dtype_names_follow_numpy_and_torch():
    assert {"float32", "bfloat16", "int64", "bool", "float16", "uint8", "complex64"} <= DTYPES


# --- Value -----------------------------------------------------------------------------------


def test_value_fields_equality_and_hash():
    _, _, _, top, _ = small_graph()
    v = Value(top, 1)
    assert v.node is top and v.index == 1 and v.shape == Shape("int64", (4, 1))
    assert v == Value(top, 1) and hash(v) == hash(Value(top, 1))
    assert v != Value(top, 0) and Value(top) == Value(top, 0)
    assert top.outputs == (Value(top, 0), Value(top, 1))


def test_value_errors():
    x = DeviceData(F32)
    with pytest.raises(
        OutputIndexError,
        match=r"output index 1 is out of range for "
        r"'device_data', which has 1 output\(s\)",
    ):
        Value(x, 1)
    with pytest.raises(OutputIndexError, match="output index -1"):
        Value(x, -1)
    with pytest.raises(OperandError, match=r"Generic or DeviceData, got 'x' \(str\)"):
        Value("x", 0)


# --- Nodes -----------------------------------------------------------------------------------


def test_generic_fields():
    _, w, mm, top, out = small_graph()
    assert out.kind == "Generic" and out.op == "aten::add.Tensor"
    assert out.operands == (Value(top, 0), Value(mm, 0))
    assert top.shapes == (Shape("float32", (4, 1)), Shape("int64", (4, 1)))
    assert dict(top.attrs) == {"k": 1} and dict(out.attrs) == {}
    assert out.sharding is None and w.sharding == Sharding(b"w")


def test_device_data_fields():
    x = DeviceData(F32, handle="buf")
    assert x.kind == "DeviceData" and x.op == "device_data" and x.operands == ()
    assert x.shapes == (F32,) and x.shape == F32 and x.handle == "buf" and dict(x.attrs) == {}


def test_nodes_are_immutable():
    x, _, _, top, _ = small_graph()
    for name in ("op", "operands", "shapes", "attrs", "sharding", "node_hash", "dag_hash"):
        with pytest.raises(AttributeError):
            setattr(top, name, None)
    with pytest.raises(AttributeError):
        x.handle = "other"
    with pytest.raises(TypeError):
        top.attrs["k"] = 2
    with pytest.raises(AttributeError):
        Value(top).index = 1
    with pytest.raises(AttributeError):
        F32.dims = (1,)


def test_caller_mutations_do_not_reach_the_node():
    attrs = {"k": (1, 2)}
    operands = [Value(DeviceData(F32))]
    node = Generic("op", operands, [F32], attrs)
    before = node.dag_hash
    attrs["k"] = (3,)
    attrs["new"] = 1
    operands.append(Value(DeviceData(F32)))
    assert dict(node.attrs) == {"k": (1, 2)} and len(node.operands) == 1
    assert node.dag_hash == before


def test_node_base_is_for_isinstance_only():
    x, _, _, _, out = small_graph()
    assert isinstance(x, Node) and isinstance(out, Node)
    with pytest.raises(OperandError, match="needs an ir_core Generic or DeviceData"):
        Value(Node(), 0)
    with pytest.raises(OperandError, match=r"roots must be ir_core\.Value or nodes"):
        graph_hash([Node()])
    with pytest.raises(TypeError):

        class Mine(Generic):  # final: no subclass can break the kind tag
            pass


@pytest.mark.parametrize(
    "build, error, message",
    [
        (lambda x: Generic("op", [x], [F32]), OperandError, "operand 0 of 'op' is <DeviceData"),
        (
            lambda x: Generic("op", [Value(x), 3], [F32]),
            OperandError,
            "operand 1 of 'op' is 3 (int); operands must be ir_core.Value",
        ),
        (
            lambda x: Generic("op", Value(x), [F32]),
            OperandError,
            "operands of 'op' must be a sequence of Value",
        ),
        (lambda x: Generic("op", [], F32), NodeSpecError, "for one output write (shape,)"),
        (
            lambda x: Generic("op", [], [(4, 8)]),
            NodeSpecError,
            "shape 0 of 'op' is (4, 8) (tuple); expected ir_core.Shape",
        ),
        (lambda x: Generic("", [], [F32]), NodeSpecError, "op must be a non-empty str"),
        (lambda x: Generic(b"op", [], [F32]), NodeSpecError, "op must be a non-empty str"),
        (
            lambda x: Generic("op", [], [F32], {"k": [1, 2]}),
            AttributeTypeError,
            "attribute 'k' of 'op': [1, 2] of type list has no canonical encoding",
        ),
        (
            lambda x: Generic("op", [], [F32], {"k": (1, {2})}),
            AttributeTypeError,
            "attribute 'k' of 'op': {2} of type set",
        ),
        (lambda x: Generic("op", [], [F32], {"k": 1j}), AttributeTypeError, "type complex"),
        (lambda x: Generic("op", [], [F32], {"k": x}), AttributeTypeError, "type DeviceData"),
        (
            lambda x: Generic("op", [], [F32], {1: 1}),
            AttributeTypeError,
            "attribute name 1 of 'op' is a int; attribute names must be str",
        ),
        (lambda x: Generic("op", [], [F32], [("k", 1)]), None, None),
        (
            lambda x: Generic("op", [], [F32], 5),
            AttributeTypeError,
            "attrs of 'op' must be a mapping",
        ),
        (
            lambda x: Generic("op", [], [F32], sharding="tiled"),
            ShardingTypeError,
            "sharding 'tiled' of type str does not supply its canonical bytes",
        ),
        (lambda x: DeviceData((4, 8)), NodeSpecError, "shape of a DeviceData must be an"),
    ],
)
def test_bad_input_raises_specific_errors(build, error, message):
    x = DeviceData(F32)
    if error is None:  # a sequence of pairs is a mapping for dict(): accepted
        assert dict(build(x).attrs) == {"k": 1}
        return
    with pytest.raises(error) as info:
        build(x)
    assert message in str(info.value)


def test_deeply_nested_attribute_is_refused():
    value = ()
    for _ in range(100):
        value = (value,)
    with pytest.raises(AttributeTypeError, match="nested deeper than 64 levels"):
        Generic("op", [], [F32], {"k": value})


def test_sharding_whose_bytes_are_not_bytes():
    class Bad:
        def canonical_bytes(self):
            return "text"

    with pytest.raises(ShardingTypeError, match=r"Bad.canonical_bytes\(\) returned str"):
        DeviceData(F32, sharding=Bad())


# --- clone -----------------------------------------------------------------------------------


def test_generic_clone():
    _, _, mm, top, out = small_graph()
    before = (out.node_hash, out.dag_hash)
    same = out.clone()
    assert same is not out and (same.node_hash, same.dag_hash) == before
    cases = {
        "op": "aten::sub.Tensor",
        "operands": [Value(mm), Value(top, 0)],
        "shapes": [Shape("float64", (4, 2))],
        "attrs": {"alpha": 2},
        "sharding": Sharding(b"s"),
    }
    for field, new in cases.items():
        c = out.clone(**{field: new})
        assert c.dag_hash != before[1], field
        assert (out.node_hash, out.dag_hash) == before
        for other in set(cases) - {field}:
            assert getattr(c, other) == getattr(out, other)
    assert out.clone(operands=[Value(mm), Value(top, 0)]).node_hash == before[0]
    sharded = out.clone(sharding=Sharding(b"s"))
    assert sharded.clone(sharding=None).dag_hash == before[1]


def test_device_data_clone():
    x = DeviceData(F32, handle="a", sharding=Sharding(b"s"))
    before = (x.node_hash, x.dag_hash)
    assert x.clone(handle="b").handle == "b" and x.clone(handle="b").dag_hash == before[1]
    assert x.clone(shape=Shape("float32", (4, 9))).dag_hash != before[1]
    unsharded = x.clone(sharding=None)
    assert unsharded.sharding is None and unsharded.handle == "a"
    assert unsharded.node_hash == DeviceData(F32).node_hash
    assert (x.node_hash, x.dag_hash, x.handle) == (*before, "a")


def test_device_data_holding_is_the_node_built_anew():
    # holding(h) copies the hashes rather than computing them: compare with the constructor's
    # (the canonical encoding and xxHash, which test_hash_reference checks byte for byte).
    for shape, sharding in (
        (F32, None),
        (Shape("bfloat16", (2, 3)), Sharding(b"s")),
        (Shape("int64", ()), Sharding(b"")),
    ):
        template = DeviceData(shape, handle=None, sharding=sharding)
        built = DeviceData(shape, handle="buf", sharding=sharding)
        held = template.holding("buf")
        assert type(held) is DeviceData and held is not template and held.handle == "buf"
        assert (held.node_hash, held.dag_hash) == (built.node_hash, built.dag_hash)
        assert held.shape is template.shape and held.sharding is sharding
        assert held.operands == () and dict(held.attrs) == {} and held.op == "device_data"
        assert template.handle is None  # (the template is left as it was)
        assert held.clone(handle=None).dag_hash == DeviceData(shape, None, sharding).dag_hash
        assert pickle.loads(pickle.dumps(held)).dag_hash == built.dag_hash
    with pytest.raises(TypeError):
        template.holding()


def test_clone_rejects_unknown_fields():
    x = DeviceData(F32)
    with pytest.raises(NodeSpecError, match=r"unknown field.*handel.*shape, handle, sharding"):
        x.clone(handel=1)
    with pytest.raises(NodeSpecError, match=r"unknown field.*shape.*op, operands"):
        Generic("op", [], [F32]).clone(shape=F32)


# --- pickling, copying -----------------------------------------------------------------------


def test_pickle_round_trip_keeps_hashes_sharing_and_handles():
    _, w, _, top, out = small_graph()
    back = pickle.loads(pickle.dumps(out))
    assert (back.node_hash, back.dag_hash) == (out.node_hash, out.dag_hash)
    assert graph_hash(back) == graph_hash(out)
    # mm is used twice; it stays one node.
    assert back.operands[0].node.operands[0].node is back.operands[1].node
    leaf = back.operands[1].node.operands[0].node
    assert (
        leaf.handle == "x-buffer" and back.operands[1].node.operands[1].node.sharding == w.sharding
    )
    v = pickle.loads(pickle.dumps(Value(top, 1)))
    assert v.index == 1 and v.node.dag_hash == top.dag_hash
    assert pickle.loads(pickle.dumps(F32)) == F32


def test_pickle_deep_chain():
    node = DeviceData(F32)
    for _ in range(50_000):
        node = Generic("neg", [Value(node)], [F32])
    back = pickle.loads(pickle.dumps(node))
    assert back.dag_hash == node.dag_hash


def test_copy_returns_the_same_immutable_object():
    _, _, _, top, _ = small_graph()
    assert copy.copy(top) is top and copy.copy(F32) is F32
    assert copy.deepcopy(top).dag_hash == top.dag_hash


# --- threads, GC -----------------------------------------------------------------------------


def _chain(n, tag):
    node = DeviceData(Shape("float32", (n % 7, 3)))
    for k in range(n):
        node = Generic(f"op{k % 5}", [Value(node), Value(node)], [F32], {"k": k, "tag": tag})
    return node


def test_building_and_traversing_from_many_threads():
    expected = {t: (_chain(2000, t).dag_hash, graph_hash(_chain(2000, t))) for t in range(8)}
    results, errors = {}, []
    barrier = threading.Barrier(8)

    def work(t):
        try:
            barrier.wait()
            for _ in range(5):
                node = _chain(2000, t)
                results[t] = (node.dag_hash, graph_hash(node))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and results == expected


def test_nodes_are_not_tracked_by_the_cyclic_gc():
    _, _, _, top, out = small_graph()
    for obj in (out, top, Value(out), F32, out.operands, top.shapes):
        assert not gc.is_tracked(obj)


def test_origin_is_carried_but_never_hashed():
    leaf = DeviceData(F32)
    where = ("train.py", 41)
    a = Generic("aten::neg", [Value(leaf)], [F32], origin=where)
    b = Generic("aten::neg", [Value(leaf)], [F32])
    assert a.origin is where and b.origin is None and leaf.origin is None
    assert a.node_hash == b.node_hash and a.dag_hash == b.dag_hash
    assert graph_hash([Value(a)]) == graph_hash([Value(b)])
    assert a.clone(attrs={"k": 1}).origin is where
    assert a.clone(operands=[Value(DeviceData(F32))]).origin is where  # the rebuild path
    moved = a.clone(origin=("eval.py", 7))
    assert moved.origin == ("eval.py", 7) and moved.node_hash == a.node_hash
    assert pickle.loads(pickle.dumps(a)).origin is None


def _same(a, b):
    """Equal value and type all the way down; a NaN equals a NaN, 0.0 differs from -0.0."""
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
        )
    return a == b


@given(st.lists(attrs, min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_every_node_reads_back_its_own_attributes(many):
    # Nodes whose attributes encode alike share one attribute tuple (a bounded cache); what each
    # node reads back is still its own values, types and signs, cache hits and evictions alike.
    nodes = [Generic("op", [], [F32], a) for a in many + many]
    for node, a in zip(nodes, many + many, strict=True):
        assert set(node.attrs) == set(a)
        assert all(_same(node.attrs[k], a[k]) for k in a), (dict(node.attrs), a)


def test_attributes_that_encode_alike_are_shared_and_those_that_differ_are_not():
    first = Generic("op", [], [F32], {"eps": float("1e-12"), "k": (1, "a")})
    again = Generic("other", [], [F32], {"k": (1, "a"), "eps": float("1e-12")})
    assert again.attrs["eps"] is first.attrs["eps"]  # one tuple for both nodes
    for a, b in [
        ({"v": 0.0}, {"v": -0.0}),
        ({"v": 1}, {"v": True}),
        ({"v": 1}, {"v": 1.0}),
        ({"v": "1"}, {"v": b"1"}),
        ({"v": (1,)}, {"v": ((1,),)}),
    ]:
        x, y = Generic("op", [], [F32], a), Generic("op", [], [F32], b)
        assert _same(x.attrs["v"], a["v"]) and _same(y.attrs["v"], b["v"])
        assert x.node_hash != y.node_hash


def test_thousands_of_distinct_attribute_sets_each_read_back():
    # More distinct sets than the cache has slots: every slot is refilled, none is read stale.
    nodes = [Generic("op", [], [F32], {"i": i, "s": str(i)}) for i in range(5000)]
    assert all(n.attrs["i"] == i and n.attrs["s"] == str(i) for i, n in enumerate(nodes))
    again = [Generic("op", [], [F32], {"i": i, "s": str(i)}) for i in range(5000)]
    assert [n.node_hash for n in again] == [n.node_hash for n in nodes]


def test_a_large_attribute_set_is_not_kept_by_the_shared_cache():
    # Beyond 256 bytes of encoding a node keeps its own tuple: the cache never holds a large
    # value alive after its graph is gone.
    small = [Generic("op", [], [F32], {"v": bytes(range(100))}) for _ in range(2)]
    large = [Generic("op", [], [F32], {"v": bytes(300)}) for _ in range(2)]
    assert small[0].attrs["v"] is small[1].attrs["v"]
    assert large[0].attrs["v"] is not large[1].attrs["v"]
    assert large[0].attrs["v"] == large[1].attrs["v"] == bytes(300)
    assert large[0].node_hash == large[1].node_hash
