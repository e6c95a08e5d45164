"""ir-sharding benchmarks, side by side in one run.

1. relink of one replaced leaf over a 100,000-node graph, against post_order of the same graph.
   A rebuilt node costs a constructor call, so the time depends on how much of the graph reads
   the leaf; four cases from a few rebuilt nodes to all of them:
   - wide: 1,000 independent chains of 100 nodes (like per-parameter optimizer updates),
     one chain's leaf replaced;
   - deep top / middle / bottom: 50,000 layers h = linear(h, w_k), the weight of the last,
     middle or first layer replaced.
2. ShardingSpec construction + canonical_bytes(), against jax building the NamedSharding of the
   same placement and converting it to its HLO sharding. Both cache the placement computed
   for a mesh and spec (a training loop builds the same few specs every step); "cold" clears
   ir_sharding's caches before each spec.

Prints a table and writes JSON (``--json PATH``).
"""

import argparse
import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # benchjson, at the top

import benchjson  # noqa: E402
from ir_core import DeviceData, Generic, Shape, Value, post_order  # noqa: E402
from ir_sharding import Mesh, ShardingSpec, relink, with_sharding  # noqa: E402
from ir_sharding._spec import _PARSED, _PLACEMENTS  # noqa: E402

SHAPE = Shape("float32", (1024, 1024))
SPEC = ShardingSpec(Mesh(range(8), (4, 2), ("data", "model")), (None, "model"))


def wide_graph(chains, length):
    leaves, roots = [], []
    for _ in range(chains):
        leaf = DeviceData(SHAPE)
        h = Value(leaf)
        for _ in range(length - 1):
            h = Value(Generic("aten::mul.Scalar", (h,), (SHAPE,), {"other": 0.9}))
        leaves.append(leaf)
        roots.append(h)
    return roots, leaves


def deep_graph(layers):
    weights = []
    h = Value(DeviceData(SHAPE))
    for _ in range(layers):
        w = DeviceData(SHAPE)
        weights.append(w)
        h = Value(Generic("aten::mm", (h, Value(w)), (SHAPE,)))
    return [h], weights


def timed(fn, repeats):
    samples = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
        del out
    return statistics.median(samples)


def relink_case(name, roots, leaf, repeats):
    nodes = len(post_order(roots))
    replacement = with_sharding(Value(leaf), SPEC).node
    mapping = {leaf: replacement}
    result = relink(roots, mapping)
    old = set(map(id, post_order(roots)))
    rebuilt = sum(1 for n in post_order(result) if id(n) not in old) - 1  # minus the replacement
    del result, old
    t_po = timed(lambda: post_order(roots), repeats)
    t_rl = timed(lambda: relink(roots, mapping), repeats)
    return {
        "case": name,
        "nodes": nodes,
        "rebuilt": rebuilt,
        "post_order_ms": round(t_po * 1e3, 3),
        "relink_ms": round(t_rl * 1e3, 3),
        "ratio": round(t_rl / t_po, 2),
    }


def spec_case(name, mesh_args, partition_spec, repeats, loops):
    mesh = Mesh(*mesh_args)

    def ours():
        for _ in range(loops):
            ShardingSpec(mesh, partition_spec).canonical_bytes()

    def ours_cold():
        for _ in range(loops):
            _PLACEMENTS.clear()
            _PARSED.clear()
            ShardingSpec(mesh, partition_spec).canonical_bytes()

    row = {
        "case": name,
        "ir_sharding_cold_us": round(timed(ours_cold, repeats) / loops * 1e6, 2),
        "ir_sharding_us": round(timed(ours, repeats) / loops * 1e6, 2),
    }
    try:
        import jax
        from jax.sharding import NamedSharding, PartitionSpec
    except ImportError:
        return row
    import numpy as np

    devices = np.array(jax.devices()[: mesh.size]).reshape(mesh.shape)
    jmesh = jax.sharding.Mesh(devices, mesh.axis_names)
    rank = len(partition_spec)

    def theirs():
        for _ in range(loops):
            NamedSharding(jmesh, PartitionSpec(*partition_spec))._to_xla_hlo_sharding(rank)

    row["jax_us"] = round(timed(theirs, repeats) / loops * 1e6, 2)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    try:
        import jax

        jax.config.update("jax_num_cpu_devices", 8)
    except ImportError:
        jax = None

    relinks = []
    roots, leaves = wide_graph(1000, 100)
    relinks.append(relink_case("wide: 1 of 1,000 chains", roots, leaves[500], args.repeats))
    del roots, leaves
    roots, weights = deep_graph(50_000)
    for name, k in [
        ("deep: last layer", -1),
        ("deep: middle layer", 25_000),
        ("deep: first layer", 0),
    ]:
        relinks.append(relink_case(name, roots, weights[k], args.repeats))
    del roots, weights

    specs = [
        spec_case(
            "4x2 (data, None)",
            (range(8), (4, 2), ("data", "model")),
            ("data", None),
            args.repeats,
            200,
        ),
        spec_case(
            "4x2 (None, model)",
            (range(8), (4, 2), ("data", "model")),
            (None, "model"),
            args.repeats,
            200,
        ),
        spec_case(
            "2x2x2 ((c, a), b)",
            (range(8), (2, 2, 2), ("a", "b", "c")),
            (("c", "a"), "b"),
            args.repeats,
            200,
        ),
        spec_case("8 (x,)", (range(8), (8,), ("x",)), ("x",), args.repeats, 200),
    ]

    print("\nrelink of one replaced leaf, against post_order of the same graph (medians)")
    print(
        f"{'case':<26}{'nodes':>9}{'rebuilt':>9}{'post_order ms':>15}{'relink ms':>11}{'ratio':>8}"
    )
    for r in relinks:
        print(
            f"{r['case']:<26}{r['nodes']:>9,}{r['rebuilt']:>9,}{r['post_order_ms']:>15.2f}"
            f"{r['relink_ms']:>11.2f}{r['ratio']:>8.2f}"
        )
    print("target: ratio <= 2 (a leaf read by a small part of the graph: the wide case)")
    print("\nShardingSpec(mesh, partition_spec).canonical_bytes(), per spec (medians)")
    print(f"{'case':<22}{'cold us':>9}{'warm us':>9}{'jax NamedSharding+HLO us':>26}")
    for r in specs:
        print(
            f"{r['case']:<22}{r['ir_sharding_cold_us']:>9.1f}{r['ir_sharding_us']:>9.1f}"
            f"{r.get('jax_us', float('nan')):>26.1f}"
        )
    print("target: <= 20 us per spec")

    results = {
        "relink": relinks,
        "relink_target_ratio_max": 2,
        "sharding_spec": specs,
        "sharding_spec_target_us_max": 20,
        "environment": benchjson.environment(jax=None if jax is None else jax.__version__),
    }
    benchjson.write(args.json, results)


if __name__ == "__main__":
    main()
