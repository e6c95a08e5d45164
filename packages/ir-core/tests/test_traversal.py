"""post_order, graph_hash and the dumps: deterministic, iterative, linear."""

import re

import pytest

from ir_core import (
    DeviceData,
    Generic,
    OperandError,
    Shape,
    Value,
    dump_dot,
    dump_text,
    graph_fingerprint,
    graph_hash,
    post_order,
)

from graphs import F32, leaf, op


def test_post_order_visits_operands_first_each_node_once():
    a, b = leaf(), leaf()
    s = op("add", a, b)
    m = op("mul", s, a)
    out = op("sub", m, s)
    assert post_order(Value(out)) == [a, b, s, m, out]
    assert post_order([Value(s), out]) == [a, b, s, m, out]
    assert post_order([out, Value(s)]) == [a, b, s, m, out]
    assert post_order([]) == []


def test_graph_hash_tells_apart_graphs_that_dag_hash_cannot():
    # f(a, b) and f(a, a) over leaves of one shape: same expression tree, different programs.
    a, b = leaf(), leaf()
    two = op("add", a, b)
    one = op("add", a, a)
    assert two.dag_hash == one.dag_hash
    assert graph_hash(two) != graph_hash(one)
    # (a+b)*a and (a+b)*b: same parameter count, still different programs.
    s = op("add", a, b)
    assert op("mul", s, a).dag_hash == op("mul", s, b).dag_hash
    assert graph_hash(op("mul", s, a)) != graph_hash(op("mul", s, b))


def test_graph_hash_is_the_same_for_the_same_structure_over_new_data():
    def build():
        a, b = leaf(handle=object()), leaf(handle=object())
        s = op("add", a, b)
        return [Value(op("mul", s, a)), Value(s)]

    assert graph_hash(build()) == graph_hash(build())


def test_graph_hash_depends_on_roots_and_their_order():
    a, b = leaf(), leaf()
    s, t = op("add", a, b), op("sub", a, b)
    assert graph_hash([Value(s), Value(t)]) != graph_hash([Value(t), Value(s)])
    assert graph_hash([Value(s)]) != graph_hash([s])
    assert graph_hash([Value(s)]) != graph_hash([Value(s), Value(s)])


def test_roots_must_be_values_or_nodes():
    with pytest.raises(OperandError, match=r"root 1 is 3 \(int\)"):
        post_order([Value(leaf()), 3])
    with pytest.raises(OperandError, match="root 0"):
        graph_hash(["x"])


def test_dump_text():
    a, b = leaf(), leaf()
    two = Generic("topk", [Value(a)], [F32, Shape("int64", (4,))], {"k": 2, "largest": True})
    out = op("add", Value(two, 1), b, attrs={"alpha": 1.5})
    assert dump_text(Value(out)) == (
        "%0 = device_data() : float32[4]\n"
        "%1 = topk(%0) {k=2, largest=True} : (float32[4], int64[4])\n"
        "%2 = device_data() : float32[4]\n"
        "%3 = add(%1.1, %2) {alpha=1.5} : float32[4]\n"
        "roots: %3\n"
    )


def test_dump_dot_is_well_formed():
    a = leaf()
    two = Generic("split", [Value(a)], [F32, F32])
    out = op("add", Value(two, 0), Value(two, 1), attrs={"q": 'say "hi"'})
    dot = dump_dot([Value(out), a])
    assert dot.startswith("digraph ir {") and dot.rstrip().endswith("}")
    declared = set(re.findall(r"^\s+(\w+) \[", dot, re.M)) - {"node"}  # "node [..." sets defaults
    edges = re.findall(r"^\s+(\w+) -> (\w+)", dot, re.M)
    assert declared == {"n0", "n1", "n2", "root0", "root1"}
    assert all(src in declared and dst in declared for src, dst in edges)
    assert len(edges) == 1 + 2 + 2  # a -> split, split -> add twice, two root markers
    assert '"1 (out 1)"' in dot


def test_million_node_chain():
    n = 1_000_000
    shape = Shape("float32", ())
    node = DeviceData(shape)
    for _ in range(n):
        node = Generic("neg", [Value(node)], [shape])
    order = post_order(node)
    assert len(order) == n + 1 and order[-1] is node and order[0].op == "device_data"
    assert graph_hash(node) == graph_hash(node)
    text = dump_text(node)
    assert text.count("\n") == n + 2
    del order, text
    dot = dump_dot(node)
    assert dot.count(" -> ") == n + 1
    del dot
    del node  # freeing the chain must not overflow the C stack


def test_graph_fingerprint_tells_apart_what_graph_hash_tells_apart():
    a, b = leaf(), leaf()
    s = op("add", a, b)
    assert graph_fingerprint(op("mul", s, a)) != graph_fingerprint(op("mul", s, b))
    assert graph_fingerprint(op("mul", s, a)) == graph_fingerprint(op("mul", s, a))
    assert graph_fingerprint(Value(s)) != graph_fingerprint(s)  # output index -1 for a node
    assert graph_fingerprint(op("add", a, b, attrs={"k": 1})) != graph_fingerprint(
        op("add", a, b, attrs={"k": True})
    )
    # The same program over new leaves: equal, like graph_hash.
    c, d = leaf("c"), leaf("d")
    assert graph_fingerprint(op("add", a, b)) == graph_fingerprint(op("add", c, d))


def test_graph_fingerprint_of_a_million_node_chain():
    n = leaf()
    for _ in range(1_000_000):
        n = Generic("neg", (Value(n),), (F32,))
    raw = graph_fingerprint(n)
    assert raw[:14] == b"t\x03\x00\x00\x00i" + (1_000_001).to_bytes(8, "little")
