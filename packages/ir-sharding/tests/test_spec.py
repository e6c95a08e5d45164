"""ShardingSpec: kinds, canonical bytes, geometry (uneven included), errors."""

import itertools
import math
import pickle

import numpy as np
import pytest

from ir_sharding import Mesh, ShardingError, ShardingKind, ShardingSpec

MESH = Mesh(range(8), (4, 2), ("data", "model"))


@pytest.mark.parametrize(
    ("mesh", "partition_spec", "kind"),
    [
        (MESH, ("data", "model"), ShardingKind.TILED),
        (MESH, (("model", "data"), None), ShardingKind.TILED),
        (MESH, ("data", None), ShardingKind.PARTIAL),
        (MESH, (None, 1), ShardingKind.PARTIAL),
        (MESH, (None, None), ShardingKind.REPLICATED),
        (MESH, (), ShardingKind.REPLICATED),
        (Mesh(range(8), (8, 1), ("a", "b")), ("a",), ShardingKind.TILED),  # b has size 1
        (Mesh(range(8), (1, 8), ("a", "b")), ("a",), ShardingKind.REPLICATED),
        (Mesh([5], (1,), ("a",)), ("a",), ShardingKind.REPLICATED),
    ],
)
def test_kind_follows_the_placement(mesh, partition_spec, kind):
    assert ShardingSpec(mesh, partition_spec).kind is kind


def test_special_constructors():
    assert ShardingSpec.replicated(MESH).kind is ShardingKind.REPLICATED
    assert ShardingSpec.replicated(MESH).rank is None
    maximal = ShardingSpec.maximal(MESH, 5)
    assert maximal.kind is ShardingKind.MAXIMAL and maximal.device_id == 5
    assert ShardingSpec.manual(MESH).kind is ShardingKind.MANUAL
    assert ShardingSpec(MESH, ("data", None)).device_id is None


def test_partition_spec_is_given_back_by_name():
    spec = ShardingSpec(MESH, (1, None, ("data",), ()))
    assert spec.partition_spec == ("model", None, "data", None)
    assert ShardingSpec(MESH, ((1, 0),)).partition_spec == (("model", "data"),)
    assert spec.rank == 4
    assert ShardingSpec.manual(MESH).partition_spec is None


# -- canonical bytes ---------------------------------------------------------------------------


def _bytes(mesh, partition_spec):
    return ShardingSpec(mesh, partition_spec).canonical_bytes()


def test_equal_placements_have_equal_bytes():
    replicated = ShardingSpec.replicated(MESH).canonical_bytes()
    assert _bytes(MESH, (None, None)) == replicated
    assert _bytes(MESH, ()) == replicated
    # The same devices in another order still all hold everything.
    assert ShardingSpec.replicated(Mesh(range(7, -1, -1), (8,), ("x",))).canonical_bytes() == (
        replicated
    )
    # Names and indices; one-element tuples; size-1 mesh axes.
    assert (
        _bytes(MESH, ("data", None)) == _bytes(MESH, (0, None)) == _bytes(MESH, (("data",), None))
    )
    assert _bytes(MESH, (("data", "model"),)) == _bytes(Mesh(range(8), (8,), ("x",)), ("x",))
    one = Mesh(range(8), (4, 1, 2), ("data", "unit", "model"))
    assert _bytes(one, ("data", "unit")) == _bytes(MESH, ("data", None))
    # Axis names do not matter, only which device holds which block.
    assert _bytes(Mesh(range(8), (4, 2), ("p", "q")), ("p", None)) == _bytes(MESH, ("data", None))


def test_different_placements_have_different_bytes():
    reordered = Mesh([1, 0, 2, 3, 4, 5, 6, 7], (4, 2), ("data", "model"))
    placements = [
        ShardingSpec(MESH, ("data", "model")),
        ShardingSpec(MESH, ("model", "data")),
        ShardingSpec(MESH, (("data", "model"), None)),
        ShardingSpec(MESH, (("model", "data"), None)),
        ShardingSpec(reordered, ("data", "model")),  # device order
        ShardingSpec(MESH, ("data", None)),  # replicated last tile dim
        ShardingSpec(reordered, (None, "model")),
        ShardingSpec(MESH, (None, "model")),
        ShardingSpec(MESH, ("data", None, None)),  # rank
        ShardingSpec.replicated(MESH),
        ShardingSpec.replicated(Mesh(range(4), (4,), ("x",))),  # other devices
        ShardingSpec.manual(MESH),  # manual vs tiled
        ShardingSpec.manual(reordered),
        ShardingSpec.maximal(MESH, 0),
        ShardingSpec.maximal(MESH, 1),
    ]
    raw = [p.canonical_bytes() for p in placements]
    assert len(set(raw)) == len(raw)
    assert len(set(placements)) == len(placements)
    # A mesh of one device replicates (over that device); a maximal spec is a different thing.
    single = Mesh([3], (1,), ("a",))
    assert ShardingSpec(single, ("a",)).canonical_bytes() != (
        ShardingSpec.maximal(single, 3).canonical_bytes()
    )


def test_bytes_change_when_the_block_owners_change_even_with_the_same_groups():
    # Replication groups {0,1},{2,3},... in one order of blocks against another.
    a = ShardingSpec(Mesh([0, 1, 2, 3, 4, 5, 6, 7], (4, 2), ("d", "m")), ("d",))
    b = ShardingSpec(Mesh([2, 3, 0, 1, 4, 5, 6, 7], (4, 2), ("d", "m")), ("d",))
    c = ShardingSpec(Mesh([1, 0, 3, 2, 5, 4, 7, 6], (4, 2), ("d", "m")), ("d",))
    assert a.canonical_bytes() != b.canonical_bytes()
    assert a.canonical_bytes() == c.canonical_bytes()  # order inside a group is no placement
    assert a.to_hlo_text() == c.to_hlo_text()


def test_value_semantics_and_pickle():
    for spec in [
        ShardingSpec(MESH, ("data", ("model",))),
        ShardingSpec.replicated(MESH),
        ShardingSpec.maximal(MESH, 6),
        ShardingSpec.manual(MESH),
    ]:
        again = pickle.loads(pickle.dumps(spec))
        assert again == spec and hash(again) == hash(spec)
        assert again.canonical_bytes() == spec.canonical_bytes()
        assert again.to_hlo_text() == spec.to_hlo_text()
        assert repr(again) == repr(spec)
    assert ShardingSpec(MESH, ("data", None)) != "data"


# -- geometry ----------------------------------------------------------------------------------


def _xla_blocks(n, t):
    """XLA's rule, independently: ceil-sized blocks; the last ones shorter or empty."""
    c = math.ceil(n / t)
    return [(min(i * c, n), min((i + 1) * c, n)) for i in range(t)]


@pytest.mark.parametrize("shape", [(8, 6), (7, 6), (5, 3), (3, 1), (1, 1), (0, 5), (9, 13)])
@pytest.mark.parametrize(
    "partition_spec", [("data", "model"), ("model", "data"), (("data", "model"), None), (None, 0)]
)
def test_device_indices_follow_xla_rule_uneven_included(shape, partition_spec):
    spec = ShardingSpec(MESH, partition_spec)
    got = spec.device_indices(shape)
    grid = MESH.logical_mesh()
    assert list(got) == list(MESH.device_ids)
    covered = np.zeros(shape, dtype=int)
    for device, slices in got.items():
        position = (int(c[0]) for c in np.nonzero(grid == device))
        coords = dict(zip(MESH.axis_names, position, strict=True))
        for d, (s, entry) in enumerate(zip(slices, spec.partition_spec, strict=True)):
            axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
            if not axes:
                assert s == slice(None)
                continue
            # The block index along dim d: the device's mesh coordinates over the dim's axes,
            # major to minor.
            splits = [MESH.shape[MESH.axis_index(a)] for a in axes]
            block = 0
            for a, size in zip(axes, splits, strict=True):
                block = block * size + coords[a]
            assert (s.start, s.stop) == _xla_blocks(shape[d], math.prod(splits))[block]
        covered[slices] += 1
    # Partial replication: each element is held by the replication-group size.
    group = MESH.size // math.prod(spec.tile_dims)
    assert (covered == group).all()
    assert spec.shard_shape(shape) == tuple(
        math.ceil(n / t) for n, t in zip(shape, spec.tile_dims, strict=True)
    )


def test_geometry_of_the_special_kinds():
    full = (slice(None), slice(None))
    assert ShardingSpec.maximal(MESH, 4).device_indices((3, 2)) == {4: full}
    assert ShardingSpec.replicated(MESH).device_indices((3, 2)) == dict.fromkeys(range(8), full)
    assert ShardingSpec.manual(MESH).device_indices((3, 2)) == dict.fromkeys(range(8), full)
    assert ShardingSpec.replicated(MESH).shard_shape((3, 2)) == (3, 2)
    assert ShardingSpec(MESH, ()).device_indices(()) == dict.fromkeys(range(8), ())


def test_visualize_shows_every_device_on_its_block():
    picture = ShardingSpec(MESH, ("data", "model")).visualize((7, 6))
    assert picture.splitlines()[0] == ("TILED (7, 6) over mesh (data=4 x model=2), shard (2, 3)")
    rows = [line for line in picture.splitlines() if "|" in line]
    assert [line.split("|")[0].strip() for line in rows] == ["0:2", "2:4", "4:6", "6:7"]
    assert [[c.strip() for c in line.split("|")[1:-1]] for line in rows] == [
        ["0", "1"],
        ["2", "3"],
        ["4", "5"],
        ["6", "7"],
    ]
    partial = ShardingSpec(MESH, (None, "model")).visualize((4, 4))
    assert "| 0,2,4,6 | 1,3,5,7 |" in partial
    deep = ShardingSpec(MESH, ("data", None, "model")).visualize((8, 2, 4))
    assert "[6:8, 0:2, 2:4] -> device 7" in deep
    maximal = ShardingSpec.maximal(MESH, 4).visualize((2,))
    assert [line for line in maximal.splitlines() if "|" in line] == ["|  4  |"]


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("partition_spec", "message"),
    [
        (("data", "modle"), r"names mesh axis 'modle' \(entry 1\), but the mesh's axes are"),
        ((2, None), r"uses mesh axis index 2 \(entry 0\), out of range for a mesh with 2 axes"),
        ((-1,), r"uses mesh axis index -1"),
        (("data", "data"), r"uses mesh axis 'data' twice \(entries 0 and 1\)"),
        ((("data", 0),), r"uses mesh axis 'data' twice \(entry 0\)"),
        (((None, "data"),), "a tuple entry lists mesh axes"),
        ((("data", ("model",)),), "a tuple entry lists mesh axes"),
        ((1.0,), r"1.0 \(float\) is not a mesh axis name or index"),
        ((True,), r"True \(bool\) is not a mesh axis name or index"),
        ("data", r"must be a tuple with one entry per tensor dim.*\('data',\)"),
        (None, "must be a tuple"),
    ],
)
def test_bad_partition_specs_name_the_value_and_the_rule(partition_spec, message):
    with pytest.raises(ShardingError, match=message):
        ShardingSpec(MESH, partition_spec)


def test_rank_is_checked_where_the_spec_meets_a_tensor():
    spec = ShardingSpec(MESH, ("data", None))
    with pytest.raises(ShardingError, match=r"has 2 entries but global shape \(8,\) has rank 1"):
        spec.shard_shape((8,))
    with pytest.raises(ShardingError, match="has rank 3"):
        spec.device_indices((8, 2, 2))
    with pytest.raises(ShardingError, match="dims must be non-negative integers"):
        spec.device_indices((8, -2))
    ShardingSpec.replicated(MESH).shard_shape((1, 2, 3))  # any rank


def test_other_bad_arguments():
    with pytest.raises(ShardingError, match=r"mesh must be an ir_sharding.Mesh, got \(4, 2\)"):
        ShardingSpec((4, 2), ("data",))
    with pytest.raises(ShardingError, match=r"device 9 is not in the mesh \(devices \[0, 1"):
        ShardingSpec.maximal(MESH, 9)
    with pytest.raises(ShardingError, match="device_id must be an integer"):
        ShardingSpec.maximal(MESH, "0")


def test_every_generated_spec_over_small_meshes_is_consistent():
    """Kinds, tile dims and bytes agree with each other for every spec over three meshes."""
    for mesh in [MESH, Mesh(range(8), (2, 2, 2), ("a", "b", "c")), Mesh([4, 1], (2,), ("x",))]:
        choices = [None, *mesh.axis_names]
        for partition_spec in itertools.product(choices, repeat=2):
            named = [a for a in partition_spec if a is not None]
            if len(set(named)) != len(named):
                continue
            spec = ShardingSpec(mesh, partition_spec)
            blocks = math.prod(spec.tile_dims)
            expected = (
                ShardingKind.REPLICATED
                if blocks == 1
                else ShardingKind.TILED
                if blocks == mesh.size
                else ShardingKind.PARTIAL
            )
            assert spec.kind is expected
            assert (spec.canonical_bytes() == ShardingSpec.replicated(mesh).canonical_bytes()) == (
                blocks == 1
            )
