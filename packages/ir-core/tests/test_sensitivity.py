"""Changing any single thing that defines a node changes its hash; nothing else does."""

import pytest

from ir_core import DeviceData, Generic, Shape, Value

from graphs import Sharding

F32 = Shape("float32", (4, 8))
A = DeviceData(F32)
B = DeviceData(Shape("float32", (8,)))
MULTI = Generic("split", [Value(A)], [F32, F32])


def base(**changes):
    fields = dict(
        op="aten::add.Tensor",
        operands=[Value(A), Value(B)],
        shapes=[F32],
        attrs={"alpha": 1, "scale": 0.0, "mode": "sum"},
        sharding=None,
    )
    fields.update(changes)
    return Generic(**fields)


VARIANTS = {
    "op": dict(op="aten::sub.Tensor"),
    "attr value": dict(attrs={"alpha": 2, "scale": 0.0, "mode": "sum"}),
    "attr int -> float": dict(attrs={"alpha": 1.0, "scale": 0.0, "mode": "sum"}),
    "attr int -> bool": dict(attrs={"alpha": True, "scale": 0.0, "mode": "sum"}),
    "attr 0.0 -> -0.0": dict(attrs={"alpha": 1, "scale": -0.0, "mode": "sum"}),
    "attr str -> bytes": dict(attrs={"alpha": 1, "scale": 0.0, "mode": b"sum"}),
    "attr str -> 1-tuple": dict(attrs={"alpha": 1, "scale": 0.0, "mode": ("sum",)}),
    "attr name": dict(attrs={"alpha": 1, "scale": 0.0, "mode_": "sum"}),
    "attr added": dict(attrs={"alpha": 1, "scale": 0.0, "mode": "sum", "x": None}),
    "attr removed": dict(attrs={"alpha": 1, "scale": 0.0}),
    "dim": dict(shapes=[Shape("float32", (4, 9))]),
    "rank": dict(shapes=[Shape("float32", (4, 8, 1))]),
    "dtype": dict(shapes=[Shape("float64", (4, 8))]),
    "extra output": dict(shapes=[F32, F32]),
    "operand order": dict(operands=[Value(B), Value(A)]),
    "operand output index": dict(operands=[Value(A), Value(MULTI, 1)]),
    "operand count": dict(operands=[Value(A)]),
    "sharding": dict(sharding=Sharding(b"tiled:0")),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_single_change_changes_dag_hash(name):
    assert base(**VARIANTS[name]).dag_hash != base().dag_hash


def test_every_variant_is_distinct():
    hashes = [base(**v).dag_hash for v in VARIANTS.values()] + [base().dag_hash]
    assert len(set(hashes)) == len(hashes)


def test_operand_output_index_is_hashed():
    x = Generic("f", [Value(MULTI, 0)], [F32])
    y = Generic("f", [Value(MULTI, 1)], [F32])
    assert x.node_hash == y.node_hash
    assert x.dag_hash != y.dag_hash


def test_sharding_bytes_are_hashed_not_the_object():
    assert base(sharding=Sharding(b"a")).node_hash != base(sharding=Sharding(b"b")).node_hash
    assert base(sharding=Sharding(b"a")).node_hash == base(sharding=Sharding(b"a")).node_hash
    assert base(sharding=Sharding(b"")).node_hash != base(sharding=None).node_hash


def test_node_kind_is_hashed():
    leaf = DeviceData(F32)
    generic_leaf = Generic("device_data", [], [F32])
    assert leaf.op == generic_leaf.op and leaf.shapes == generic_leaf.shapes
    assert leaf.node_hash != generic_leaf.node_hash


def test_operands_do_not_enter_node_hash():
    assert base(operands=[Value(B), Value(A)]).node_hash == base().node_hash


def test_handle_is_not_hashed():
    assert DeviceData(F32, handle=1).dag_hash == DeviceData(F32, handle="other").dag_hash


def test_attribute_order_does_not_matter():
    a = base(attrs={"alpha": 1, "scale": 0.0, "mode": "sum"})
    b = base(attrs={"mode": "sum", "scale": 0.0, "alpha": 1})
    assert a.node_hash == b.node_hash
    assert list(b.attrs) == ["alpha", "mode", "scale"]


def test_large_and_small_ints_differ():
    big = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, -(2**71)]
    hashes = {base(attrs={"k": v}).node_hash for v in big}
    assert len(hashes) == len(big)
