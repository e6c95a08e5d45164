"""Whether a compiled program fits in its devices' memory, checked before it runs.

XLA's memory analysis of the compiled program gives its bytes per device (``memory_of``). A GPU
or TPU reports each device's limit (``memory_stats()["bytes_limit"]``); XLA's CPU devices have
none of their own and share this host's memory, so on CPU the program's bytes on all of its
devices in this process must fit in the host's (its RAM, or its cgroup's limit when lower).
A program that cannot fit is refused with ``OutOfMemoryError`` before it runs: running it would
fail at an allocation, or, on CPU, page the host until it stalls.
"""

from __future__ import annotations

import math
import os

import jax

from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._errors import OutOfMemoryError

GB = 1 << 30
LARGEST = 3  # buffers an error names


def host_bytes() -> int | None:
    """This host's memory, or its cgroup's limit when that is lower (None: unknown)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = int(text) if total is None else min(total, int(text))
        break
    return total


def limit(devices) -> tuple[int | None, int, str]:
    """``(bytes, how many devices share them, what they are)`` for the devices this process
    runs a program on: a device's own limit, or the host's memory shared by its CPU devices."""
    here = jax.process_index()
    mine = [d for d in devices if d.process_index == here] or list(devices)
    first = mine[0]
    stats = None
    if first.platform != "cpu":
        try:
            stats = first.memory_stats()
        except Exception:
            stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), 1, f"{first.platform} device {first.id}'s memory"
    return host_bytes(), len(mine), f"this host's memory, shared by its {len(mine)} CPU devices"


def _gb(n: int) -> str:
    for unit, size in (("GB", GB), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def buffers(graph, out_specs) -> list[tuple[int, str]]:
    """``(bytes per device, description)`` of the program's parameters and results, largest
    first: what a user can find in their code (XLA's temporaries have no name there)."""
    found = []
    for kind, values, specs in (
        ("result", graph.roots, out_specs),
        ("input", [p.outputs[0] for p in graph.params], [p.sharding for p in graph.params]),
    ):
        for v, spec in zip(values, specs, strict=True):
            shape = v.shape
            dims = shape.dims if spec is None else spec.shard_shape(shape.dims)
            nbytes = math.prod(dims) * to_numpy_dtype(shape.dtype).itemsize
            node = v.node
            at = f" at {node.origin}" if node.origin is not None else ""
            made = "" if node.op == "device_data" else f" from {node.op}{at}"
            found.append((nbytes, f"{kind} {shape}{made}: {_gb(nbytes)} per device"))
    found.sort(key=lambda b: -b[0])
    return found


def check_fits(memory: dict | None, program, graph, out_specs) -> None:
    """Raise ``OutOfMemoryError`` if a program needing ``memory["peak"]`` bytes per device
    cannot fit on ``program``'s devices (None: a backend without memory analysis; unchecked)."""
    if memory is None:
        return
    total, sharing, what = limit(program.devices)
    need = memory["peak"] * sharing
    if total is None or need <= total:
        return
    largest = "; ".join(d for _, d in buffers(graph, out_specs)[:LARGEST])
    raise OutOfMemoryError(
        f"the program needs {_gb(memory['peak'])} per device ({_gb(memory['arguments'])} "
        f"inputs, {_gb(memory['outputs'])} results, {_gb(memory['temporaries'])} temporaries, "
        f"less {_gb(memory['aliased'])} donated), {_gb(need)} in all, more than "
        f"{what} ({_gb(total)}); its largest buffers: {largest}. Shard the largest over more "
        f"devices, or make them smaller"
    )
