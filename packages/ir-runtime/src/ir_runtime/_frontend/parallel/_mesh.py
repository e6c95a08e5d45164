"""``device_mesh(shape, names)``: torch's own ``DeviceMesh`` over this project's devices.

torch's ``DeviceMesh`` is a per-rank object: each process is one rank, its coordinate and its
sub-meshes are its own, and every mesh dimension has a process group. Here one controller
places every device, so ``LazyDeviceMesh`` (a ``DeviceMesh`` subclass, device type ``"lazy"``)
holds device ids where torch holds ranks, and builds no process group:

- ``mesh.mesh``: the device ids, laid out as the mesh. A sub-mesh (``mesh["tp"]``) is, as in
  torch, the slice that holds this process's device: its first device in the mesh, which is
  also ``get_rank()``.
- ``get_coordinate()``, ``get_local_rank(dim)``: that device's coordinate, and its index along
  ``dim``.
- ``size()``, ``shape``, ``ndim``, ``mesh_dim_names``, sub-meshes and ``_flatten`` as torch's.
- ``get_group()``: refused by name (``DistributedError``). There are no process groups: XLA
  inserts the collectives that placements imply.

A placement on a sub-mesh is a placement on its root mesh that replicates over the root's other
dimensions: ``Shard(0)`` on ``mesh["tp"]`` splits dim 0 over the ``tp`` axis and replicates it
over ``dp``, which is what torch's per-rank sub-meshes mean together.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch
from torch.distributed.device_mesh import DeviceMesh

from ir_runtime._errors import DistributedError
from ir_sharding import Mesh, ShardingError, device_ordinal, global_devices


class LazyDeviceMesh(DeviceMesh):
    """torch's ``DeviceMesh`` over this project's devices (module docstring). Build it with
    ``ir_runtime.device_mesh``."""

    # root axis names each mesh dimension covers (a flattened dimension covers several)
    _axes: tuple[tuple[str, ...], ...]
    _ir_mesh: Mesh  # the root mesh, as ir_sharding's

    def get_rank(self) -> int:
        """This process's first device in the mesh: the device its coordinate is that of."""
        return self._rank

    @property
    def mesh(self) -> torch.Tensor:
        full = self._layout.remap_to_tensor(self._rank_map)
        if full.size(0) == 1:
            return full[0]
        return full[(full == self._rank).flatten(1).any(1).nonzero()[0, 0]]

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        if mesh_dim is None:
            if self.ndim > 1:
                raise DistributedError(
                    f"get_local_rank() of a {self.ndim}-d mesh needs mesh_dim (a dim's index or "
                    f"name of {self.mesh_dim_names})"
                )
            mesh_dim = 0
        if isinstance(mesh_dim, str):
            mesh_dim = self._get_mesh_dim_by_name(mesh_dim)
        return self.get_coordinate()[mesh_dim]

    def get_group(self, mesh_dim: int | str | None = None):
        raise DistributedError(
            f"get_group({mesh_dim!r}): a mesh of ir_runtime.device_mesh has no process groups. "
            f"One controller places every device and XLA inserts the collectives that "
            f"placements imply; code that calls torch.distributed collectives on a group runs "
            f"per rank (use ir_runtime.shard_map and its collectives for per-device code)"
        )

    def get_all_groups(self):
        return self.get_group()

    def _create_sub_mesh(self, layout, submesh_dim_names):
        root = self._get_root_mesh()
        axes = tuple(_root_axes(root, self, name) for name in submesh_dim_names)
        return _make(root._device_type, layout, root._rank_map, submesh_dim_names, root, axes)

    def _create_flatten_mesh(self, mesh_dim_name, backend_override=(None, None)):
        from torch.distributed._mesh_layout import _MeshLayout

        root = self._get_root_mesh()
        if mesh_dim_name in (root.mesh_dim_names or ()):
            raise ShardingError(
                f"cannot flatten into {mesh_dim_name!r}: the root mesh already has a dim of "
                f"that name ({root.mesh_dim_names})"
            )
        layout = _MeshLayout([self._layout.collapse()])
        flat = root._flatten_mapping.get(mesh_dim_name)
        if flat is not None and flat._layout != layout:
            raise ShardingError(
                f"cannot flatten into {mesh_dim_name!r}: a different flattening has that name"
            )
        if flat is None:
            axes = (tuple(a for group in self._axes for a in group),)
            flat = _make(root._device_type, layout, root._rank_map, (mesh_dim_name,), root, axes)
            root._flatten_mapping[mesh_dim_name] = flat

    def _flatten(self, mesh_dim_name=None, backend_override=None):
        name = mesh_dim_name or "_".join(self.mesh_dim_names or ())
        if self.ndim == 1 and name in (self.mesh_dim_names or ()):
            return self
        self._create_flatten_mesh(name)
        return self._get_root_mesh()._flatten_mapping[name]

    def __reduce__(self):
        root = self._get_root_mesh()
        if root is self:
            return _rebuild, (self._ir_mesh,)
        return _sub, (_rebuild(self._ir_mesh), self.mesh_dim_names)


def _root_axes(root: LazyDeviceMesh, mesh: LazyDeviceMesh, name: str) -> tuple[str, ...]:
    names = mesh.mesh_dim_names or ()
    if name in names:
        return mesh._axes[names.index(name)]
    flat = root._flatten_mapping.get(name)
    if flat is None:
        raise KeyError(name)  # (torch's _get_slice_mesh_layout has refused it already)
    return flat._axes[0]


def _make(device_type, layout, rank_map, names, root, axes) -> LazyDeviceMesh:
    mesh = LazyDeviceMesh.__new__(LazyDeviceMesh)
    mesh._rank = root._rank  # (read by .mesh while torch's __init__ checks the layout)
    DeviceMesh.__init__(
        mesh,
        device_type,
        _layout=layout,
        _rank_map=rank_map,
        mesh_dim_names=names,
        _root_mesh=root,
        _init_backend=False,
        _rank=root._rank,
    )
    mesh._axes = axes
    mesh._ir_mesh = root._ir_mesh
    mesh._dim_group_names = []
    return mesh


def _sub(root: LazyDeviceMesh, names) -> LazyDeviceMesh:
    return root[names]


# ir_sharding Mesh -> its LazyDeviceMesh, so a tensor annotated through mark_sharding reports
# placements on the same mesh object each time (bounded by the meshes the program builds).
_BY_IR_MESH: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_BUILT: list = []  # weak references to the meshes device_mesh built, oldest first


def _rebuild(ir_mesh: Mesh) -> LazyDeviceMesh:
    mesh = _BY_IR_MESH.get(ir_mesh)
    if mesh is None:
        mesh = _root(ir_mesh)
    return mesh


def _root(ir_mesh: Mesh) -> LazyDeviceMesh:
    from ir_runtime._distributed import process_index

    ids = np.asarray(ir_mesh.device_ids)
    mine = [device_ordinal(d) for d in global_devices() if d.process_index == process_index()]
    local = [i for i in ids.tolist() if i in mine]
    if not local:
        raise DistributedError(
            f"mesh {ir_mesh} holds none of this process's devices {mine}: every process "
            f"must take part in the mesh of a program it runs"
        )
    mesh = LazyDeviceMesh.__new__(LazyDeviceMesh)
    mesh._rank = local[0]
    DeviceMesh.__init__(
        mesh,
        "lazy",
        torch.tensor(ids.reshape(ir_mesh.shape), dtype=torch.int),
        mesh_dim_names=ir_mesh.axis_names,
        _init_backend=False,
        _rank=local[0],
    )
    mesh._axes = tuple((name,) for name in ir_mesh.axis_names)
    mesh._ir_mesh = ir_mesh
    mesh._dim_group_names = []
    _BY_IR_MESH[ir_mesh] = mesh
    return mesh


def device_mesh(mesh_shape, mesh_dim_names=None, *, devices=None) -> LazyDeviceMesh:
    """torch's ``DeviceMesh`` over this project's devices (every device, in global order,
    unless ``devices`` names their ids), laid out as ``mesh_shape`` with one name per dim.

    Args:
        mesh_shape: an int or a tuple of ints: the mesh's size along each dim; their product
            is the number of devices.
        mesh_dim_names: one unique name per dim (default ``("dim0", "dim1", ...)``).
        devices: the global device ids to lay out, in row-major order (default: every
            device of every process).

    Raises:
        ShardingError: the shape's product is not the number of devices (the mesh must cover
            every device it is given, and by default every device there is), a name is
            repeated, or there is not one name per dim.
    """
    from ir_runtime._devices import devices as all_devices
    from ir_runtime._frontend.parallel import _route

    shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(mesh_shape)
    if devices is None:
        ids = list(range(len(all_devices())))  # (device id k is devices()[k])
        where = f"the {len(ids)} devices there are"
    else:
        ids = [int(i) for i in devices]
        where = f"the {len(ids)} devices given"
    if int(np.prod(shape)) != len(ids):
        raise ShardingError(
            f"mesh_shape {shape} holds {int(np.prod(shape))} devices, but it must cover {where} "
            f"({ids}): a mesh's size is its number of devices"
        )
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
    if names is None:
        names = tuple(f"dim{i}" for i in range(len(shape)))
    ir_mesh = Mesh(ids, shape, names)
    _route.install()
    mesh = _root(ir_mesh)
    _BUILT[:] = [r for r in _BUILT if r() is not None and r() is not mesh] + [weakref.ref(mesh)]
    return mesh


def as_lazy_mesh(mesh, what: str) -> LazyDeviceMesh:
    """``mesh`` itself when it is a ``LazyDeviceMesh``, else a ``ShardingError`` naming it."""
    if mesh is None:
        from torch.distributed.device_mesh import _mesh_resources

        mesh = _mesh_resources.get_current_mesh()
    if not isinstance(mesh, LazyDeviceMesh):
        raise ShardingError(f"{what} takes a mesh of ir_runtime.device_mesh, got {mesh!r}")
    return mesh


def mesh_of(spec) -> LazyDeviceMesh:
    """The ``LazyDeviceMesh`` to describe a placement ``spec`` on: the one of its own mesh if
    the program built it, else the latest mesh ``device_mesh`` built with the same devices,
    else one made of the spec's mesh."""
    mesh = _BY_IR_MESH.get(spec.mesh)
    if mesh is not None:
        return mesh
    devices = set(spec.mesh.device_ids)
    for ref in reversed(_BUILT):
        built = ref()
        if built is not None and set(built._ir_mesh.device_ids) == devices:
            return built
    return _root(spec.mesh)
