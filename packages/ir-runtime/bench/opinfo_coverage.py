"""torch's OpInfo suite through the lazy device: how many ops give eager's values, and eager's
values and input gradients (float32 unless --dtype says, the first samples of each op).

    python bench/opinfo_coverage.py                 # every op; a line each, then the totals
    python bench/opinfo_coverage.py sort topk       # only these (OpInfo names)
    python bench/opinfo_coverage.py --samples 1 --json out.json
    python bench/opinfo_coverage.py --dtype bfloat16 --samples 2
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import torch

import ir_runtime as irt

irt.init(cpu_devices=8)

import opinfo  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="OpInfo names (default: all)")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16, ...")
    parser.add_argument("--json", help="write each op's outcome here")
    parser.add_argument("--quiet", action="store_true", help="only the totals and failures")
    args = parser.parse_args()
    results = {}
    start = time.perf_counter()
    dtype = getattr(torch, args.dtype)
    for op in opinfo.population(dtype):
        name = opinfo.op_id(op)
        if args.ops and name not in args.ops and op.name not in args.ops:
            continue
        o = opinfo.check(op, args.samples, dtype)
        results[name] = {
            "values": o.values,
            "grads": o.grads,
            "detail": o.detail,
            "nearer": list(o.nearer),
        }
        failed = o.values != "pass" or o.grads not in ("pass", None)
        if not args.quiet or failed or o.nearer:
            nearer = f"(nearer float64 than eager: {', '.join(o.nearer)}) " if o.nearer else ""
            print(f"{name:44s} {o.values:6s} {o.grads!s:6s} {nearer}{o.detail[:160]}", flush=True)
    values = collections.Counter(r["values"] for r in results.values())
    grads = collections.Counter(r["grads"] for r in results.values() if r["grads"])
    n_grad = sum(grads.values())
    print(
        f"\nvalues: {values['pass']} / {len(results)} pass ({values['wrong']} wrong, "
        f"{values['raise']} raise); values and gradients: {grads['pass']} / {n_grad} pass "
        f"({grads['wrong']} wrong, {grads['raise']} raise); "
        f"{sum(bool(r['nearer']) for r in results.values())} pass nearer float64 than eager; "
        f"{time.perf_counter() - start:.0f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
