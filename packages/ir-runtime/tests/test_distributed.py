"""Runs across processes: argument checks, global device ids, a tensor from each process's part
of it, and one program over two processes on loopback (jax.distributed, gloo)."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_runtime._distributed import resolve
from ir_runtime._frontend import inspect
from ir_sharding import Mesh, ShardingError, ShardingSpec

MESH = Mesh(range(8), (4, 2), ("data", "model"))


@pytest.mark.parametrize(
    "args, message",
    [
        (("127.0.0.1:1234", 2, None), "missing: process_id"),
        ((None, 2, 0), "missing: coordinator_address"),
        (("localhost", 2, 0), "'host:port', got 'localhost'"),
        (("127.0.0.1:1234", 0, 0), "num_processes must be at least 1, got 0"),
        (("127.0.0.1:1234", 2, 2), "process_id must be in 0..1 for 2 processes, got 2"),
        (("127.0.0.1:1234", 2, -1), "process_id must be in 0..1 for 2 processes, got -1"),
        (("127.0.0.1:1234", 2.0, 0), "num_processes must be an int, got 2.0"),
        (("127.0.0.1:1234", 2, True), "process_id must be an int, got True"),
    ],
)
def test_bad_process_arguments_are_named(args, message, monkeypatch):
    for name in ("IR_RUNTIME_COORDINATOR", "IR_RUNTIME_NUM_PROCESSES", "IR_RUNTIME_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(irt.DistributedError, match=re.escape(message)):
        resolve(*args, None)


def test_arguments_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("IR_RUNTIME_COORDINATOR", "10.0.0.1:9999")
    monkeypatch.setenv("IR_RUNTIME_NUM_PROCESSES", "4")
    monkeypatch.setenv("IR_RUNTIME_PROCESS_ID", "3")
    monkeypatch.setenv("IR_RUNTIME_TIMEOUT", "12.5")
    assert resolve(None, None, None, None) == ("10.0.0.1:9999", 4, 3, 12.5)
    assert resolve(None, None, 1, 7)[2:] == (1, 7.0)  # arguments beat the environment
    monkeypatch.setenv("IR_RUNTIME_NUM_PROCESSES", "four")
    with pytest.raises(irt.DistributedError, match="IR_RUNTIME_NUM_PROCESSES='four'"):
        resolve(None, None, None, None)
    monkeypatch.setenv("IR_RUNTIME_NUM_PROCESSES", "4")
    with pytest.raises(irt.DistributedError, match="timeout must be a positive number"):
        resolve(None, None, None, -1)


def test_one_process_on_its_own():
    assert resolve(None, None, None, None) is None
    assert irt.process_index() == 0 and irt.process_count() == 1
    # Global device ids are jax's own ids in one process.
    assert [d.id for d in irt.devices()] == list(range(8))


def test_joining_after_the_backend_started_is_refused():
    with pytest.raises(irt.DistributedError, match="already started"):
        irt.init(coordinator_address="127.0.0.1:1", num_processes=2, process_id=0)


def test_process_local_slices_agree_with_jax_index_maps():
    shape = (64, 6)
    for spec in [("data", None), (None, "model"), (("data", "model"), None), (None, None)]:
        s = ShardingSpec(MESH, spec)
        got = irt.process_local_slices(MESH, spec, shape)
        # One process holds every device: its part is the whole array.
        assert got == (slice(0, 64), slice(0, 6))
        index = s.to_jax().addressable_devices_indices_map(shape)
        assert len(index) == 8


def test_from_process_local_is_mark_sharding_in_one_process():
    x = torch.randn(32, 16)
    a = irt.from_process_local(x, MESH, ("data", None))
    b = irt.mark_sharding(irt.to_lazy(x), MESH, ("data", None))
    assert irt.visualize_sharding(a) == irt.visualize_sharding(b)
    handle = inspect.data_of(a)
    assert handle.sharding.is_equivalent_to(ShardingSpec(MESH, ("data", None)).to_jax(), 2)
    w = torch.randn(16, 4)
    np.testing.assert_allclose(
        irt.to_torch(a @ irt.to_lazy(w)).numpy(), (x @ w).numpy(), rtol=1e-5, atol=1e-5
    )
    half = torch.randn(8, 4).to(torch.bfloat16)
    h = irt.from_process_local(half, MESH, ("data", None))
    assert h.dtype == torch.bfloat16
    assert torch.equal(irt.to_torch(h), half)  # the same bits


def test_from_process_local_errors():
    with pytest.raises(ShardingError, match="rank"):
        irt.from_process_local(torch.ones(4, 4), MESH, ("data",))
    with pytest.raises(ShardingError, match="does not fit"):
        irt.from_process_local(torch.ones(8, 4), MESH, ("data", None), global_shape=(16, 4))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        irt.from_process_local(np.ones((8, 4)), MESH, ("data", None))


def test_wait_device_ops_waits_for_the_last_step():
    t = irt.to_lazy(torch.ones(64, 64))
    irt.mark_sharding(t, MESH, ("data", None))
    u = (t @ t).sum(1)
    irt.mark_step()
    irt.wait_device_ops()
    assert inspect.data_of(u).is_ready()
    assert irt.to_torch(u)[0].item() == 64 * 64


SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import ir_runtime as irt
    from ir_core import Generic, Value
    from ir_sharding import Mesh, ShardingSpec

    devices = irt.init()
    mesh = Mesh(range(4), (4,), ("d",))
    spec = ShardingSpec(mesh, ("d", None))
    x = irt.to_device(np.arange(32, dtype=np.float32).reshape(8, 4), spec)
    total = Generic("aten::sum.default", [Value(x)], [x.shape.__class__("float32", ())], {})
    doubled = Generic("aten::mul.Scalar", [Value(x)], [x.shape], {"other": 2.0})
    s, d = irt.execute([Value(total), Value(doubled)], out_shardings=[None, spec])
    print("process", irt.process_index(), "of", irt.process_count(),
          "local", [irt.devices().index(v) for v in __import__("jax").local_devices()],
          "sum", float(irt.to_host(s)), "doubled", irt.to_host(d)[:, 0].tolist(),
          "gathers", irt.metrics()["counters"].get("CrossProcessGather", 0), flush=True)
    """
)


def test_one_program_over_two_processes(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "2"]
    # timeout: a hang guard (a lost peer blocks a collective forever); the run takes seconds.
    run = subprocess.run(
        [*cmd, str(script)], capture_output=True, text=True, timeout=240, env=dict(os.environ)
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if " sum " in line]
    assert sorted(line[:4] for line in lines) == ["[0] ", "[1] "]  # each line prefixed
    doubled = (np.arange(32).reshape(8, 4)[:, 0] * 2).tolist()
    for k, line in enumerate(sorted(lines)):
        # Global ids 0-1 live in process 0, 2-3 in process 1; the sum is replicated, the
        # doubled rows are gathered from both processes.
        assert f"process {k} of 2 local [{2 * k}, {2 * k + 1}]" in line
        assert f"sum {float(np.arange(32).sum())}" in line
        assert f"doubled {[float(v) for v in doubled]}" in line
        assert "gathers 1" in line
    # The first gather says what it costs, pointing at the line that read the tensor.
    warned = [line for line in run.stdout.splitlines() if "GatherWarning" in line]
    assert len(warned) == 2 and all("two.py:" in line for line in warned), warned
    assert "every process must read it at the same point" in warned[0]
    assert "float32[8, 4]" in warned[0] and "(128 bytes)" in warned[0]


def test_launcher_rejects_bad_arguments(tmp_path):
    from ir_runtime.launch import main

    with pytest.raises(SystemExit):
        main(["--nprocs", "0", "x.py"])
    with pytest.raises(SystemExit):
        main(["--nprocs", "2", str(tmp_path / "missing.py")])


def test_the_launcher_names_the_cause_among_processes_ended_at_one_look():
    """A killed process's peer may abort in gloo (SIGABRT) or exit as having lost it before the
    launcher looks: the killed one is named, whichever index it has."""
    import signal

    from ir_runtime._distributed import EXIT_PROCESS_LOST
    from ir_runtime.launch import cause

    kill, abort = -signal.SIGKILL, -signal.SIGABRT
    assert cause({0: abort, 1: kill}) == 1
    assert cause({0: EXIT_PROCESS_LOST, 1: abort, 2: 1}) == 2
    assert cause({0: EXIT_PROCESS_LOST, 3: abort}) == 3
    assert cause({2: EXIT_PROCESS_LOST, 1: EXIT_PROCESS_LOST}) == 1
    assert cause({4: kill, 1: 7}) == 1  # (two causes: the first)


class _FakeClock:
    """Stands in for the ``time`` module inside ``_distributed``: ``sleep`` advances the clock
    instead of sleeping, and every sleep is recorded, so a test counts the waits (events) and
    reads how long they would have lasted without measuring the wall clock."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        # A guard, not a measurement: should the code stop waiting through ``sleep``, the test
        # fails here instead of spinning forever on a clock that never moves.
        assert self.reads < 10_000, "device_failure polled the clock without sleeping"
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_device_failure_waits_for_the_watchdog_across_processes(monkeypatch):
    """gloo reports a lost peer at once, naming only an address: across processes the error
    waits up to the watchdog's timeout, so the watchdog can name the process first."""
    from ir_runtime import _distributed

    clock = _FakeClock()
    monkeypatch.setattr(_distributed, "time", clock)
    error = RuntimeError("Gloo all-reduce failed: Connection reset by peer")
    message = (
        "the program failed on the device: RuntimeError: Gloo all-reduce failed: Connection "
        "reset by peer"
    )
    assert _distributed.STATE.watchdog is None
    e = _distributed.device_failure(error, "the program")  # one process: no wait
    assert clock.sleeps == []
    assert isinstance(e, irt.ExecutionError)
    assert str(e) == message

    class Watchdog:
        timeout, interval, stop = 0.4, 0.05, False

    watchdog = Watchdog()
    monkeypatch.setattr(_distributed.STATE, "watchdog", watchdog)
    e = _distributed.device_failure(error, "the program")
    # It waited in the watchdog's beats until the watchdog's whole timeout had passed: time
    # enough for it to see the lost process and end this one with the process's name.
    assert clock.sleeps and set(clock.sleeps) == {watchdog.interval}
    assert sum(clock.sleeps) >= watchdog.timeout
    # ... and then gave up (the clock is fake: this bound is exact, not a wall-clock guess).
    assert sum(clock.sleeps) <= watchdog.timeout + 10 * watchdog.interval
    assert isinstance(e, irt.ExecutionError) and str(e) == message

    # A stopped watchdog (this process is leaving, past jax's shutdown) names no one: no wait.
    clock.sleeps.clear()
    watchdog.stop = True
    _distributed.device_failure(error, "the program")
    assert clock.sleeps == []
