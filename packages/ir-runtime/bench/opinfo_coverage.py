"""torch's OpInfo suite through the lazy device: how many ops give eager's values, and eager's
values and input gradients (float32, the first samples of each op).

    python bench/opinfo_coverage.py                 # every op; a line each, then the totals
    python bench/opinfo_coverage.py sort topk       # only these (OpInfo names)
    python bench/opinfo_coverage.py --samples 1 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import ir_runtime as irt

irt.init(cpu_devices=8)

import opinfo  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="OpInfo names (default: all)")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--json", help="write each op's outcome here")
    parser.add_argument("--quiet", action="store_true", help="only the totals and failures")
    args = parser.parse_args()
    results = {}
    start = time.perf_counter()
    for op in opinfo.population():
        name = opinfo.op_id(op)
        if args.ops and name not in args.ops and op.name not in args.ops:
            continue
        o = opinfo.check(op, args.samples)
        results[name] = {"values": o.values, "grads": o.grads, "detail": o.detail}
        if not args.quiet or o.values != "pass" or o.grads not in ("pass", None):
            print(f"{name:44s} {o.values:6s} {o.grads!s:6s} {o.detail[:160]}", flush=True)
    values = collections.Counter(r["values"] for r in results.values())
    grads = collections.Counter(r["grads"] for r in results.values() if r["grads"])
    n_grad = sum(grads.values())
    print(
        f"\nvalues: {values['pass']} / {len(results)} pass ({values['wrong']} wrong, "
        f"{values['raise']} raise); values and gradients: {grads['pass']} / {n_grad} pass "
        f"({grads['wrong']} wrong, {grads['raise']} raise); "
        f"{time.perf_counter() - start:.0f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
