"""The same graph hashes the same in every process, whatever PYTHONHASHSEED is."""

import os
import subprocess
import sys

SCRIPT = r"""
from ir_core import DeviceData, Generic, Shape, Value, graph_hash

class Sharding:
    def canonical_bytes(self):
        return b"mesh:4x2|tiled"

x = DeviceData(Shape("float32", (16, 32)))
w = DeviceData(Shape("bfloat16", (32, 8)), sharding=Sharding())
# Attribute dicts built in different insertion orders; a set-derived tuple would differ by seed,
# so the order here comes from sorted() only.
attrs = dict(zip(["beta", "alpha", "dims"], [2.5, 1, tuple(sorted({3, 1, 2}))]))
mm = Generic("aten::mm", [Value(x), Value(w)], [Shape("float32", (16, 8))], attrs)
out = Generic("aten::max.dim", [Value(mm)], [Shape("float32", (16,)), Shape("int64", (16,))],
              {"dim": 1, "keepdim": False, "name": "\u00e9t\u00e9", "raw": b"\x00\xff"})
print(mm.node_hash, mm.dag_hash, out.dag_hash, graph_hash([Value(out, 0), Value(out, 1)]))
"""


def _run(seed):
    env = dict(os.environ, PYTHONHASHSEED=str(seed))
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, check=True, capture_output=True, text=True
    ).stdout


def test_hashes_do_not_depend_on_hash_seed():
    results = {_run(seed) for seed in (0, 1, 12345, 4294967295)}
    assert len(results) == 1
    namespace = {}
    exec(SCRIPT.replace("print(", "result = ("), namespace)
    assert results.pop().split() == [str(h) for h in namespace["result"]]
