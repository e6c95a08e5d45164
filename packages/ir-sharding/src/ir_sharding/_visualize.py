"""A text picture of a placement: a grid of blocks for rank 0 to 2, a block list beyond."""

from __future__ import annotations

from ir_sharding._spec import ShardingKind, ShardingSpec


def _devices(ids) -> str:
    return ",".join(map(str, ids))


def visualize(spec: ShardingSpec, shape: tuple[int, ...]) -> str:
    mesh = spec.mesh
    axes = " x ".join(f"{n}={d}" for n, d in zip(mesh.axis_names, mesh.shape, strict=True))
    head = f"{spec.kind.name} {shape} over mesh ({axes}), shard {spec.shard_shape(shape)}"
    if spec.kind is ShardingKind.MANUAL:
        return f"{head}\nmanual: each of devices {_devices(mesh.device_ids)} holds its own array"
    # Group devices by the block they hold, blocks in row-major order.
    blocks: dict[tuple, list[int]] = {}
    for device, slices in spec.device_indices(shape).items():
        key = tuple(s.indices(d)[:2] for s, d in zip(slices, shape, strict=True))
        blocks.setdefault(key, []).append(device)
    if len(shape) > 2:
        lines = [head]
        for key, ids in sorted(blocks.items()):
            where = ", ".join(f"{a}:{b}" for a, b in key)
            lines.append(f"  [{where}] -> device {_devices(ids)}")
        return "\n".join(lines)

    # A 2-D tensor is rows x columns; a 1-D one is one row of blocks; a scalar one cell.
    def place(key):
        if len(key) == 2:
            return key
        return (None, key[0] if key else None)

    cell = {place(key): _devices(ids) for key, ids in blocks.items()}
    rows = sorted({r for r, _ in cell}, key=lambda r: (r is not None, r))
    cols = sorted({c for _, c in cell}, key=lambda c: (c is not None, c))
    row_labels = ["" if r is None else f"{r[0]}:{r[1]}" for r in rows]
    col_labels = ["" if c is None else f"{c[0]}:{c[1]}" for c in cols]
    width = max(len(v) for v in [*cell.values(), *col_labels])
    left = max(len(v) for v in row_labels)
    rule = " " * left + "+" + "+".join("-" * (width + 2) for _ in cols) + "+"
    lines = [head]
    if cols != [None]:
        lines.append(" " * (left + 1) + " ".join(f" {c:^{width}} " for c in col_labels))
    lines.append(rule)
    for r, label in zip(rows, row_labels, strict=True):
        body = "|".join(f" {cell.get((r, c), '-'):^{width}} " for c in cols)
        lines.append(f"{label:>{left}}|{body}|")
        lines.append(rule)
    return "\n".join(lines)
