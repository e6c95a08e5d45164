"""Every hash ir_core computes equals the plain-Python reference over the documented encoding."""

import math
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ir_core import (
    DeviceData,
    Generic,
    Shape,
    Value,
    graph_fingerprint,
    graph_hash,
    post_order,
)

import reference
from graphs import Sharding, attr_values, build, graph_specs, shapes


@given(graph_specs)
@settings(max_examples=300, deadline=None)
def test_node_and_dag_hash_match_reference(spec):
    for node, ref in build(spec):
        assert node.node_hash == ref.node_hash
        assert node.dag_hash == ref.dag_hash


@given(graph_specs, st.data())
@settings(max_examples=200, deadline=None)
def test_graph_hash_and_post_order_match_reference(spec, data):
    built = build(spec)
    picks = data.draw(st.lists(st.integers(0, len(built) - 1), min_size=1, max_size=5))
    whole = data.draw(st.lists(st.booleans(), min_size=len(picks), max_size=len(picks)))
    roots, ref_roots = [], []
    for k, as_node in zip(picks, whole, strict=True):
        node, ref = built[k]
        if as_node:
            roots.append(node)
            ref_roots.append((ref, -1))
        else:
            index = len(node.shapes) - 1
            roots.append(Value(node, index))
            ref_roots.append((ref, index))
    assert graph_hash(roots) == reference.graph_hash(ref_roots)
    assert graph_fingerprint(roots) == reference.graph_fingerprint(ref_roots)
    by_ref = {id(ref): node for node, ref in built}
    expected = [by_ref[id(r)] for r in reference.post_order([r for r, _ in ref_roots])]
    assert post_order(roots) == expected


@given(attr_values)
@settings(max_examples=300, deadline=None)
def test_every_attribute_value_encodes_as_specified(value):
    shape = Shape("float32", (2,))
    node = Generic("op", [], [shape], {"v": value})
    assert node.node_hash == reference.node_hash(
        "Generic", "op", [("float32", (2,))], {"v": value}, None
    )


@given(shapes, st.binary(max_size=40))
def test_device_data_hashes_shape_and_sharding_only(shape, raw):
    dtype, dims = shape
    a = DeviceData(Shape(dtype, dims), handle=object(), sharding=Sharding(raw))
    b = DeviceData(Shape(dtype, dims), handle=[1, 2, 3], sharding=Sharding(raw))
    expected = reference.node_hash("DeviceData", "device_data", [shape], {}, raw)
    assert a.node_hash == b.node_hash == expected
    assert a.dag_hash == reference.dag_hash(expected, [])


def test_hashes_are_128_bit_ints_equal_to_xxhash_intdigest():
    node = Generic("aten::add.Tensor", [], [Shape("float32", (4, 8))], {"alpha": 1})
    raw = reference.encode(
        ("Generic", "aten::add.Tensor", (("float32", (4, 8)),), {"alpha": 1}, None)
    )
    assert type(node.node_hash) is int and 0 <= node.node_hash < 2**128
    assert node.node_hash == int.from_bytes(reference.xxhash.xxh3_128_digest(raw), "big")


def test_every_nan_encodes_alike():
    payload_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000123))[0]
    negative_nan = -math.nan
    assert math.isnan(payload_nan) and math.isnan(negative_nan)
    hashes = {
        Generic("op", [], [Shape("float32", ())], {"x": v}).node_hash
        for v in (math.nan, payload_nan, negative_nan, float("nan"))
    }
    assert len(hashes) == 1
