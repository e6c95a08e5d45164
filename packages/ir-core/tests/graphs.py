"""Test helpers: a stand-in sharding annotation, small hand-built graphs (``leaf`` and ``op``
over ``F32``), and hypothesis strategies for random graphs, built twice, once with ir_core and
once with the plain-Python reference."""

from hypothesis import strategies as st

from ir_core import DTYPES, DeviceData, Generic, Shape, Value

import reference


class Sharding:
    """A stand-in annotation: ir_core only asks it for its canonical bytes."""

    def __init__(self, raw: bytes):
        self.raw = raw

    def canonical_bytes(self) -> bytes:
        return self.raw

    def __eq__(self, other):
        return isinstance(other, Sharding) and other.raw == self.raw

    def __hash__(self):
        return hash(self.raw)

    def __repr__(self):
        return f"Sharding({self.raw!r})"


F32 = Shape("float32", (4,))


def leaf(handle=None):
    return DeviceData(F32, handle=handle)


def op(name, *values, attrs=None):
    """A Generic ``name`` of one F32 output over ``values`` (nodes or Values)."""
    return Generic(name, [v if isinstance(v, Value) else Value(v) for v in values], [F32], attrs)


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
attr_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | text
    | st.binary(max_size=12),
    lambda children: st.lists(children, max_size=4).map(tuple),
    max_leaves=12,
)
attrs = st.dictionaries(text, attr_values, max_size=6)
shapes = st.tuples(
    st.sampled_from(sorted(DTYPES)), st.lists(st.integers(0, 2**62), max_size=4).map(tuple)
)
shardings = st.none() | st.binary(max_size=24)
ops = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=24)

leaf_specs = st.tuples(st.just("DeviceData"), shapes, shardings)
generic_specs = st.tuples(
    st.just("Generic"),
    ops,
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=4),
    st.lists(shapes, min_size=1, max_size=3),
    attrs,
    shardings,
)
graph_specs = st.tuples(
    st.lists(leaf_specs, min_size=1, max_size=4),
    st.lists(generic_specs, max_size=12),
)


def _sharding(raw):
    return None if raw is None else Sharding(raw)


def build(spec):
    """Build a spec from ``graph_specs`` with both implementations.

    Returns a list of (ir_core node, reference node) pairs, in construction order. An operand
    pick (k, j) takes node k modulo the nodes built so far, and its output j modulo its outputs.
    """
    leaves, generics = spec
    built = []
    for _, (dtype, dims), raw in leaves:
        node = DeviceData(Shape(dtype, dims), sharding=_sharding(raw))
        ref = reference.PyNode("DeviceData", "device_data", (), [(dtype, dims)], {}, _sharding(raw))
        built.append((node, ref))
    for _, name, picks, out_shapes, node_attrs, raw in generics:
        operands, ref_operands = [], []
        for k, j in picks:
            node, ref = built[k % len(built)]
            index = j % len(node.shapes)
            operands.append(Value(node, index))
            ref_operands.append((ref, index))
        node = Generic(
            name, operands, [Shape(d, s) for d, s in out_shapes], node_attrs, _sharding(raw)
        )
        ref = reference.PyNode(
            "Generic", name, ref_operands, out_shapes, node_attrs, _sharding(raw)
        )
        built.append((node, ref))
    return built
