"""ShardingSpec.from_jax against jax itself: round trips through to_jax over many meshes and
specs, NamedShardings written with jax directly, shardings XLA chose for compiled outputs, the
other kinds read through devices_indices_map, and every error; global_devices and
device_ordinal."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec, SingleDeviceSharding

import ir_sharding
from ir_sharding import Mesh, ShardingError, ShardingKind, ShardingSpec

DEVICES = {d.id: d for d in jax.devices()}
N = len(DEVICES)


def placement(sharding, shape):
    """jax's own answer: device id -> (start, stop) per dim."""
    return {
        d.id: tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
        for d, index in sharding.devices_indices_map(shape).items()
    }


def jax_mesh(ids, shape, names, axis_types=None):
    devices = np.array([DEVICES[i] for i in ids], dtype=object).reshape(shape)
    return jax.sharding.Mesh(devices, names, axis_types)


def gspmd(sharding, rank):
    """The same placement as a GSPMDSharding: what jit keeps for inputs placed that way. Only
    the tests build one (jax exports no constructor); from_jax reads it through public API."""
    from jax._src.sharding_impls import GSPMDSharding

    devices = tuple(sharding.mesh.devices.flat)
    return GSPMDSharding(devices, sharding._to_xla_hlo_sharding(rank))


def shapes_for(spec, rank):
    """Shapes whose dims every tile count divides (jax refuses the others)."""
    tiles = spec.tile_dims if spec.rank is not None else (1,) * rank
    return [tuple(t * k for t in tiles) for k in (1, 2, 3)]


MESHES = [
    Mesh(range(8), (8,), ("x",)),
    Mesh([5, 2, 7, 0], (4,), ("x",)),
    Mesh([3], (1,), ("x",)),
    Mesh(range(8), (4, 2), ("data", "model")),
    Mesh(range(7, -1, -1), (2, 4), ("a", "b")),
    Mesh([6, 1, 4, 3, 0, 7], (3, 2), ("a", "b")),
    Mesh([1, 0, 3, 2, 5, 4, 7, 6], (2, 2, 2), ("a", "b", "c")),
    Mesh([4, 6, 5, 7], (2, 1, 2), ("a", "b", "c")),
    Mesh(range(8), (1, 8), ("a", "b")),
]


def all_specs(mesh, rank):
    """Every assignment of mesh axes to tensor dims (or none), in every order within a dim."""
    out = []
    for owners in itertools.product(range(-1, rank), repeat=mesh.ndim):
        dims = [[a for a in range(mesh.ndim) if owners[a] == k] for k in range(rank)]
        for orders in itertools.product(*(itertools.permutations(d) for d in dims)):
            entries = []
            for axes in orders:
                names = tuple(mesh.axis_names[a] for a in axes)
                entries.append(None if not names else names[0] if len(names) == 1 else names)
            out.append(tuple(entries))
    return out


CASES = [
    (mesh, entries)
    for mesh in MESHES
    for rank in (1, 2, 3)
    for entries in all_specs(mesh, rank)[:: max(1, len(all_specs(mesh, rank)) // 12)]
]


def test_the_cases_cover_every_kind():
    kinds = {ShardingSpec(m, e).kind for m, e in CASES}
    assert kinds == {ShardingKind.REPLICATED, ShardingKind.TILED, ShardingKind.PARTIAL}
    assert any(isinstance(x, tuple) for _, e in CASES for x in e)  # multi-axis entries
    for k in range(3):  # tiled on each dim
        assert any(len(e) > k and e[k] is not None for _, e in CASES)


@pytest.mark.parametrize(("mesh", "entries"), CASES, ids=lambda v: repr(v))
def test_round_trip_through_to_jax(mesh, entries):
    spec = ShardingSpec(mesh, entries)
    sharding = spec.to_jax()
    back = ShardingSpec.from_jax(sharding, len(entries))
    assert back == spec
    assert back.mesh == spec.mesh
    assert back.partition_spec == spec.partition_spec
    converted = back.to_jax()
    assert converted == sharding  # jax's own equality: same mesh, same spec
    for shape in shapes_for(spec, len(entries)):
        assert placement(converted, shape) == placement(sharding, shape)


@st.composite
def meshes(draw):
    n = draw(st.integers(1, N))
    ids = draw(st.permutations(range(N)))[:n]
    ndim = draw(st.integers(1, 3))
    sizes = [d for d in range(1, n + 1) if n % d == 0]
    shape = []
    left = n
    for _ in range(ndim - 1):
        d = draw(st.sampled_from([s for s in sizes if left % s == 0]))
        shape.append(d)
        left //= d
    shape.append(left)
    return Mesh(ids, shape, ("a", "b", "c")[:ndim])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_round_trip_generated(data):
    mesh = data.draw(meshes())
    rank = data.draw(st.integers(0, 3))
    entries = data.draw(st.sampled_from(all_specs(mesh, rank)))
    spec = ShardingSpec(mesh, entries)
    sharding = spec.to_jax()
    back = ShardingSpec.from_jax(sharding, rank)
    assert back == spec and back.mesh == mesh and back.to_jax() == sharding
    # The same placement through the path for other kinds: jax's device index maps agree.
    other = ShardingSpec.from_jax(gspmd(sharding, rank), rank)
    assert other == spec
    for shape in shapes_for(spec, rank):
        assert placement(other.to_jax(), shape) == placement(sharding, shape)


def test_named_sharding_written_with_jax():
    # A shorter partition spec than the rank, a singleton tuple, a permuted 3-D mesh.
    ids = [7, 2, 5, 0, 3, 6, 1, 4]
    theirs = NamedSharding(jax_mesh(ids, (2, 2, 2), ("x", "y", "z")), PartitionSpec(("z",), "x"))
    spec = ShardingSpec.from_jax(theirs, 3)
    assert spec.mesh == Mesh(ids, (2, 2, 2), ("x", "y", "z"))
    assert list(spec.mesh.device_ids) == [d.id for d in theirs.mesh.devices.flat]
    assert spec.partition_spec == ("z", "x", None)
    assert spec.kind is ShardingKind.PARTIAL
    for shape in [(2, 2, 1), (4, 6, 3)]:
        assert placement(spec.to_jax(), shape) == placement(theirs, shape)


def test_explicit_axes_convert_like_auto():
    mesh = jax_mesh(range(8), (4, 2), ("a", "b"), (AxisType.Explicit,) * 2)
    theirs = NamedSharding(mesh, PartitionSpec("b", "a"))
    spec = ShardingSpec.from_jax(theirs, 2)
    assert spec == ShardingSpec(Mesh(range(8), (4, 2), ("a", "b")), ("b", "a"))
    assert placement(spec.to_jax(), (4, 8)) == placement(theirs, (4, 8))
    # reduced axes hold whole copies: the placement is the replicated one.
    reduced = NamedSharding(mesh, PartitionSpec("a", reduced={"b"}))
    assert ShardingSpec.from_jax(reduced, 1) == ShardingSpec(spec.mesh, ("a",))
    assert placement(ShardingSpec.from_jax(reduced, 1).to_jax(), (4,)) == placement(reduced, (4,))


@pytest.mark.parametrize("mesh", MESHES, ids=repr)
def test_replicated_and_manual_round_trip(mesh):
    replicated = ShardingSpec.replicated(mesh)
    back = ShardingSpec.from_jax(replicated.to_jax(), 2)
    assert back == replicated and back.mesh == mesh
    assert back.kind is ShardingKind.REPLICATED
    assert back.to_jax().is_fully_replicated
    manual = ShardingSpec.manual(mesh)
    sharding = manual.to_jax()
    back = ShardingSpec.from_jax(sharding, 3)
    assert back == manual and back.mesh == mesh and back.kind is ShardingKind.MANUAL
    assert back.to_jax() == sharding


@pytest.mark.parametrize("mesh", MESHES, ids=repr)
def test_maximal_round_trips_with_its_mesh(mesh):
    for device in mesh.device_ids:
        spec = ShardingSpec.maximal(mesh, device)
        sharding = spec.to_jax()
        assert isinstance(sharding, SingleDeviceSharding)
        back = ShardingSpec.from_jax(sharding, 2, mesh=mesh)
        assert back == spec and back.mesh == mesh and back.device_id == device
        assert back.to_jax() == sharding


def test_single_device_without_a_mesh_that_holds_it():
    sharding = SingleDeviceSharding(DEVICES[5])
    alone = ShardingSpec.replicated(Mesh([5], (1,), ("devices",)))
    for mesh in (None, Mesh([0, 1], (2,), ("a",))):
        spec = ShardingSpec.from_jax(sharding, 2, mesh)
        assert spec == alone and spec.mesh == alone.mesh
        assert spec.to_jax().device_set == sharding.device_set
        assert placement(spec.to_jax(), (3, 4)) == placement(sharding, (3, 4))


def test_sharding_xla_chose_under_shardy():
    mesh = jax_mesh([3, 1, 0, 2, 7, 5, 6, 4], (4, 2), ("a", "b"))
    given_sharding = NamedSharding(mesh, PartitionSpec("a", "b"))
    x = jax.device_put(jnp.zeros((8, 4)), given_sharding)
    outs = jax.jit(lambda x: (x.T * 2, x.sum(0), x.reshape(2, 4, 4), jnp.tile(x, (1, 2)))).lower(x)
    compiled = outs.compile()
    chosen = compiled.output_shardings
    assert any(s != given_sharding for s in chosen)
    for s, out in zip(chosen, compiled.out_info, strict=True):
        spec = ShardingSpec.from_jax(s, len(out.shape))
        assert spec.to_jax().devices_indices_map(out.shape) == s.devices_indices_map(out.shape)


def test_gspmd_sharding_xla_chose():
    # An input placed by a GSPMDSharding keeps jit's outputs GSPMDShardings: XLA's own choice,
    # in neither NamedSharding nor SingleDeviceSharding form.
    mesh = jax_mesh([3, 1, 0, 2, 7, 5, 6, 4], (4, 2), ("a", "b"))
    placed = gspmd(NamedSharding(mesh, PartitionSpec("a", "b")), 2)
    x = jax.device_put(jnp.zeros((8, 4)), placed)

    def f(x):
        return x.T, x.sum(1), x.reshape(2, 4, 4), jnp.tile(x, (1, 2)), x.sum(), x[None]

    compiled = jax.jit(f).lower(x).compile()
    chosen = compiled.output_shardings
    assert not any(isinstance(s, (NamedSharding, SingleDeviceSharding)) for s in chosen)
    assert any(not s.is_fully_replicated for s in chosen)
    for s, out in zip(chosen, compiled.out_info, strict=True):
        shape = out.shape
        spec = ShardingSpec.from_jax(s, len(shape))
        assert spec.to_jax().devices_indices_map(shape) == s.devices_indices_map(shape)
        assert spec.mesh.size == len(s.device_set)
        bigger = tuple(2 * d for d in shape)
        assert spec.to_jax().devices_indices_map(bigger) == s.devices_indices_map(bigger)


def test_other_kinds_get_axes_per_split_dim_and_replicas_last():
    mesh = jax_mesh([6, 1, 4, 3, 0, 7], (3, 2), ("a", "b"))
    theirs = NamedSharding(mesh, PartitionSpec(None, "a"))
    spec = ShardingSpec.from_jax(gspmd(theirs, 3), 3)
    assert spec.mesh.axis_names == ("t1", "replicas")
    assert spec.mesh.shape == (3, 2)
    assert spec.partition_spec == (None, "t1", None)
    assert placement(spec.to_jax(), (2, 6, 5)) == placement(theirs, (2, 6, 5))
    replicated = gspmd(NamedSharding(theirs.mesh, PartitionSpec()), 2)
    spec = ShardingSpec.from_jax(replicated, 2)
    assert spec.mesh == Mesh([0, 1, 3, 4, 6, 7], (6,), ("devices",))
    assert spec.kind is ShardingKind.REPLICATED


def test_gspmd_maximal_is_what_jax_says_it_is():
    # jax reports a GSPMD maximal sharding as fully replicated over its device list, and every
    # device as holding the whole array; from_jax follows jax's public answers.
    from jax._src.lib import xla_client as xc

    proto = xc.OpSharding()
    proto.type = xc.OpSharding.Type.MAXIMAL
    proto.tile_assignment_dimensions = [1]
    proto.tile_assignment_devices = [2]
    from jax._src.sharding_impls import GSPMDSharding

    s = GSPMDSharding(tuple(jax.devices()), xc.HloSharding.from_proto(proto))
    spec = ShardingSpec.from_jax(s, 2)
    assert spec.kind is ShardingKind.REPLICATED
    assert placement(spec.to_jax(), (4, 4)) == placement(s, (4, 4))


class _Ragged(jax.sharding.Sharding):
    """A sharding whose blocks are not a tiling: device k holds rows [0, k+1)."""

    def __init__(self, devices):
        self._devices = list(devices)

    @property
    def device_set(self):
        return set(self._devices)

    @property
    def is_fully_replicated(self):
        return False

    def devices_indices_map(self, global_shape):
        return {d: (slice(0, k + 1),) for k, d in enumerate(self._devices)}


def test_errors():
    mesh = Mesh(range(4), (2, 2), ("a", "b"))
    named = ShardingSpec(mesh, ("a", "b")).to_jax()
    for bad in ("x", None, PartitionSpec("a"), ShardingSpec(mesh, ("a",)), mesh):
        with pytest.raises(ShardingError, match=r"is not a jax sharding"):
            ShardingSpec.from_jax(bad, 1)
    for bad in (-1, True, 1.5, "2", None):
        with pytest.raises(ShardingError, match=r"ndim must be a non-negative integer"):
            ShardingSpec.from_jax(named, bad)
    with pytest.raises(ShardingError, match=r"has 2 entries but ndim is 1"):
        ShardingSpec.from_jax(named, 1)
    with pytest.raises(ShardingError, match=r"mesh must be an ir_sharding.Mesh or None"):
        ShardingSpec.from_jax(SingleDeviceSharding(DEVICES[0]), 1, mesh=named.mesh)
    with pytest.raises(ShardingError, match=r"AbstractMesh, which names no devices"):
        ShardingSpec.from_jax(NamedSharding(named.mesh.abstract_mesh, PartitionSpec("a")), 1)
    mixed = jax_mesh(range(4), (2, 2), ("a", "b"), (AxisType.Manual, AxisType.Auto))
    with pytest.raises(ShardingError, match=r"Manual and non-Manual axes"):
        ShardingSpec.from_jax(NamedSharding(mixed, PartitionSpec(None, "b")), 2)
    explicit = jax_mesh(range(4), (2, 2), ("a", "b"), (AxisType.Explicit,) * 2)
    with pytest.raises(ShardingError, match=r"unreduced axes \{'b'\}"):
        ShardingSpec.from_jax(NamedSharding(explicit, PartitionSpec("a", unreduced={"b"})), 1)
    loose = NamedSharding(named.mesh, PartitionSpec("a", PartitionSpec.UNCONSTRAINED))
    with pytest.raises(ShardingError, match=r"entry 1 .* is UNCONSTRAINED"):
        ShardingSpec.from_jax(loose, 2)
    numbered = NamedSharding(jax_mesh(range(4), (2, 2), (1, 2)), PartitionSpec(1))
    with pytest.raises(ShardingError, match=r"is not an ir_sharding Mesh: axis name 1"):
        ShardingSpec.from_jax(numbered, 1)
    from jax._src.lib import xla_client as xc
    from jax._src.sharding_impls import GSPMDSharding

    manual = GSPMDSharding(tuple(jax.devices()[:4]), xc.HloSharding.manual())
    with pytest.raises(ShardingError, match=r"gives no device indices for shape \(4, 4\)"):
        ShardingSpec.from_jax(manual, 2)
    with pytest.raises(ShardingError, match=r"does not cut dim 0 .* into equal blocks"):
        ShardingSpec.from_jax(_Ragged(jax.devices()[:3]), 1)
    with pytest.raises(ShardingError, match=r"one block of a rank-2 tensor"):
        ShardingSpec.from_jax(_Ragged(jax.devices()[:3]), 2)


def test_global_devices_and_device_ordinal_are_public():
    order = ir_sharding.global_devices()
    assert "global_devices" in ir_sharding.__all__ and "device_ordinal" in ir_sharding.__all__
    # One process: jax's own ids, so ordinal k is jax's device k.
    assert [d.id for d in order] == sorted(DEVICES)
    assert order is ir_sharding.global_devices()  # built once
    for k, device in enumerate(order):
        assert ir_sharding.device_ordinal(device) == k
    for bad in ("cpu:0", 0, None, []):
        with pytest.raises(ShardingError, match=r"is not one of jax's devices"):
            ir_sharding.device_ordinal(bad)
