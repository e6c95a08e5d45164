"""``torch_xla.distributed.spmd.debugging``: a tensor's sharding as a table of its tiles and
the devices holding each (``rich``), as torch_xla draws it: the first two tile dimensions."""

from __future__ import annotations

import re

import torch_xla
import torch_xla.runtime as xr

from .xla_sharded_tensor import XLAShardedTensor


def _tiles(sharding: str) -> tuple[int, int, dict]:
    """(rows, columns, (row, column) -> the device id, or the ids replicating that tile)."""
    if sharding in ("", "{replicated}"):
        return 1, 1, {(0, 0): list(range(xr.global_runtime_device_count()))}
    m = re.fullmatch(r"\{devices=\[([\d,]+)\]([\d,]+)( last_tile_dim_replicate)?\}", sharding)
    if m is None:
        raise ValueError("sharding ", sharding, " is not organized as expected")
    dims = [int(d) for d in m.group(1).split(",")]
    ids = [int(d) for d in m.group(2).split(",")]
    rows = dims[0]
    cols = dims[1] if len(dims) > 1 else 1
    cells = {}
    if m.group(3):
        depth = dims[-1]
        for i in range(len(ids) // depth):
            cells.setdefault((i // cols, i % cols), ids[i * depth : (i + 1) * depth])
    else:
        for i, d in enumerate(ids):
            cells.setdefault((i // cols, i % cols), d)
    return rows, cols, cells


def visualize_sharding(
    sharding: str,
    use_color: bool = True,
    scale: float = 1.0,
    min_width: int = 9,
    max_width: int = 80,
):
    """Print (and return) a ``rich`` table of ``sharding``'s tiles (an HLO sharding string
    such as ``torch_xla._XLAC._get_xla_sharding_spec`` gives)."""
    import rich.align
    import rich.box
    import rich.console
    import rich.padding
    import rich.style
    import rich.table

    print(f"Visualizing {sharding} (showing up to the first two dimensions)")
    rows, cols, cells = _tiles(sharding)
    console = rich.console.Console(width=max_width)
    use_color = use_color and console.color_system is not None
    table = rich.table.Table(
        show_header=False,
        show_lines=not use_color,
        padding=0,
        highlight=not use_color,
        pad_edge=False,
        box=rich.box.SQUARE if not use_color else None,
    )
    kind = xr.device_type()
    for i in range(rows):
        table.add_row(
            *[
                rich.padding.Padding(
                    rich.align.Align(f"{kind} {cells[i, j]}", "center", vertical="middle"),
                    (1, 1, 1, 1),
                    style=rich.style.Style(bgcolor=None, color=None),
                )
                for j in range(cols)
            ]
        )
    console.print(table, end="\n\n")
    return table


def visualize_tensor_sharding(t, **kwargs):
    if isinstance(t, XLAShardedTensor):
        t = t.global_tensor
    return visualize_sharding(torch_xla._XLAC._get_xla_sharding_spec(t), **kwargs)
