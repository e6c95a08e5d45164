"""HLO sharding text, printed as XLA prints it.

A tiled spec's tile assignment is XLA's iota form: the mesh positions ``0..n-1`` reshaped to the
mesh's shape, transposed so the axes that split tensor dims come first (in tensor-dim order)
and the replicated axes last, then reshaped to the tile dims. jax builds exactly this for a
``NamedSharding``; XLA then canonicalizes the (reshape dims, transpose) pair before printing.
"""

from __future__ import annotations

from ir_sharding._spec import ShardingKind, ShardingSpec


def canonical_iota(dims: list[int], perm: list[int]) -> tuple[list[int], list[int]]:
    """XLA's ``CanonicalizeIotaDims`` (xla/hlo/ir/tile_assignment.cc): drop size-1 dims and
    merge runs of dims that stay adjacent, in order, under the transpose, until nothing
    changes."""
    dims, perm = list(dims), list(perm)
    if len(dims) <= 1:
        return dims, perm
    while True:
        # Remove the size-1 dims and renumber the permutation.
        keep = [i for i, d in enumerate(dims) if d != 1]
        if len(keep) != len(dims):
            new_index = {old: new for new, old in enumerate(keep)}
            perm = [new_index[p] for p in perm if p in new_index]
            dims = [dims[i] for i in keep]
        # Merge each run perm[base], perm[base]+1, ... into its first dim.
        changed = False
        base = 0
        for i in range(1, len(dims)):
            if perm[base] + (i - base) == perm[i]:
                dims[perm[base]] *= dims[perm[i]]
                dims[perm[i]] = 1
                changed = True
            else:
                base = i
        if not changed:
            return dims, perm


def explicit_text(spec: ShardingSpec) -> str:
    """The HLO sharding text with the tile assignment as an explicit list of global device ids,
    as XLA prints a sharding built from such a list (torch_xla 2.9's
    ``_get_xla_sharding_spec``): ``{devices=[1,8]0,1,2,3,4,5,6,7}``."""
    kind = spec.kind
    if kind is ShardingKind.REPLICATED:
        return "{replicated}"
    if kind is ShardingKind.MANUAL:
        return "{manual}"
    if kind is ShardingKind.MAXIMAL:
        return f"{{maximal device={spec.device_id}}}"
    ids = spec.mesh.device_ids
    dims = list(spec.tile_dims)
    group = spec._tile.shape[-1]
    if group > 1:
        dims.append(group)
    # (the devices of each replication group in ascending order, as XLA's PartialTile puts them)
    groups = [sorted(ids[p] for p in g) for g in spec._tile.reshape(-1, group).tolist()]
    devices = ",".join(str(d) for g in groups for d in g)
    text = f"{{devices=[{','.join(map(str, dims))}]{devices}"
    return text + (" last_tile_dim_replicate}" if group > 1 else "}")


def hlo_text(spec: ShardingSpec) -> str:
    kind = spec.kind
    if kind is ShardingKind.REPLICATED:
        return "{replicated}"
    if kind is ShardingKind.MANUAL:
        return "{manual}"
    mesh = spec.mesh
    if kind is ShardingKind.MAXIMAL:
        return f"{{maximal device={mesh.device_ids.index(spec.device_id)}}}"
    entries = spec._entries
    used = [a for axes in entries for a in axes]
    perm = used + [a for a in range(mesh.ndim) if a not in used]
    reshape, transpose = canonical_iota(list(mesh.shape), perm)
    dims = list(spec.tile_dims)
    group = spec._tile.shape[-1]
    if group > 1:
        dims.append(group)
    text = f"{{devices=[{','.join(map(str, dims))}]<=[{','.join(map(str, reshape))}]"
    if len(reshape) > 1:
        text += f"T({','.join(map(str, transpose))})"
    return text + (" last_tile_dim_replicate}" if group > 1 else "}")
