"""with_sharding / clear_sharding on every node kind, and relinking consumers to the clone."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ir_core import DeviceData, Generic, Shape, Value, graph_hash, post_order
from ir_sharding import (
    Mesh,
    ShardingError,
    ShardingSpec,
    TupleSharding,
    clear_sharding,
    relink,
    with_sharding,
)

MESH = Mesh(range(8), (4, 2), ("data", "model"))
F32 = Shape("float32", (8, 4))
ROW = ShardingSpec(MESH, ("data", None))
COL = ShardingSpec(MESH, (None, "model"))


def leaf(handle=None):
    return DeviceData(F32, handle=handle)


def op(name, *nodes, attrs=None):
    return Generic(name, [n if isinstance(n, Value) else Value(n) for n in nodes], [F32], attrs)


def test_with_sharding_clones_a_device_data():
    x = leaf("buffer")
    v = with_sharding(Value(x), ROW)
    assert v.node is not x and v.index == 0
    assert v.node.sharding is ROW and v.node.handle == "buffer"
    assert x.sharding is None
    assert v.node.node_hash != x.node_hash
    assert clear_sharding(v).node.node_hash == x.node_hash
    assert clear_sharding(v).node.dag_hash == x.dag_hash


def test_with_sharding_clones_a_generic_with_its_operands():
    a, b = leaf(), leaf()
    s = op("add", a, b, attrs={"alpha": 1})
    v = with_sharding(Value(s), COL)
    assert v.node.operands == s.operands and v.node.attrs == s.attrs and v.node.op == "add"
    assert v.node.sharding == COL and s.sharding is None
    assert v.node.dag_hash != s.dag_hash
    cleared = clear_sharding(v).node
    assert (cleared.node_hash, cleared.dag_hash) == (s.node_hash, s.dag_hash)


def test_equal_placements_give_equal_hashes():
    x = leaf()
    by_name = with_sharding(Value(x), ShardingSpec(MESH, ("data", None))).node
    by_index = with_sharding(Value(x), ShardingSpec(MESH, (0, None))).node
    assert by_name.node_hash == by_index.node_hash
    # Swapping the two devices that share block 0 moves nothing; swapping across blocks does.
    within = Mesh([1, 0, *range(2, 8)], (4, 2), ("data", "model"))
    same = with_sharding(Value(x), ShardingSpec(within, ("data", None))).node
    assert same.node_hash == by_name.node_hash
    across = Mesh([0, 2, 1, *range(3, 8)], (4, 2), ("data", "model"))
    moved = with_sharding(Value(x), ShardingSpec(across, ("data", None))).node
    assert moved.node_hash != by_name.node_hash


def test_multi_output_nodes_carry_one_spec_per_output():
    a = leaf()
    pair = Generic("max.dim", [Value(a)], [Shape("float32", (8,)), Shape("int64", (8,))])
    row1 = ShardingSpec(MESH, ("data",))
    first = with_sharding(Value(pair, 1), row1)
    assert first.index == 1
    assert first.node.sharding == TupleSharding([None, row1])
    both = with_sharding(Value(first.node, 0), ShardingSpec(MESH, ("model",)))
    assert both.node.sharding.specs == (ShardingSpec(MESH, ("model",)), row1)
    back = clear_sharding(Value(clear_sharding(Value(both.node, 1)).node, 0))
    assert back.node.sharding is None
    assert back.node.node_hash == pair.node_hash


def test_tuple_sharding_bytes_separate_outputs():
    assert (
        TupleSharding([ROW, None]).canonical_bytes() != TupleSharding([None, ROW]).canonical_bytes()
    )
    assert TupleSharding([ROW, None]) == TupleSharding([ShardingSpec(MESH, (0, None)), None])
    with pytest.raises(ShardingError, match="output 1 of a TupleSharding is 'x'"):
        TupleSharding([ROW, "x"])


def test_errors_change_nothing():
    x = leaf()
    before = (x.node_hash, x.dag_hash, x.sharding)
    with pytest.raises(
        ShardingError,
        match=r"partition spec \('data',\) has 1 entries but the value float32\[8,4\] has rank 2",
    ):
        with_sharding(Value(x), ShardingSpec(MESH, ("data",)))
    with pytest.raises(ShardingError, match=r"takes a ShardingSpec, got \('data', None\)"):
        with_sharding(Value(x), ("data", None))
    with pytest.raises(
        ShardingError, match=r"with_sharding takes an ir_core.Value, got <DeviceData"
    ):
        with_sharding(x, ROW)
    with pytest.raises(ShardingError, match=r"clear_sharding takes an ir_core\.Value"):
        clear_sharding(None)
    assert (x.node_hash, x.dag_hash, x.sharding) == before


def test_rank_free_specs_fit_any_value():
    x = leaf()
    for spec in (
        ShardingSpec.replicated(MESH),
        ShardingSpec.maximal(MESH, 3),
        ShardingSpec.manual(MESH),
    ):
        assert with_sharding(Value(x), spec).node.sharding is spec


def test_annotate_then_relink_moves_every_consumer():
    x, w = leaf(), leaf()
    h = op("mm", x, w)
    y = op("relu", h)
    z = op("add", h, y)
    sharded_x = with_sharding(Value(x), ROW).node
    new_z = relink(z, {x: sharded_x})
    reachable = post_order(new_z)
    assert x not in reachable and sharded_x in reachable and w in reachable
    new_h = new_z.operands[0].node
    assert new_z.operands[1].node.operands[0].node is new_h  # still shared, rebuilt once
    # Clearing and relinking back gives the original program, hash for hash.
    restored = relink(new_z, {sharded_x: clear_sharding(Value(sharded_x)).node})
    assert restored.dag_hash == z.dag_hash
    assert graph_hash(restored) == graph_hash(z)


@st.composite
def annotated_graphs(draw):
    """A random graph of same-shaped nodes and a random set of nodes to annotate."""
    nodes = [leaf(k) for k in range(draw(st.integers(1, 4)))]
    for k in range(draw(st.integers(0, 15))):
        picks = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=3))
        nodes.append(op(f"op{k % 3}", *picks))
    marked = draw(st.sets(st.sampled_from(nodes), max_size=4))
    specs = draw(
        st.lists(st.sampled_from([ROW, COL, ShardingSpec.replicated(MESH)]), min_size=4, max_size=4)
    )
    roots = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=3))
    return nodes, dict(zip(marked, specs, strict=False)), roots


def _rebuilt_from_scratch(nodes, specs):
    fresh = {}
    for n in nodes:
        sharding = specs.get(n, n.sharding)
        if isinstance(n, DeviceData):
            fresh[n] = DeviceData(n.shape, n.handle, sharding)
        else:
            operands = [Value(fresh[v.node], v.index) for v in n.operands]
            fresh[n] = Generic(n.op, operands, n.shapes, dict(n.attrs), sharding)
    return fresh


@settings(max_examples=200, deadline=None)
@given(annotated_graphs())
def test_annotating_any_nodes_and_relinking_equals_building_them_annotated(case):
    nodes, specs, roots = case
    replacements = {n: with_sharding(Value(n), s).node for n, s in specs.items()}
    result = relink([Value(r) for r in roots], replacements)
    fresh = _rebuilt_from_scratch(nodes, specs)
    expected = [Value(fresh[r]) for r in roots]
    assert [v.node.dag_hash for v in result] == [v.node.dag_hash for v in expected]
    assert graph_hash(result) == graph_hash(expected)
    assert not set(post_order(result)) & set(replacements)
