"""ShardingSpec: how a tensor is placed over a mesh, in the canonical form that is hashed.

Longer than 400 lines for one class: parsing a partition spec, the canonical bytes, and the
documented entry points to every conversion (HLO text, jax, from jax, pictures), whose bodies
live in their own modules.
"""

from __future__ import annotations

import enum
import math
import struct

import numpy as np

from ir_sharding._errors import ShardingError
from ir_sharding._mesh import Mesh


class ShardingKind(enum.IntEnum):
    """What a spec does with a tensor. The values are part of the canonical bytes."""

    REPLICATED = 0  # every device of the mesh holds the whole tensor
    MAXIMAL = 1  # one device holds it, and computes it, inside a program over the mesh
    TILED = 2  # split over every device: each holds one block
    PARTIAL = 3  # split over some mesh axes, replicated over the rest (last_tile_dim_replicate)
    MANUAL = 4  # each device holds its own local array; the program is written per device

    def __str__(self):
        return self.name


# Canonical bytes: _MAGIC, the kind as one byte, then the kind's body (package README).
_MAGIC = b"irsh1"


def _axes_of(mesh: Mesh, entry, k: int, spec: tuple) -> tuple[int, ...]:
    """The mesh axis indices that shard tensor dim ``k``: an entry is None, an axis (name or
    index), or a tuple of axes."""
    if entry is None:
        return ()
    items = tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)
    axes = []
    for item in items:
        if item is None or isinstance(item, (tuple, list)):
            raise ShardingError(
                f"entry {k} of partition spec {spec!r} is {entry!r}: a tuple entry lists mesh "
                f"axes (names or indices); write None alone for an unsharded dim"
            )
        if type(item) is not str and (
            isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer))
        ):
            raise ShardingError(
                f"entry {k} of partition spec {spec!r} is {entry!r}: {item!r} "
                f"({type(item).__name__}) is not a mesh axis name or index"
            )
        if type(item) is str and item not in mesh.axis_names:
            raise ShardingError(
                f"partition spec {spec!r} names mesh axis {item!r} (entry {k}), but the "
                f"mesh's axes are {mesh.axis_names!r}"
            )
        if type(item) is not str and not 0 <= item < mesh.ndim:
            raise ShardingError(
                f"partition spec {spec!r} uses mesh axis index {item} (entry {k}), out of range "
                f"for a mesh with {mesh.ndim} axes {mesh.axis_names!r}; use 0 to "
                f"{mesh.ndim - 1} or an axis name"
            )
        axes.append(mesh.axis_index(item))
    return tuple(axes)


def _parse(mesh: Mesh, partition_spec) -> tuple[tuple[int, ...], ...]:
    if isinstance(partition_spec, (str, bytes)) or not isinstance(partition_spec, (tuple, list)):
        raise ShardingError(
            f"partition_spec must be a tuple with one entry per tensor dim, got "
            f"{partition_spec!r}; for a 1-D tensor write ({partition_spec!r},)"
        )
    spec = tuple(partition_spec)
    entries = tuple(_axes_of(mesh, e, k, spec) for k, e in enumerate(spec))
    first_use = {}
    for k, axes in enumerate(entries):
        for a in axes:
            if a in first_use:
                where = f"entry {k}" if first_use[a] == k else f"entries {first_use[a]} and {k}"
                raise ShardingError(
                    f"partition spec {spec!r} uses mesh axis {mesh.axis_names[a]!r} twice "
                    f"({where}); each mesh axis shards at most one tensor dim, once"
                )
            first_use[a] = k
    return entries


def _names_only(partition_spec) -> bool:
    if type(partition_spec) is not tuple:
        return False
    for e in partition_spec:
        if e is not None and type(e) is not str:
            if type(e) is not tuple or any(type(a) is not str for a in e):
                return False
    return True


def _parse_by_name(mesh: Mesh, partition_spec):
    """``_parse``, remembered for specs written with axis names only (the usual way). Specs with
    indices are parsed every time: ``(True,) == (1,)``, so they cannot key a cache."""
    if not _names_only(partition_spec):
        return _parse(mesh, partition_spec)
    key = (mesh, partition_spec)
    entries = _PARSED.get(key)
    if entries is None:
        entries = _parse(mesh, partition_spec)
        if len(_PARSED) >= _PLACEMENTS_MAX:
            _PARSED.clear()
        _PARSED[key] = entries
    return entries


def _u64s(values) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def _placement(mesh: Mesh, entries, kind, device):
    """(kind, tile, canonical bytes). ``tile`` holds mesh positions: one block per index over
    the tile dims, the devices that hold it along the last axis; None when there is one block.
    """
    n = mesh.size
    tile = None
    if kind is None:
        shape = mesh.shape
        tile_dims = []
        for axes in entries:
            t = 1
            for a in axes:
                t *= shape[a]
            tile_dims.append(t)
        blocks = math.prod(tile_dims)
        if blocks == 1:
            kind = ShardingKind.REPLICATED
        else:
            kind = ShardingKind.TILED if blocks == n else ShardingKind.PARTIAL
            used = [a for axes in entries for a in axes]
            perm = used + [a for a in range(len(shape)) if a not in used]
            tile_dims.append(n // blocks)
            tile = np.arange(n).reshape(shape).transpose(perm).reshape(tile_dims)
            tile.flags.writeable = False
    head = _MAGIC + bytes((kind,))
    if kind is ShardingKind.REPLICATED:
        body = struct.pack("<I", n) + _u64s(sorted(mesh.device_ids))
    elif kind is ShardingKind.MAXIMAL:
        body = _u64s((device,))
    elif kind is ShardingKind.MANUAL:
        body = struct.pack("<I", mesh.ndim) + _u64s(mesh.shape) + _u64s(mesh.device_ids)
    else:
        groups = mesh._ids[tile]  # a copy: fancy indexing
        groups.sort(axis=-1)
        body = (
            struct.pack("<I", len(entries))
            + _u64s(tile.shape[:-1])
            + struct.pack("<I", tile.shape[-1])
            + groups.astype("<u8", copy=False).tobytes()
        )
    return kind, tile, head + body


# Placements already computed, by (mesh, entries, kind, device): a training loop builds the
# same few specs on every step. Bounded; values are immutable.
_PLACEMENTS: dict = {}
_PARSED: dict = {}
_PLACEMENTS_MAX = 4096


class _ByBytes:
    """A value its canonical bytes (``_bytes``) stand for: two of one class are equal, and hash
    alike, exactly when their bytes are."""

    __slots__ = ()

    def __eq__(self, other):
        if not isinstance(other, type(self)):
            return NotImplemented
        return self._bytes == other._bytes

    def __hash__(self):
        return hash(self._bytes)


class ShardingSpec(_ByBytes):
    """How a tensor is laid out over a ``Mesh``.

    Args:
        mesh: the ``Mesh``.
        partition_spec: one entry per tensor dim: ``None`` (not split), a mesh axis name or
            index (split over that axis), or a tuple of them (split over several axes, the first
            major). Each mesh axis appears at most once; mesh axes left out replicate.

    Also ``ShardingSpec.replicated(mesh)``, ``ShardingSpec.maximal(mesh, device_id)`` and
    ``ShardingSpec.manual(mesh)``, which fit a tensor of any rank.

    Two specs are equal, and have equal ``canonical_bytes()``, exactly when they place the
    tensor the same way: which device holds which block. The mesh's device order is part of
    that; axis names, and how the mesh is factored, are not.

    >>> mesh = Mesh(range(8), (4, 2), ("data", "model"))
    >>> ShardingSpec(mesh, ("data", None)).to_hlo_text()
    '{devices=[4,1,2]<=[8] last_tile_dim_replicate}'
    """

    __slots__ = ("_bytes", "_device", "_entries", "_hlo", "_jax", "_kind", "_mesh", "_tile")

    def __init__(self, mesh: Mesh, partition_spec):
        _check_mesh(mesh)
        self._init(mesh, _parse_by_name(mesh, partition_spec), None, None)

    @classmethod
    def replicated(cls, mesh: Mesh) -> ShardingSpec:
        """Every device of ``mesh`` holds the whole tensor; fits any rank."""
        _check_mesh(mesh)
        spec = cls.__new__(cls)
        spec._init(mesh, None, ShardingKind.REPLICATED, None)
        return spec

    @classmethod
    def maximal(cls, mesh: Mesh, device_id: int) -> ShardingSpec:
        """Only ``device_id``, a device of ``mesh``, holds the tensor and computes it."""
        _check_mesh(mesh)
        if isinstance(device_id, (bool, np.bool_)) or not isinstance(device_id, (int, np.integer)):
            raise ShardingError(f"device_id must be an integer, got {device_id!r}")
        if int(device_id) not in mesh.device_ids:
            raise ShardingError(
                f"device {device_id} is not in the mesh (devices {list(mesh.device_ids)}); a "
                f"maximal spec places the tensor on one of the mesh's devices"
            )
        spec = cls.__new__(cls)
        spec._init(mesh, None, ShardingKind.MAXIMAL, int(device_id))
        return spec

    @classmethod
    def manual(cls, mesh: Mesh) -> ShardingSpec:
        """Each device of ``mesh`` holds its own local array, of the tensor's shape: the
        program is written per device (as in ``shard_map``); fits any rank."""
        _check_mesh(mesh)
        spec = cls.__new__(cls)
        spec._init(mesh, None, ShardingKind.MANUAL, None)
        return spec

    def _init(self, mesh, entries, kind, device):
        self._mesh = mesh
        self._entries = entries
        self._device = device
        self._hlo = None
        self._jax = None
        key = (mesh, entries, kind, device)
        placement = _PLACEMENTS.get(key)
        if placement is None:
            placement = _placement(mesh, entries, kind, device)
            if len(_PLACEMENTS) >= _PLACEMENTS_MAX:
                _PLACEMENTS.clear()
            _PLACEMENTS[key] = placement
        self._kind, self._tile, self._bytes = placement

    # -- what it is -------------------------------------------------------------------------

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def kind(self) -> ShardingKind:
        return self._kind

    @property
    def partition_spec(self) -> tuple | None:
        """The entries by axis name (None, a name, or a tuple of names); None for the
        replicated(), maximal() and manual() specs, which fit any rank."""
        if self._entries is None:
            return None
        names = self._mesh.axis_names
        return tuple(
            None
            if not axes
            else names[axes[0]]
            if len(axes) == 1
            else tuple(names[a] for a in axes)
            for axes in self._entries
        )

    @property
    def rank(self) -> int | None:
        """The tensor rank the spec is written for; None when it fits any rank."""
        return None if self._entries is None else len(self._entries)

    @property
    def tile_dims(self) -> tuple[int, ...]:
        """How many blocks each tensor dim is split into (1 where it is not split)."""
        if self._tile is not None:
            return self._tile.shape[:-1]
        return (1,) * (self.rank or 0)

    @property
    def device_id(self) -> int | None:
        """The device of a maximal spec; None for the other kinds."""
        return self._device

    def canonical_bytes(self) -> bytes:
        """The placement's canonical encoding, which ir-core hashes into a node's hashes."""
        return self._bytes

    def check_rank(self, rank: int, what: str = "the tensor") -> None:
        """Raise ``ShardingError`` unless the spec fits a tensor of ``rank`` dims."""
        if self._entries is not None and len(self._entries) != rank:
            raise ShardingError(
                f"partition spec {self.partition_spec!r} has {len(self._entries)} entries but "
                f"{what} has rank {rank}; give one entry per tensor dim (None where not split)"
            )

    def check_even(self, global_shape, what: str = "the tensor") -> None:
        """Raise ``ShardingError`` unless the spec fits ``global_shape`` (its rank) and every
        split dim is a multiple of its number of blocks.

        The blocks of an uneven dim are still defined (``device_indices``: XLA's rule, the
        last ones shorter), but jax places and returns only even blocks, so a runtime on jax
        refuses an uneven spec where it is given (torch_xla pads the blocks instead)."""
        shape = self._check_shape(global_shape, what)
        if self._tile is None:
            return
        for k, (d, t) in enumerate(zip(shape, self.tile_dims, strict=True)):
            if d % t:
                axes = self.partition_spec[k]
                batch = (
                    f". If dim 0 is a batch (the last batch of an epoch is smaller), drop it "
                    f"(DataLoader(..., drop_last=True)) or pad it to a multiple of {t}"
                    if k == 0
                    else ""
                )
                raise ShardingError(
                    f"partition spec {self.partition_spec!r} splits dim {k} of {what} "
                    f"(size {d}) over {axes!r} into {t} blocks, and {d} is not a multiple of "
                    f"{t}; split only dims that divide evenly (pad the tensor, or shard "
                    f"another dim): uneven blocks are not supported{batch}"
                )

    def evenly(self, global_shape) -> ShardingSpec:
        """This spec with every split dim that ``global_shape`` does not divide into its blocks
        left whole (its mesh axes replicate it): the placement an array of that shape can be
        held in (jax holds only even blocks), where XLA computes the uneven blocks inside a
        program. ``self`` when every split dim divides evenly, or the spec fits any rank.

        >>> mesh = Mesh(range(8), (4, 2), ("data", "model"))
        >>> ShardingSpec(mesh, ("data", "model")).evenly((6, 4)).partition_spec
        (None, 'model')
        """
        shape = self._check_shape(global_shape)
        if self._tile is None:
            return self
        tiles = self.tile_dims
        if all(d % t == 0 for d, t in zip(shape, tiles, strict=True)):
            return self
        entries = tuple(
            () if d % t else axes for d, t, axes in zip(shape, tiles, self._entries, strict=True)
        )
        spec = ShardingSpec.__new__(ShardingSpec)
        spec._init(self._mesh, entries, None, None)
        return spec

    # -- where the blocks are ---------------------------------------------------------------

    def _check_shape(self, global_shape, what: str | None = None) -> tuple[int, ...]:
        if isinstance(global_shape, (str, bytes)) or not hasattr(global_shape, "__iter__"):
            raise ShardingError(f"global_shape must be a sequence of ints, got {global_shape!r}")
        shape = tuple(global_shape)
        for d in shape:
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 0:
                raise ShardingError(
                    f"global_shape {shape!r} has {d!r}; dims must be non-negative integers"
                )
        self.check_rank(len(shape), what or f"global shape {shape}")
        return tuple(int(d) for d in shape)

    def shard_shape(self, global_shape) -> tuple[int, ...]:
        """The shape of each device's block: ``ceil(dim / splits)`` per dim, as XLA pads it.
        When a dim does not divide evenly, the last blocks along it hold less (see
        ``device_indices``)."""
        shape = self._check_shape(global_shape)
        tiles = self.tile_dims if self._tile is not None else (1,) * len(shape)
        return tuple(-(-d // t) for d, t in zip(shape, tiles, strict=True))

    def device_indices(self, global_shape) -> dict[int, tuple[slice, ...]]:
        """Device id -> the slices of the global tensor that device holds, in mesh order.

        A dim that is not split is ``slice(None)``. A split dim of size ``d`` over ``t`` blocks
        gives block ``i`` the range ``[min(i*c, d), min((i+1)*c, d))`` with ``c = ceil(d/t)``:
        XLA's rule, so uneven dims end in shorter or empty blocks. A maximal spec maps only its
        device; a manual spec maps every device to its whole local array.
        """
        shape = self._check_shape(global_shape)
        full = (slice(None),) * len(shape)
        ids = self._mesh.device_ids
        if self._kind is ShardingKind.MAXIMAL:
            return {self._device: full}
        if self._tile is None:
            return dict.fromkeys(ids, full)
        out = [None] * len(ids)
        sizes = [-(-d // t) for d, t in zip(shape, self.tile_dims, strict=True)]
        for block in np.ndindex(*self.tile_dims):
            slices = tuple(
                slice(None) if t == 1 else slice(min(i * c, d), min((i + 1) * c, d))
                for i, c, d, t in zip(block, sizes, shape, self.tile_dims, strict=True)
            )
            for position in self._tile[block]:
                out[position] = slices
        return dict(zip(ids, out, strict=True))

    # -- conversions ------------------------------------------------------------------------

    def to_hlo_text(self, devices: str = "positions") -> str:
        """The HLO sharding as XLA prints it.

        ``devices="positions"`` (the default): XLA's iota form
        (``{devices=[4,1,2]<=[8] last_tile_dim_replicate}``), devices given as positions in
        the mesh's device list, as in the executable's device assignment. ``devices="ids"``:
        the tile assignment as an explicit list of global device ids, as XLA prints a sharding
        built from one and torch_xla 2.9 reports a tensor's (``{devices=[1,8]7,6,5,4,3,2,1,0}``;
        a maximal spec names its device id)."""
        if devices == "ids":
            from ir_sharding._hlo import explicit_text

            return explicit_text(self)
        if devices != "positions":
            raise ShardingError(f"devices must be 'positions' or 'ids', got {devices!r}")
        if self._hlo is None:
            from ir_sharding._hlo import hlo_text

            self._hlo = hlo_text(self)
        return self._hlo

    def to_jax(self):
        """The ``jax.sharding`` object for this placement (a ``NamedSharding``; a
        ``SingleDeviceSharding`` for a maximal spec). Imports jax."""
        if self._jax is None:
            from ir_sharding._jax import to_jax

            self._jax = to_jax(self)
        return self._jax

    @classmethod
    def from_jax(cls, sharding, ndim: int, mesh: Mesh | None = None) -> ShardingSpec:
        """The spec of a ``jax.sharding`` object: the inverse of ``to_jax()``. Imports jax.

        Device ids are global ordinals (``device_ordinal``), so
        ``ShardingSpec.from_jax(spec.to_jax(), rank) == spec`` with an equal mesh for every
        kind (pass ``mesh=spec.mesh`` for a maximal spec).

        Args:
            sharding: a ``jax.sharding.Sharding``.

                - ``NamedSharding``: a spec over the jax mesh rebuilt as a ``Mesh`` (the
                  devices' ordinals, ``devices.shape``, ``axis_names``), with ``sharding.spec``
                  padded with ``None`` to ``ndim`` entries; ``ShardingSpec.manual`` when every
                  mesh axis is ``AxisType.Manual``.
                - ``SingleDeviceSharding``: ``ShardingSpec.maximal(mesh, ordinal)`` when
                  ``mesh`` holds the device, else replicated over ``Mesh([ordinal], (1,),
                  ("devices",))``.
                - any other kind (``GSPMDSharding``, what XLA chose for a compiled output): read
                  through ``device_set``, ``is_fully_replicated`` and ``devices_indices_map``.
                  Replicated over ``Mesh(sorted ordinals, (n,), ("devices",))`` when fully
                  replicated; otherwise tiled over a new mesh with one axis ``"t<d>"`` per split
                  tensor dim ``d`` (plus ``"replicas"`` last when each block is on several
                  devices), laid out so ``to_jax()`` puts every block where ``sharding`` does.
            ndim: the rank of the tensor the sharding places.
            mesh: an ``ir_sharding.Mesh`` a ``SingleDeviceSharding``'s device may belong to;
                the other kinds ignore it.

        Returns:
            A ``ShardingSpec`` placing a rank-``ndim`` tensor as ``sharding`` does.

        Raises:
            ShardingError: ``sharding`` is not a jax sharding; ``ndim`` is not a non-negative
                integer, or is smaller than the partition spec; ``mesh`` is not a ``Mesh``; the
                jax mesh is abstract, partly manual, or not a valid ``Mesh`` (axis names that
                are not str); the spec is unreduced or UNCONSTRAINED; or a sharding of another
                kind does not cut the tensor into equal blocks on equally many devices each.
        """
        from ir_sharding._jax import from_jax

        return from_jax(sharding, ndim, mesh)

    def visualize(self, global_shape) -> str:
        """A text picture of which device holds which block of a tensor of ``global_shape``."""
        from ir_sharding._visualize import visualize

        return visualize(self, self._check_shape(global_shape))

    def __repr__(self):
        if self._entries is not None:
            return f"ShardingSpec({self._mesh!r}, {self.partition_spec!r})"
        if self._kind is ShardingKind.MAXIMAL:
            return f"ShardingSpec.maximal({self._mesh!r}, {self._device})"
        return f"ShardingSpec.{self._kind.name.lower()}({self._mesh!r})"

    def __reduce__(self):
        if self._entries is not None:
            return ShardingSpec, (self._mesh, self.partition_spec)
        if self._kind is ShardingKind.MAXIMAL:
            return ShardingSpec.maximal, (self._mesh, self._device)
        return getattr(ShardingSpec, self._kind.name.lower()), (self._mesh,)


def _check_mesh(mesh):
    if not isinstance(mesh, Mesh):
        raise ShardingError(
            f"mesh must be an ir_sharding.Mesh, got {mesh!r} ({type(mesh).__name__}); build one "
            f"with Mesh(device_ids, mesh_shape, axis_names)"
        )
