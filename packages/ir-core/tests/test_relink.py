"""relink: every use of a replaced node goes through its replacement; nothing else is rebuilt.

The oracle builds the same graph from scratch with the replacements in place and compares
dag_hash and graph_hash; a parallel walk of both graphs checks which nodes are the very objects
of the old graph."""

import gc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ir_core import (
    CycleError,
    DeviceData,
    Generic,
    OperandError,
    Shape,
    ShapeError,
    Value,
    graph_hash,
    post_order,
    relink,
)

from graphs import F32, Sharding, build, graph_specs, leaf, op


def _replacement(node, earlier, draw):
    """A new node for ``node``: a clone with a new sharding, or (for a Generic) a new op over
    nodes built before it, so the replacements never form a cycle."""
    if isinstance(node, DeviceData):
        return node.clone(handle="new", sharding=Sharding(b"new"))
    if earlier and draw(st.booleans()):
        picks = draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=3))
        operands = [Value(p, draw(st.integers(0, len(p.shapes) - 1))) for p in picks]
        return Generic("replaced", operands, node.shapes, {"n": len(operands)})
    return node.clone(sharding=Sharding(b"new:" + bytes([draw(st.integers(0, 255))])))


def _from_scratch(nodes, replacements):
    """The graph rebuilt node by node, in construction order, with each replaced node's
    replacement built in its place. Returns {old node: scratch node} and {scratch node: the
    node (old or replacement) it was built from}."""
    fresh, origin = {}, {}

    def rebuild(n):
        if isinstance(n, DeviceData):
            return n
        operands = [Value(fresh[v.node], v.index) for v in n.operands]
        return Generic(n.op, operands, n.shapes, dict(n.attrs), n.sharding)

    for n in nodes:
        source = replacements.get(n, n)
        fresh[n] = rebuild(source)
        origin[fresh[n]] = source
    return fresh, origin


def _reaches(node, keys, memo):
    stack = [node]
    while stack:
        n = stack[-1]
        if n in memo:
            stack.pop()
            continue
        pending = [v.node for v in n.operands if v.node not in memo]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        memo[n] = n in keys or any(memo[v.node] for v in n.operands)
    return memo[node]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_specs, st.data())
def test_relink_matches_the_graph_built_with_the_replacements_in_place(spec, data):
    nodes = [n for n, _ in build(spec)]
    picked = data.draw(st.sets(st.integers(0, len(nodes) - 1), max_size=4))
    replacements = {nodes[i]: _replacement(nodes[i], nodes[:i], data.draw) for i in sorted(picked)}
    root_picks = data.draw(st.lists(st.integers(0, len(nodes) - 1), min_size=1, max_size=4))
    roots = [Value(nodes[i], len(nodes[i].shapes) - 1) for i in root_picks]

    result = relink(roots, replacements)

    fresh, origin = _from_scratch(nodes, replacements)
    expected = [Value(fresh[v.node], v.index) for v in roots]
    assert [v.node.dag_hash for v in result] == [v.node.dag_hash for v in expected]
    assert [v.index for v in result] == [v.index for v in expected]
    assert graph_hash(result) == graph_hash(expected)

    # Walk both graphs in step: the same structure, so the same post-order positions.
    got, want = post_order(result), post_order(expected)
    assert len(got) == len(want)
    memo = {}
    for g, w in zip(got, want, strict=True):
        source = origin.get(w, w)
        assert g not in replacements
        if _reaches(source, replacements, memo):
            assert g is not source
        else:
            assert g is source
    for old, new in zip(roots, result, strict=True):
        if not _reaches(old.node, replacements, memo):
            assert new is old


def test_only_the_path_to_the_replaced_node_is_rebuilt():
    a, b, c = leaf(), leaf(), leaf()
    left = op("add", a, b)
    right = op("neg", c)
    out = op("mul", left, right)
    b2 = b.clone(sharding=Sharding(b"tiled"))
    (new_value,) = relink([Value(out)], {b: b2})
    new_out = new_value.node
    new_left, new_right = (v.node for v in new_out.operands)
    assert new_right is right
    assert new_left is not left and new_left.operands[0].node is a
    assert new_left.operands[1].node is b2
    assert new_left.node_hash == left.node_hash
    assert new_out.node_hash == out.node_hash
    assert new_out.dag_hash != out.dag_hash
    # The old graph is untouched.
    assert out.operands[0].node.operands[1].node is b


def test_shared_consumer_is_rebuilt_once():
    a = leaf()
    s = op("neg", a)
    t = op("add", s, s)
    u = op("mul", t, s)
    a2 = a.clone(handle="x")
    new_u = relink(u, {a: a2})
    t2, s2 = (v.node for v in new_u.operands)
    assert t2.operands[0].node is s2 and t2.operands[1].node is s2
    assert len(post_order(new_u)) == len(post_order(u))


def test_roots_keep_their_form():
    a, b = leaf(), leaf()
    s = op("add", a, b)
    a2 = leaf("other")
    assert isinstance(relink(s, {a: a2}), Generic)
    assert isinstance(relink(Value(s), {a: a2}), Value)
    node_root, value_root = relink([s, Value(s)], {a: a2})
    assert value_root.node is node_root
    from_generator = relink((v for v in [Value(s)]), {a: a2})
    assert isinstance(from_generator, list)
    assert from_generator[0].node.operands[0].node is a2
    untouched = Value(s)
    assert relink([untouched], {}) == [untouched]
    assert relink([untouched], {})[0] is untouched
    assert relink(untouched, {leaf(): leaf()}) is untouched


def test_a_replaced_root_becomes_its_replacement():
    a = leaf()
    s = op("neg", a)
    s2 = s.clone(sharding=Sharding(b"r"))
    assert relink(Value(s), {s: s2}).node is s2
    assert relink(s, {s: s2}) is s2


def test_a_replacement_that_is_itself_replaced_is_followed():
    a, b, c = leaf(), leaf(), leaf()
    s = op("neg", a)
    assert relink(s, {a: b, b: c}).operands[0].node is c


def test_a_replacements_operands_are_relinked():
    a, b = leaf(), leaf()
    s = op("neg", a)
    t = op("exp", s)
    s2 = op("abs", a)  # reads a, which is replaced too
    b_for_a = b
    new_t = relink(t, {s: s2, a: b_for_a})
    assert new_t.operands[0].node.op == "abs"
    assert new_t.operands[0].node.operands[0].node is b
    assert a not in post_order(new_t)


def test_cycles_are_refused_and_change_nothing():
    a = leaf()
    s = op("neg", a)
    t = op("exp", s)
    wraps_s = op("wrap", s)
    with pytest.raises(CycleError, match=r"cycle through <Generic neg"):
        relink(t, {s: wraps_s})
    b = leaf()
    with pytest.raises(CycleError, match="cycle"):
        relink(op("add", a, b), {a: b, b: a})
    assert gc.isenabled()
    # The traversal scratch was reset: the next relink is correct.
    a2 = leaf("2")
    assert relink(t, {a: a2}).operands[0].node.operands[0].node is a2


def test_gc_state_is_restored():
    a = leaf()
    s = op("neg", a)
    gc.disable()
    try:
        relink(s, {a: leaf()})
        assert not gc.isenabled()
    finally:
        gc.enable()
    relink(s, {a: leaf()})
    assert gc.isenabled()


def test_bad_replacements_name_the_value_and_the_rule():
    a = leaf()
    s = op("neg", a)
    wide = DeviceData(Shape("float32", (8,)))
    with pytest.raises(ShapeError, match=r"has output shapes \(float32\[8\]\), not .*float32\[4\]"):
        relink(s, {a: wide})
    with pytest.raises(OperandError, match="replacement key 'a'"):
        relink(s, {"a": a})
    with pytest.raises(OperandError, match=r"replacement Value\("):
        relink(s, {a: Value(a)})
    with pytest.raises(OperandError, match="must be a mapping"):
        relink(s, [(a, leaf())])
    with pytest.raises(OperandError, match="root 0 is 3"):
        relink([3], {a: leaf()})


def test_clone_with_new_operands_keeps_node_hash():
    a, b = leaf(), leaf()
    s = Generic("sub", [Value(a), Value(b)], [F32], {"alpha": 2}, Sharding(b"s"))
    swapped = s.clone(operands=[Value(b), Value(a)])
    assert swapped.node_hash == s.node_hash
    assert (
        swapped.dag_hash
        == Generic("sub", [Value(b), Value(a)], [F32], {"alpha": 2}, Sharding(b"s")).dag_hash
    )
    assert swapped.attrs == s.attrs and swapped.sharding is s.sharding
    with pytest.raises(OperandError, match="operand 0 of 'sub' is 1"):
        s.clone(operands=[1])


def test_million_node_chain():
    x = leaf()
    n = x
    for _ in range(1_000_000):
        n = Generic("neg", (Value(n),), (F32,))
    x2 = leaf("new")
    r = relink(n, {x: x2})
    assert r.dag_hash == n.dag_hash  # a leaf's hash is its shape: same dag_hash, new objects
    assert r is not n
    bottom = r
    for _ in range(1_000_000):
        bottom = bottom.operands[0].node
    assert bottom is x2
