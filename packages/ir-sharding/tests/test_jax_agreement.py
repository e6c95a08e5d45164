"""HLO text, device index maps, shard shapes and placement equality against jax's own
conversions of the same NamedSharding, over generated meshes (1 to 8 devices, 1 to 3 axes,
shuffled device orders and subsets) and partition specs."""

import jax
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec

from ir_sharding import Mesh, ShardingError, ShardingKind, ShardingSpec

DEVICES = {d.id: d for d in jax.devices()}
NAMES = ("a", "b", "c")


def factorizations(n, parts):
    if parts == 1:
        return [(n,)]
    return [
        (d, *rest)
        for d in range(1, n + 1)
        if n % d == 0
        for rest in factorizations(n // d, parts - 1)
    ]


@st.composite
def meshes(draw, n=None):
    n = n or draw(st.integers(1, 8))
    ids = draw(st.permutations(range(8)))[:n]
    ndim = draw(st.integers(1, 3))
    shape = draw(st.sampled_from(factorizations(n, ndim)))
    return Mesh(ids, shape, NAMES[:ndim])


@st.composite
def partition_specs(draw, mesh, rank=None):
    """Each mesh axis goes to one tensor dim or none, in a drawn order; entries are written as
    names, indices or tuples of them."""
    rank = draw(st.integers(0, 3)) if rank is None else rank
    dims = [[] for _ in range(rank)]
    for axis in draw(st.permutations(range(mesh.ndim))):
        if rank and draw(st.booleans()):
            dims[draw(st.integers(0, rank - 1))].append(axis)
    entries = []
    for axes in dims:
        written = [mesh.axis_names[a] if draw(st.booleans()) else a for a in axes]
        if not written:
            entries.append(draw(st.sampled_from([None, ()])))
        elif len(written) == 1 and draw(st.booleans()):
            entries.append(written[0])
        else:
            entries.append(tuple(written))
    return tuple(entries)


def jax_sharding(mesh, spec):
    devices = np.array([DEVICES[i] for i in mesh.device_ids], dtype=object).reshape(mesh.shape)
    named = spec.partition_spec
    return NamedSharding(jax.sharding.Mesh(devices, mesh.axis_names), PartitionSpec(*named))


def jax_indices(sharding, shape):
    return {
        d.id: tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
        for d, index in sharding.devices_indices_map(shape).items()
    }


def ours(spec, shape):
    return {
        d: tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
        for d, index in spec.device_indices(shape).items()
    }


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_hlo_text_and_indices_match_jax(data):
    mesh = data.draw(meshes())
    spec = ShardingSpec(mesh, data.draw(partition_specs(mesh)))
    theirs = jax_sharding(mesh, spec)
    rank = spec.rank
    assert spec.to_hlo_text() == str(theirs._to_xla_hlo_sharding(rank))
    shape = tuple(t * data.draw(st.integers(1, 3)) for t in spec.tile_dims)
    # jax gives slice(None) for a dim it does not split; so do we.
    assert spec.device_indices(shape) == {
        d.id: index for d, index in theirs.devices_indices_map(shape).items()
    }
    assert list(spec.device_indices(shape)) == list(mesh.device_ids)
    assert spec.shard_shape(shape) == theirs.shard_shape(shape)
    converted = spec.to_jax()
    assert converted.is_equivalent_to(theirs, rank)
    assert converted.spec == theirs.spec and converted.mesh == theirs.mesh


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_canonical_bytes_are_equal_exactly_when_jax_places_the_same_way(data):
    n = data.draw(st.integers(1, 8))
    rank = data.draw(st.integers(0, 3))
    first = data.draw(meshes(n))
    # The second mesh: the same devices, refactored or reordered, or the same mesh.
    second = data.draw(
        st.sampled_from(
            [
                first,
                Mesh(first.device_ids, (n,), ("a",)),
                Mesh(sorted(first.device_ids), first.shape, first.axis_names),
                data.draw(meshes(n)),
            ]
        )
    )
    if set(second.device_ids) != set(first.device_ids):
        second = Mesh(first.device_ids, second.shape, second.axis_names)
    x = ShardingSpec(first, data.draw(partition_specs(first, rank)))
    y = ShardingSpec(second, data.draw(partition_specs(second, rank)))
    shape = (n,) * rank  # every split count divides n: no empty or ragged blocks
    same_place = jax_indices(jax_sharding(first, x), shape) == jax_indices(
        jax_sharding(second, y), shape
    )
    event(f"same placement: {same_place}")
    assert (x.canonical_bytes() == y.canonical_bytes()) == same_place
    assert (x == y) == same_place


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_explicit_device_lists_print_as_xla_prints_them(data):
    """``to_hlo_text(devices="ids")`` against XLA's own printer of the same tile assignment,
    given as an explicit device list (torch_xla's form)."""
    from jax._src.lib import xla_client as xc

    mesh = data.draw(meshes())
    spec = ShardingSpec(mesh, data.draw(partition_specs(mesh)))
    text = spec.to_hlo_text(devices="ids")
    if spec.kind is ShardingKind.REPLICATED:
        assert text == str(xc.HloSharding.replicate())
        return
    proto = xc.OpSharding()
    proto.type = xc.OpSharding.Type.OTHER
    tile = spec._tile
    proto.tile_assignment_dimensions = list(spec.tile_dims) + (
        [tile.shape[-1]] if tile.shape[-1] > 1 else []
    )
    proto.tile_assignment_devices = [mesh.device_ids[p] for p in tile.reshape(-1).tolist()]
    proto.replicate_on_last_tile_dim = tile.shape[-1] > 1
    assert text == str(xc.HloSharding.from_proto(proto))
    # and the list is where jax puts each block: device id -> its block, both ways
    shape = tuple(t * 2 for t in spec.tile_dims)
    assert spec.device_indices(shape) == {
        d.id: index for d, index in jax_sharding(mesh, spec).devices_indices_map(shape).items()
    }


def test_explicit_device_lists_of_the_special_kinds():
    mesh = Mesh([6, 2, 5, 0], (2, 2), ("a", "b"))
    assert ShardingSpec(mesh, ("b", "a")).to_hlo_text(devices="ids") == "{devices=[2,2]6,5,2,0}"
    assert ShardingSpec.maximal(mesh, 5).to_hlo_text(devices="ids") == "{maximal device=5}"
    assert ShardingSpec.manual(mesh).to_hlo_text(devices="ids") == "{manual}"
    with pytest.raises(ShardingError, match="'positions' or 'ids'"):
        ShardingSpec(mesh, ("a", None)).to_hlo_text(devices="iota")


def test_special_kinds_print_as_xla_prints_them():
    from jax._src.lib import xla_client as xc

    mesh = Mesh([6, 2, 5, 0], (2, 2), ("a", "b"))
    assert ShardingSpec.replicated(mesh).to_hlo_text() == str(xc.HloSharding.replicate())
    assert ShardingSpec.manual(mesh).to_hlo_text() == str(xc.HloSharding.manual())
    proto = xc.OpSharding()
    proto.type = xc.OpSharding.Type.MAXIMAL
    proto.tile_assignment_dimensions = [1]
    proto.tile_assignment_devices = [2]  # position of device 5 in the mesh
    assert ShardingSpec.maximal(mesh, 5).to_hlo_text() == str(xc.HloSharding.from_proto(proto))


def test_special_kinds_convert_to_jax():
    mesh = Mesh([3, 1, 2, 0], (2, 2), ("a", "b"))
    maximal = ShardingSpec.maximal(mesh, 2).to_jax()
    assert maximal.device_set == {DEVICES[2]}
    manual = ShardingSpec.manual(mesh).to_jax()
    assert str(manual._to_xla_hlo_sharding(2)) == "{manual}"
    assert [d.id for d in manual.mesh.devices.flat] == [3, 1, 2, 0]
    replicated = ShardingSpec.replicated(mesh).to_jax()
    assert replicated.is_fully_replicated


def test_device_ids_are_global_ordinals():
    from ir_sharding import global_devices

    order = global_devices()
    # One process: the order is jax's own ids, so id k is jax's device k.
    assert [d.id for d in order] == sorted(DEVICES)
    assert ShardingSpec(Mesh([2], (1,), ("a",)), (None,)).to_jax().device_set == {DEVICES[2]}
    bad = Mesh([0, len(order)], (2,), ("a",))
    with pytest.raises(ShardingError, match=rf"device {len(order)} of the mesh does not exist"):
        ShardingSpec(bad, ("a",)).to_jax()


def test_examples_from_the_issue():
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    assert ShardingSpec(mesh, ("data", None)).to_hlo_text() == (
        "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"
    )
    assert ShardingSpec(mesh, (None, "model")).to_hlo_text() == (
        "{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}"
    )
    assert ShardingSpec(mesh, (None, None)).to_hlo_text() == "{replicated}"
    # Device ids travel in the device assignment, not in the text: two orders, one text,
    # two placements.
    flipped = Mesh(range(7, -1, -1), (4, 2), ("data", "model"))
    a, b = ShardingSpec(mesh, ("data", None)), ShardingSpec(flipped, ("data", None))
    assert a.to_hlo_text() == b.to_hlo_text()
    assert a.canonical_bytes() != b.canonical_bytes()
    assert a.kind is ShardingKind.PARTIAL


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_check_even_refuses_exactly_what_jax_cannot_place(data):
    mesh = data.draw(meshes())
    spec = ShardingSpec(mesh, data.draw(partition_specs(mesh)))
    shape = tuple(data.draw(st.integers(0, 13)) for _ in range(spec.rank))
    host = np.zeros(shape, np.float32)
    try:
        jax.device_put(host, jax_sharding(mesh, spec))
    except ValueError as e:  # jax's IndivisibleError
        event("uneven")
        with pytest.raises(ShardingError, match=r"is not a multiple of") as raised:
            spec.check_even(shape)
        dim = int(str(raised.value).split("splits dim ")[1].split()[0])
        assert shape[dim] % spec.tile_dims[dim], str(e)
    else:
        spec.check_even(shape)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_evenly_is_placeable_and_holds_every_uneven_block(data):
    """``evenly(shape)``: jax places an array of ``shape`` in it, it splits every dim the spec
    splits evenly as the spec does, and each device's block under the (uneven) spec lies in
    the block it holds under ``evenly``, as XLA's ``devices_indices_map`` says."""
    mesh = data.draw(meshes())
    spec = ShardingSpec(mesh, data.draw(partition_specs(mesh)))
    shape = tuple(data.draw(st.integers(0, 13)) for _ in range(spec.rank))
    held = spec.evenly(shape)
    jax.device_put(np.zeros(shape, np.float32), held.to_jax())
    for d, t, h in zip(shape, spec.tile_dims, held.tile_dims, strict=True):
        assert h == (1 if d % t else t), (shape, spec, held)
    if held == spec:
        assert held is spec
        return
    event("uneven")
    wanted, holds = ours(spec, shape), ours(held, shape)
    for device, block in wanted.items():
        for (a, b), (lo, hi) in zip(block, holds[device], strict=True):
            assert lo <= a and (b <= hi or a == b), (device, block, holds[device])


def test_check_even_names_the_dim_axes_and_blocks():
    spec = ShardingSpec(Mesh(range(8), (4, 2), ("data", "model")), ("data", "model"))
    with pytest.raises(ShardingError) as e:
        spec.check_even((6, 5), "the tensor (6, 5)")
    assert str(e.value) == (
        "partition spec ('data', 'model') splits dim 0 of the tensor (6, 5) (size 6) over "
        "'data' into 4 blocks, and 6 is not a multiple of 4; split only dims that divide "
        "evenly (pad the tensor, or shard another dim): uneven blocks are not supported. "
        "If dim 0 is a batch (the last batch of an epoch is smaller), drop it "
        "(DataLoader(..., drop_last=True)) or pad it to a multiple of 4"
    )
    with pytest.raises(ShardingError) as e:  # (a dim past the first is no batch)
        spec.check_even((8, 5), "the tensor (8, 5)")
    assert str(e.value).endswith("shard another dim): uneven blocks are not supported")
    spec.check_even((8, 2))  # even
    ShardingSpec.replicated(spec.mesh).check_even((3, 5, 7))  # fits any shape
    with pytest.raises(ShardingError, match="has 2 entries"):
        spec.check_even((8,))
