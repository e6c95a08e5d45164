"""A logical mesh of devices: device ids laid out in an n-dimensional array with named axes."""

from __future__ import annotations

import math
import operator

import numpy as np

from ir_sharding._errors import ShardingError


def _as_int(value, what):
    if isinstance(value, (bool, np.bool_)):
        raise ShardingError(f"{what} is {value!r}, a bool; it must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise ShardingError(
            f"{what} is {value!r} ({type(value).__name__}); it must be an integer"
        ) from None


def _mesh_shape(mesh_shape):
    if isinstance(mesh_shape, (str, bytes)) or not hasattr(mesh_shape, "__iter__"):
        raise ShardingError(f"mesh_shape must be a sequence of ints, got {mesh_shape!r}")
    shape = tuple(_as_int(d, f"mesh_shape entry {k}") for k, d in enumerate(mesh_shape))
    if not shape:
        raise ShardingError("mesh_shape is empty; a mesh has at least one axis, e.g. (n,)")
    for k, d in enumerate(shape):
        if d < 1:
            raise ShardingError(f"mesh_shape {shape} has size {d} on axis {k}; sizes must be >= 1")
    return shape


def _axis_names(axis_names, ndim, shape):
    if isinstance(axis_names, str) or not hasattr(axis_names, "__iter__"):
        raise ShardingError(
            f"axis_names must be a sequence of str, one per mesh axis, got {axis_names!r}"
        )
    names = tuple(axis_names)
    for name in names:
        if type(name) is not str or not name:
            raise ShardingError(
                f"axis name {name!r} in {names!r} is not a non-empty str; name each mesh axis"
            )
    if len(names) != ndim:
        raise ShardingError(
            f"axis_names {names!r} has {len(names)} name(s) but mesh_shape {shape} has {ndim} "
            f"axes; give one name per mesh axis"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ShardingError(f"axis_names {names!r} repeats {repeated[0]!r}; names must be unique")
    return names


def _device_ids(device_ids):
    if isinstance(device_ids, (str, bytes)):
        raise ShardingError(f"device_ids must be integers, got {device_ids!r}")
    try:
        flat = np.asarray(device_ids, dtype=object).ravel(order="C")
    except Exception as e:
        raise ShardingError(f"device_ids {device_ids!r} is not an array of integers: {e}") from None
    ids = tuple(_as_int(d, f"device id {d!r}") for d in flat)
    negative = [d for d in ids if d < 0]
    if negative:
        raise ShardingError(f"device id {negative[0]} is negative; device ids are >= 0")
    if len(set(ids)) != len(ids):
        seen, repeated = set(), []
        for d in ids:
            if d in seen:
                repeated.append(d)
            seen.add(d)
        raise ShardingError(
            f"device ids {list(ids)} repeat {repeated[0]}; each device appears once in a mesh"
        )
    return ids


class Mesh:
    """Devices laid out as an n-dimensional array with one name per axis.

    Args:
        device_ids: the devices' global ids (non-negative, unique), in the mesh's row-major
            order; any array-like, flattened in C order.
        mesh_shape: the size of each mesh axis; their product is the number of devices.
        axis_names: one unique name per mesh axis, e.g. ``("data", "model")``.

    >>> mesh = Mesh(range(8), (4, 2), ("data", "model"))
    >>> mesh.logical_mesh()[1]
    array([2, 3])
    """

    __slots__ = ("_axis_names", "_device_ids", "_hash", "_ids", "_shape")

    def __init__(self, device_ids, mesh_shape, axis_names):
        shape = _mesh_shape(mesh_shape)
        names = _axis_names(axis_names, len(shape), shape)
        ids = _device_ids(device_ids)
        if len(ids) != math.prod(shape):
            raise ShardingError(
                f"mesh_shape {shape} holds {math.prod(shape)} devices but {len(ids)} device "
                f"id(s) were given ({list(ids)}); the mesh size must equal the number of devices"
            )
        self._device_ids = ids
        self._shape = shape
        self._axis_names = names
        self._hash = hash((ids, shape, names))
        self._ids = np.array(ids, dtype=np.int64)  # for ShardingSpec; never handed out
        self._ids.flags.writeable = False

    @property
    def device_ids(self) -> tuple[int, ...]:
        """The device ids in the mesh's row-major order."""
        return self._device_ids

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self._axis_names

    @property
    def size(self) -> int:
        """The number of devices."""
        return len(self._device_ids)

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def logical_mesh(self) -> np.ndarray:
        """A new numpy array of the device ids in the mesh's shape."""
        return np.array(self._device_ids, dtype=np.int64).reshape(self._shape)

    def axis_index(self, axis) -> int:
        """The index of a mesh axis given by name or by index."""
        if type(axis) is str:
            try:
                return self._axis_names.index(axis)
            except ValueError:
                raise ShardingError(
                    f"unknown mesh axis {axis!r}; this mesh's axes are {self._axis_names!r}"
                ) from None
        index = _as_int(axis, f"mesh axis {axis!r}")
        if not 0 <= index < len(self._shape):
            raise ShardingError(
                f"mesh axis index {index} is out of range for a mesh with {len(self._shape)} "
                f"axes {self._axis_names!r}; use 0 to {len(self._shape) - 1} or an axis name"
            )
        return index

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, Mesh):
            return NotImplemented
        return self._hash == other._hash and (self._device_ids, self._shape, self._axis_names) == (
            other._device_ids,
            other._shape,
            other._axis_names,
        )

    def __hash__(self):
        return self._hash

    def __repr__(self):
        ids = self._device_ids
        first = ids[0]
        if ids == tuple(range(first, first + len(ids))):
            written = f"range({len(ids)})" if first == 0 else f"range({first}, {first + len(ids)})"
        else:
            written = str(list(ids))
        return f"Mesh({written}, {self._shape}, {self._axis_names})"

    def __reduce__(self):
        return Mesh, (self._device_ids, self._shape, self._axis_names)
