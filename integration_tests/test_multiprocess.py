"""SPMD across processes: 2 processes x 4 CPU devices on loopback (jax.distributed, gloo) train
the linear model and the CNN exactly as one process with 8 devices does; a process that dies or
freezes ends the run, named, within the timeout, and leaves no process behind.

No test here times the run with the wall clock: each one checks who noticed the loss and what
they reported (the launcher's message, a watchdog's error and exit status, the silence the
watchdog itself measured). The only clocks are hang guards, far above what they guard."""

import functools
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from spmd_train import train

from ir_runtime.launch import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "spmd_train.py")
TIMEOUT = 5  # seconds a process may go silent (IR_RUNTIME_TIMEOUT)
# The watchdog's timeout where the launcher, not the watchdog, must end the run. The launcher
# needs about 1 s (a 0.05 s poll, then GRACE before it kills the others); 30 s is 30 times that,
# so on a busy machine the launcher still gets there first, and a process 0 that reports the
# loss itself (its watchdog fired) means the launcher did not see the failure.
LAUNCHER_TIMEOUT = 30
WATCHDOG_ERROR = "ir_runtime: error:"  # how a watchdog reports a lost process before exiting


def launch(tmp_path, *script_args):
    out = tmp_path / "two.npz"
    cmd = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "4"]
    run = subprocess.run(
        [*cmd, SCRIPT, *script_args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard: a launch of every run below takes under a minute
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # Each process's output comes back with its prefix.
    assert "[0] process 0 of 2" in run.stdout and "[1] process 1 of 2" in run.stdout
    return np.load(out)


# The runs below, in one launch: two processes start (and import torch and jax) once.
RUNS = (
    "linear/data",
    "linear/fsdp",
    "linear/megatron",
    "cnn/batch",
    "cnn/channels",
    "linear/megatron+compiled",
    "linear/fsdp+loader",
)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Each run's results from the two processes, by run: ``{"losses", "compiles",
    "replays", "p0", ...}``."""
    out = launch(tmp_path_factory.mktemp("two"), "--runs", ",".join(RUNS))
    return {
        run: {key.split("_", 1)[1]: out[key] for key in out.files if key.startswith(f"r{k}_")}
        for k, run in enumerate(RUNS)
    }


@functools.cache
def one(model, mode):
    """This process's run over 8 devices, the whole batch each step."""
    return train(model, mode)


def _same_run(two, model, mode):
    losses, params, _ = one(model, mode)
    # The same program; only the order of the cross-process sums differs (gloo).
    np.testing.assert_allclose(two["losses"], losses, rtol=1e-5, atol=1e-7)
    for k, p in enumerate(params):
        np.testing.assert_allclose(two[f"p{k}"], p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("run", RUNS[:5])
def test_two_processes_train_as_one(two, run):
    _same_run(two[run], *run.split("/"))
    assert int(two[run]["compiles"]) == (1 if run.startswith("linear") else 2)


def test_two_processes_replay_a_compiled_step(two):
    """compile_step across processes: each process captures the step and replays it, in
    lockstep, with the numbers of the traced run in one process."""
    got = two["linear/megatron+compiled"]
    _same_run(got, "linear", "megatron")
    assert int(got["compiles"]) == 1 and int(got["replays"]) == len(got["losses"]) - 2


def test_two_processes_feed_a_sharded_loader_their_own_rows(two):
    """ShardedLoader across processes: each process loads and places only its own rows of
    every batch, and the run has the numbers of one process fed whole batches."""
    got = two["linear/fsdp+loader"]
    _same_run(got, "linear", "fsdp")
    assert int(got["compiles"]) == 1


def _start_reading(proc):
    """Lines of ``proc``'s stdout as they come, plus the pids each process reports."""
    pids, lines = {}, []

    # ``deadline`` is a hang guard, not a measurement: the processes print their first steps
    # within seconds of starting; 120 s only ends a run that never gets there.
    def until(pattern, deadline=120):
        end = time.monotonic() + deadline
        for line in proc.stdout:
            lines.append(line)
            m = re.search(r"process (\d) of \d, pid (\d+)", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
            if re.search(pattern, line):
                return line
            assert time.monotonic() < end, "".join(lines[-20:])
        raise AssertionError("output ended before " + pattern + ":\n" + "".join(lines[-20:]))

    return pids, lines, until


def _start_alone(script_args, stdout):
    """Two processes of the script without the launcher, as a cluster scheduler starts them."""
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, SCRIPT, *script_args],
            env=dict(
                os.environ,
                IR_RUNTIME_COORDINATOR=f"127.0.0.1:{port}",
                IR_RUNTIME_NUM_PROCESSES="2",
                IR_RUNTIME_PROCESS_ID=str(k),
                IR_RUNTIME_CPU_DEVICES="4",
                IR_RUNTIME_TIMEOUT=str(TIMEOUT),
                PYTHONUNBUFFERED="1",
            ),
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(2)
    ]


def _gone(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_launcher_ends_the_run_when_a_process_dies():
    """The launcher sees a dead process at once, names it and stops the others; the watchdog
    (its timeout far away here) is only the backstop."""
    cmd = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "4"]
    cmd += ["--timeout", str(LAUNCHER_TIMEOUT), SCRIPT, "--steps", "100000", "--sleep", "0.02"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pids, _, until = _start_reading(proc)
        until(r"^\[1\] step 3 ")
        os.kill(pids[1], signal.SIGKILL)
        # A hang guard: the launcher ends the run in about 1 s; it must not take the watchdog's
        # timeout, which the assertions below tell apart from the launcher's own doing.
        rest = proc.communicate(timeout=LAUNCHER_TIMEOUT + 60)[0]
    finally:
        proc.kill()
    assert proc.returncode == 1
    # Process 0 was still running when the launcher named process 1 ("the 1 other"), and it
    # never reported the loss itself: the launcher, not process 0's watchdog, ended the run.
    assert f"process 1 (pid {pids[1]}) was killed by SIGKILL; stopping the 1 other" in rest
    assert WATCHDOG_ERROR not in rest, rest[-3000:]
    assert all(_gone(p) for p in pids.values())


def _silence(err: str) -> int:
    """The seconds of silence a watchdog measured before it named a process."""
    m = re.search(r"process 1 stopped responding: no heartbeat for (\d+) s", err)
    assert m, err[-3000:]
    return int(m.group(1))


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
def test_a_lost_process_is_named_within_the_timeout(how):
    """No launcher: two processes on their own (as a cluster scheduler starts them). Process 1
    dies, or freezes; process 0, waiting inside a collective, reports it and exits."""
    procs = _start_alone(["--steps", "100000", "--sleep", "0.02"], subprocess.PIPE)
    try:
        _, _, until = _start_reading(procs[1])
        until(r"^step 3 ")
        # No false alarm while both run: process 0's watchdog has not given up on anyone.
        assert procs[0].poll() is None
        procs[1].send_signal(how)
        # A hang guard: process 0 ends about TIMEOUT s after the signal.
        err = procs[0].communicate(timeout=TIMEOUT + 60)[1]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    # Its watchdog named process 1 and ended process 0 with EXIT_PROCESS_LOST: "within the
    # timeout" is that the watchdog fired, not jax's own heartbeat backstop (2 * TIMEOUT + 10 s,
    # a SIGABRT naming no process) and not the hang guard.
    assert procs[0].returncode == 3, err[-3000:]
    assert "ir_runtime: error: process 1 stopped responding" in err, err[-3000:]
    # It gave up only after the timeout, by its own measure of the silence (not too early).
    assert _silence(err) >= TIMEOUT, err[-3000:]


def test_launcher_ends_the_run_when_a_process_raises():
    """Process 1 raises: it leaves at once (no wait for the others at exit), and the launcher
    names it and stops process 0, which would otherwise wait inside a collective."""
    cmd = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "4"]
    cmd += ["--timeout", str(LAUNCHER_TIMEOUT), SCRIPT, "--steps", "100000", "--raise-at", "3"]
    # A hang guard: the run ends within seconds of process 1's start; it only ends a run in
    # which process 1 waits for the others after its exception, or the launcher never stops.
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCHER_TIMEOUT + 90)
    assert run.returncode == 1
    assert "[1] RuntimeError: process 1 fails on purpose at step 3" in run.stdout
    assert "[1] ir_runtime: process 1 ended with an uncaught exception; leaving" in run.stdout
    assert "ir_runtime.launch: process 1 (pid" in run.stdout
    assert "exited with status 1; stopping the 1 other" in run.stdout
    # Process 0 was stopped by the launcher, not by its watchdog giving up on process 1.
    assert WATCHDOG_ERROR not in run.stdout, run.stdout[-3000:]


def test_a_process_waiting_for_a_step_the_others_never_run_is_named():
    """Process 1 runs 3 more steps than process 0: it waits inside a collective process 0 never
    joins. Process 0, finished, names it within the timeout instead of waiting forever."""
    procs = _start_alone(["--steps", "5", "--uneven"], subprocess.DEVNULL)
    try:
        # Hang guards: process 0 names process 1 about TIMEOUT s after it finishes, and
        # process 1 ends within seconds of that; 120 s and 60 s only end a run that hangs.
        err0 = procs[0].communicate(timeout=120)[1]
        err1 = procs[1].communicate(timeout=60)[1]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[0].returncode == 3, err0[-3000:]
    assert "process 1 has waited" in err0 and "every process must run the same steps" in err0
    # Process 1 then loses the coordinator, which lived in process 0: jax's client ends it at
    # once (SIGABRT, "the leader task ... died"), or the watchdog does first.
    assert procs[1].returncode in (3, -signal.SIGABRT), err1[-3000:]
    assert "lost the coordinator (process 0" in err1 or "leader task" in err1, err1[-3000:]


def test_two_processes_train_the_tutorial_llama_under_its_plan_as_one(tmp_path):
    """``irt.device_mesh`` across processes: each process's mesh answers for its first device
    (process 1: device 4, coordinate (1, 0), its own tp row); the plan's program is the one
    process's, with its losses and parameters."""
    from plan_train import train as train_plan

    out = tmp_path / "plan.npz"
    cmd = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "4"]
    run = subprocess.run(
        [*cmd, os.path.join(HERE, "plan_train.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "[0] mesh [0, 0, 0, 0, 1, 2, 3, 0, 4, 0, 0]" in run.stdout
    assert "[1] mesh [4, 1, 0, 4, 5, 6, 7, 0, 4, 1, 0]" in run.stdout
    two = np.load(out)
    losses, params, answers = train_plan()
    assert answers == [0, 0, 0, 0, 1, 2, 3, 0, 4, 0, 0]
    np.testing.assert_allclose(two["losses"], losses, rtol=1e-5, atol=1e-7)
    for k, p in enumerate(params):  # (AdamW's normalized steps magnify gloo's sum order)
        np.testing.assert_allclose(two[f"p{k}"], p, rtol=1e-4, atol=1e-4)
