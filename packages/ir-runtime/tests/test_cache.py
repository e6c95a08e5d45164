"""The compile cache: hits over new data, a compile per new placement, no program ever run for
a graph it was not compiled for, the persistent cache across processes, and errors that leave
every input as it was."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from models import data, leaf, linear_sgd_step, params

import ir_runtime as irt
from ir_core import DeviceData, Generic, Shape, Value, post_order
from ir_runtime import _cache
from ir_sharding import Mesh, ShardingSpec

MESH = Mesh(range(8), (4, 2), ("data", "model"))


def counters():
    return irt.metrics()["counters"]


@pytest.fixture(autouse=True)
def fresh_cache():
    irt.CACHE.clear()
    irt.reset_metrics()


def step(seed, w_spec=None):
    x, y = data(seed, 16, 8, 4)
    w, b = params(seed, 8, 4)
    return linear_sgd_step(
        leaf(x, ShardingSpec(MESH, ("data", None))), leaf(y), leaf(w, w_spec), leaf(b)
    )


def test_new_data_compiles_nothing_and_a_new_sharding_compiles_once():
    irt.execute(step(0))
    assert counters()["CompileCount"] == 1
    irt.execute(step(1))
    irt.execute(step(2))
    c = counters()
    assert (c["CompileCount"], c["CacheHit"], c["CacheMiss"]) == (1, 2, 1)
    irt.execute(step(3, ShardingSpec(MESH, (None, "model"))))
    assert counters()["CompileCount"] == 2
    irt.execute(step(4, ShardingSpec(MESH, (None, "model"))))
    assert counters()["CompileCount"] == 2
    # The same placement written another way is the same program.
    irt.execute(step(5, ShardingSpec(MESH, (None, 1))))
    assert counters()["CompileCount"] == 2


def _two_graphs():
    s = Shape("float32", (4,))
    a = DeviceData(s, handle=np.arange(4, dtype=np.float32))
    b = DeviceData(s, handle=np.full(4, 10, np.float32))
    add = Value(Generic("aten::add.Tensor", [Value(a), Value(b)], [s], {"alpha": 1}))
    mul = Value(Generic("aten::mul.Tensor", [Value(a), Value(b)], [s]))
    return add, mul


def test_a_forced_hash_collision_never_runs_the_wrong_program(monkeypatch):
    monkeypatch.setattr(_cache, "graph_hash", lambda roots: 0)
    add, mul = _two_graphs()
    (r_add,) = irt.execute([add])
    (r_mul,) = irt.execute([mul])
    np.testing.assert_array_equal(irt.to_host(r_add), np.arange(4) + 10)
    np.testing.assert_array_equal(irt.to_host(r_mul), np.arange(4) * 10)
    c = counters()
    assert (c["CompileCount"], c["CacheHit"]) == (2, 0)
    (again,) = irt.execute([mul])  # both live in one bucket; the right one is found
    np.testing.assert_array_equal(irt.to_host(again), np.arange(4) * 10)
    assert counters()["CacheHit"] == 1


def test_lru_evicts_the_oldest(monkeypatch):
    monkeypatch.setattr(irt.CACHE, "capacity", 1)
    add, mul = _two_graphs()
    irt.execute([add])
    irt.execute([mul])
    irt.execute([add])
    assert counters()["CompileCount"] == 3
    assert len(irt.CACHE) == 1


def _inputs_intact(leaves, before):
    for leaf_node, value in zip(leaves, before, strict=True):
        np.testing.assert_array_equal(np.asarray(leaf_node.handle), value)


def test_an_unsupported_op_is_named_and_changes_nothing():
    x = irt.to_device(np.ones(3, np.float32))
    bad = Value(Generic("aten::frobnicate.default", [Value(x)], [x.shape]))
    with pytest.raises(
        irt.UnsupportedOpError, match=r"no lowering rule for op 'aten::frobnicate.default'"
    ):
        irt.execute([bad])
    _inputs_intact([x], [np.ones(3)])
    assert not x.handle.is_deleted()
    assert len(irt.CACHE) == 0


def test_a_rule_error_is_a_lowering_error_naming_the_node():
    x = irt.to_device(np.ones((2, 3), np.float32))
    wrong = Value(Generic("aten::mm.default", [Value(x), Value(x)], [Shape("float32", (2, 3))]))
    with pytest.raises(irt.LoweringError, match=r"lowering 'aten::mm.default' failed"):
        irt.execute([wrong])
    lying = Value(Generic("aten::neg.default", [Value(x)], [Shape("float32", (3, 2))]))
    with pytest.raises(
        irt.LoweringError,
        match=r"gave output 0 as float32\[2, 3\], but the node says float32\[3,2\]",
    ):
        irt.execute([lying])
    _inputs_intact([x], [np.ones((2, 3))])


def test_a_failed_compile_or_execution_leaves_inputs_intact(monkeypatch):
    x = irt.to_device(np.arange(4, dtype=np.float32))
    y = Value(Generic("aten::neg.default", [Value(x)], [x.shape]))

    def broken_compile(self, *args, **kwargs):
        raise RuntimeError("injected XLA compile failure")

    monkeypatch.setattr(jax.stages.Lowered, "compile", broken_compile)
    with pytest.raises(irt.CompileError, match="injected XLA compile failure"):
        irt.execute([y], donate=[x])
    monkeypatch.undo()
    assert len(irt.CACHE) == 0
    _inputs_intact([x], [np.arange(4)])

    exe = irt.compile([y])

    class Broken:
        def __call__(self, *arrays):
            raise RuntimeError("injected device failure")

    monkeypatch.setattr(exe, "compiled", Broken())
    with pytest.raises(irt.ExecutionError, match="injected device failure"):
        irt.execute([y])
    _inputs_intact([x], [np.arange(4)])
    assert not x.handle.is_deleted()


PERSISTENT = textwrap.dedent(
    """
    import json, sys
    import jax
    import numpy as np
    import ir_runtime as irt
    from ir_core import DeviceData, Generic, Shape, Value

    # jax's own events for its persistent cache: a compile that asks the cache, one the cache
    # served, and one compiled here and written to the cache.
    events = {}
    names = {"/jax/compilation_cache/compile_requests_use_cache": "asked",
             "/jax/compilation_cache/cache_hits": "served",
             "/jax/compilation_cache/cache_misses": "written"}
    def listen(event, **kwargs):
        if event in names:
            events[names[event]] = events.get(names[event], 0) + 1
    jax.monitoring.register_event_listener(listen)

    irt.init(cpu_devices=2, cache_dir=sys.argv[1])
    s = Shape("float32", (16, 16))
    x = DeviceData(s, handle=(np.arange(256, dtype=np.float32).reshape(16, 16) % 7 - 3) / 8)
    v = Value(x)
    for k in range(8):
        v = Value(Generic("aten::mm.default", [v, Value(x)], [s]))
        v = Value(Generic("aten::tanh.default", [v], [s]))
    (out,) = irt.execute([v])
    c = irt.metrics()["counters"]
    print(json.dumps({"hits": c["PersistentCacheHit"], "compiles": c["CompileCount"],
                      "result": irt.to_host(out).tolist(), **events}))
    """
)


def test_persistent_cache_serves_a_second_process(tmp_path):
    """A second process compiles nothing itself: every XLA compile it asks for is served from
    the first process's cache directory, and the program it gets computes the same numbers.
    (A hit is counted, not timed: a faster second compile is what it saves, and a busy machine
    blurs that.)"""
    script = tmp_path / "run.py"
    script.write_text(PERSISTENT)
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("IR_RUNTIME_CACHE_DIR", "XLA_FLAGS")}

    def run():
        out = subprocess.run(
            [sys.executable, str(script), str(cache)], capture_output=True, text=True, env=env
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run()
    entries = sorted(p.name for p in cache.iterdir())
    second = run()
    # The first process finds an empty cache: it compiles every program and writes each one.
    assert first["hits"] == first.get("served", 0) == 0, first
    assert first.get("asked", 0) >= 1 and first.get("written") == first["asked"], first
    assert entries, "the first process wrote nothing to the cache directory"
    # The second asks for the same compiles; the cache serves every one, and it writes nothing.
    assert second.get("asked") == first["asked"], (first, second)
    assert second["hits"] == second.get("served") == second["asked"], second
    assert second.get("written", 0) == 0, second
    assert sorted(p.name for p in cache.iterdir()) == entries
    # A persistent hit is still a miss of the in-memory cache: one Executable in each process.
    assert first["compiles"] == second["compiles"] == 1
    np.testing.assert_array_equal(np.array(second["result"]), np.array(first["result"]))


def test_cache_lookup_reports_its_time():
    irt.execute(step(0))
    irt.execute(step(1))
    t = irt.metrics()["timers"]
    assert t["CacheLookupTime"]["count"] == 1
    assert t["GraphNodes"]["last"] == len(post_order(step(0)))
    assert "CompileCount: 1" in irt.metrics_report()
