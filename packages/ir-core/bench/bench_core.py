"""ir-core benchmarks, side by side with their peers in one run.

1. Construct-and-hash a 100,000-node graph of Generic nodes (2 operands, 1 shape, 2 attrs):
   ir_core against torch.fx building the same graph by hand and against a plain-Python class
   hashing the same encoding through the xxhash package (tests/reference.py's PyNode).
2. post_order + graph_hash of a 1,000,000-node graph.

Every peer runs the same Python loop; only the per-node call differs. A "harness" row runs that
loop with a call that does nothing, so the fixed cost of Python's own loop, tuple and dict
building is visible; a "Cython floor" row calls an extension type of Generic's size that only
stores its arguments (``floor.pyx``, built here when Cython is installed), so what ir_core adds
above any C-level node (checks, encoding, both hashes, the Value) is visible too. Prints a table
and writes JSON (``--json PATH``).
"""

import argparse
import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # benchjson, at the top
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import benchjson  # noqa: E402
from ir_core import DeviceData, Generic, Shape, Value, graph_hash, post_order  # noqa: E402

import reference  # noqa: E402

OP = "aten::add.Tensor"
DIMS = (4, 8)


def build_ir(n):
    shape = Shape("float32", DIMS)
    shapes = (shape,)
    vals = [Value(DeviceData(shape)), Value(DeviceData(shape))]
    append = vals.append
    t0 = time.perf_counter()
    for _ in range(n):
        node = Generic(OP, (vals[-1], vals[-2]), shapes, {"alpha": 1, "beta": 2.0})
        append(Value(node, 0))
    return time.perf_counter() - t0, vals


def construct_only(n):
    """The Generic() call alone: operands and attrs built once, nodes not kept."""
    shape = Shape("float32", DIMS)
    shapes = (shape,)
    operands = (Value(DeviceData(shape)), Value(DeviceData(shape)))
    attrs = {"alpha": 1, "beta": 2.0}
    t0 = time.perf_counter()
    for _ in range(n):
        Generic(OP, operands, shapes, attrs)
    return time.perf_counter() - t0, None


def build_fx(n):
    import torch
    import torch.fx

    graph = torch.fx.Graph()
    target = torch.add
    vals = [graph.placeholder("a"), graph.placeholder("b")]
    append = vals.append
    t0 = time.perf_counter()
    for _ in range(n):
        append(graph.call_function(target, (vals[-1], vals[-2]), {"alpha": 1, "beta": 2.0}))
    return time.perf_counter() - t0, graph


def build_python(n):
    PyNode = reference.PyNode
    shapes = (("float32", DIMS),)
    leaf = [PyNode("DeviceData", "device_data", (), shapes) for _ in range(2)]
    vals = [(leaf[0], 0), (leaf[1], 0)]
    append = vals.append
    t0 = time.perf_counter()
    for _ in range(n):
        node = PyNode("Generic", OP, (vals[-1], vals[-2]), shapes, {"alpha": 1, "beta": 2.0})
        append((node, 0))
    return time.perf_counter() - t0, vals


def _floor_type():
    """``floor.Floor``, built from ``floor.pyx`` by pyximport; None without Cython or a C
    compiler (pyximport raises ImportError for a failed build)."""
    try:
        import pyximport

        pyximport.install(language_level=3, build_dir=os.path.join(HERE, ".pyxbld"))
        from floor import Floor
    except ImportError as e:
        print(f"no Cython floor row: {e}")
        return None
    return Floor


def _nothing(op, operands, shapes, attrs):
    return operands


def build_calling(call, n):
    """The ir_core loop with ``call`` in place of ``Generic(...)`` and no Value around what it
    returns: ``_nothing`` (the harness), or the Cython floor's type."""
    shapes = ((),)
    vals = [object(), object()]
    append = vals.append
    t0 = time.perf_counter()
    for _ in range(n):
        node = call(OP, (vals[-1], vals[-2]), shapes, {"alpha": 1, "beta": 2.0})
        append(node)
    return time.perf_counter() - t0, vals


def build_harness(n):
    return build_calling(_nothing, n)


def median_ns_per_node(build, n, repeats):
    samples = []
    for _ in range(repeats):
        gc.collect()
        seconds, keep = build(n)
        samples.append(seconds / n * 1e9)
        del keep
    return statistics.median(samples), samples


def traversal(n, repeats):
    shape = Shape("float32", DIMS)
    vals = [Value(DeviceData(shape)), Value(DeviceData(shape))]
    for _ in range(n - 2):
        vals.append(Value(Generic(OP, (vals[-1], vals[-2]), (shape,), {"alpha": 1})))
    roots = [vals[-1]]
    del vals
    po, gh, both = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        order = post_order(roots)
        t1 = time.perf_counter()
        graph_hash(roots)
        t2 = time.perf_counter()
        assert len(order) == n
        del order
        po.append((t1 - t0) / n * 1e9)
        gh.append((t2 - t1) / n * 1e9)
        both.append((t2 - t0) / n * 1e9)
    return statistics.median(po), statistics.median(gh), statistics.median(both)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--traversal-nodes", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    import torch

    n = args.nodes
    rows = {}
    systems = [
        ("ir_core", build_ir, args.repeats),
        ("torch.fx", build_fx, max(3, args.repeats // 2)),
        ("plain Python + xxhash", build_python, max(3, args.repeats // 2)),
        ("harness (loop only)", build_harness, args.repeats),
        ("ir_core Generic() call only", construct_only, args.repeats),
    ]
    floor = _floor_type()
    if floor is not None:
        systems.insert(
            1, ("Cython floor (stores only)", lambda k: build_calling(floor, k), args.repeats)
        )
    for name, build, repeats in systems:
        build(min(n, 2000))  # warm up
        rows[name] = median_ns_per_node(build, n, repeats)

    ir = rows["ir_core"][0]
    po, gh, both = traversal(args.traversal_nodes, args.repeats)
    results = {
        "construct_and_hash": {
            "nodes": n,
            "ns_per_node": {k: round(v[0], 1) for k, v in rows.items()},
            "samples_ns_per_node": {k: [round(s, 1) for s in v[1]] for k, v in rows.items()},
            "ratio_fx_over_ir_core": round(rows["torch.fx"][0] / ir, 2),
            "ratio_python_over_ir_core": round(rows["plain Python + xxhash"][0] / ir, 2),
            "ir_core_minus_harness_ns": round(ir - rows["harness (loop only)"][0], 1),
            "ir_core_minus_floor_ns": (
                round(ir - rows["Cython floor (stores only)"][0], 1) if floor is not None else None
            ),
            "targets": {"ns_per_node_max": 400, "fx_ratio_min": 30, "python_ratio_min": 4},
        },
        "traversal": {
            "nodes": args.traversal_nodes,
            "post_order_ns_per_node": round(po, 1),
            "graph_hash_ns_per_node": round(gh, 1),
            "both_ns_per_node": round(both, 1),
            "target_both_ns_per_node_max": 150,
        },
        "environment": benchjson.environment(torch=torch.__version__),
    }

    c = results["construct_and_hash"]
    print(f"\nConstruct and hash {n:,} Generic nodes (2 operands, 1 shape, 2 attrs), median")
    print(f"{'system':<30}{'ns/node':>10}{'x ir_core':>12}")
    for name, (median, _) in rows.items():
        print(f"{name:<30}{median:>10.0f}{median / ir:>12.2f}")
    print(
        f"ir_core: {ir:.0f} ns/node (target <= 400), {c['ir_core_minus_harness_ns']:.0f} ns "
        f"above the bare loop"
        + (f", {c['ir_core_minus_floor_ns']:.0f} above the Cython floor" if floor else "")
        + f"; torch.fx / ir_core = {c['ratio_fx_over_ir_core']} (target >= 30); "
        f"plain Python / ir_core = {c['ratio_python_over_ir_core']} (target >= 4)"
    )
    t = results["traversal"]
    print(f"\npost_order + graph_hash of {t['nodes']:,} nodes, median")
    print(f"post_order {po:.0f} ns/node, graph_hash {gh:.0f} ns/node, both {both:.0f}", end="")
    print(" (target <= 150)")
    benchjson.write(args.json, results)


if __name__ == "__main__":
    main()
