"""SPMD across processes: 2 processes x 4 CPU devices on loopback (jax.distributed, gloo) train
the linear model and the CNN exactly as one process with 8 devices does; a process that dies or
freezes ends the run, named, within the timeout, and leaves no process behind."""

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


def launch(tmp_path, *script_args):
    out = tmp_path / "two.npz"
    cmd = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "4"]
    run = subprocess.run(
        [*cmd, SCRIPT, *script_args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # Each process's output comes back with its prefix.
    assert "[0] process 0 of 2" in run.stdout and "[1] process 1 of 2" in run.stdout
    return np.load(out)


@pytest.mark.parametrize(
    "model, mode",
    [
        ("linear", "data"),
        ("linear", "fsdp"),
        ("linear", "megatron"),
        ("cnn", "batch"),
        ("cnn", "channels"),
    ],
)
def test_two_processes_train_as_one(tmp_path, model, mode):
    two = launch(tmp_path, "--model", model, "--mode", mode)
    losses, params, _ = train(model, mode)  # this process: 8 devices, the whole batch
    # The same program; only the order of the cross-process sums differs (gloo).
    np.testing.assert_allclose(two["losses"], losses, rtol=1e-5, atol=1e-7)
    for k, p in enumerate(params):
        np.testing.assert_allclose(two[f"p{k}"], p, rtol=1e-5, atol=1e-6)
    assert int(two["compiles"]) == (1 if model == "linear" else 2)


def test_two_processes_replay_a_compiled_step(tmp_path):
    """compile_step across processes: each process captures the step and replays it, in
    lockstep, with the numbers of the traced run in one process."""
    two = launch(tmp_path, "--model", "linear", "--mode", "megatron", "--compiled")
    losses, params, _ = train("linear", "megatron")
    np.testing.assert_allclose(two["losses"], losses, rtol=1e-5, atol=1e-7)
    for k, p in enumerate(params):
        np.testing.assert_allclose(two[f"p{k}"], p, rtol=1e-5, atol=1e-6)
    assert int(two["compiles"]) == 1 and int(two["replays"]) == len(losses) - 2


def _start_reading(proc):
    """Lines of ``proc``'s stdout as they come, plus the pids each process reports."""
    pids, lines = {}, []

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
    cmd = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "4"]
    cmd += ["--timeout", str(TIMEOUT), SCRIPT, "--steps", "100000", "--sleep", "0.02"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pids, _, until = _start_reading(proc)
        until(r"^\[1\] step 3 ")
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        rest = proc.communicate(timeout=60)[0]
        took = time.monotonic() - killed
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert f"process 1 (pid {pids[1]}) was killed by SIGKILL; stopping the 1 other" in rest
    assert took < TIMEOUT, rest  # the launcher sees it at once; the watchdog is the backstop
    assert all(_gone(p) for p in pids.values())


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
def test_a_lost_process_is_named_within_the_timeout(how):
    """No launcher: two processes on their own (as a cluster scheduler starts them). Process 1
    dies, or freezes; process 0, waiting inside a collective, reports it and exits."""
    procs = _start_alone(["--steps", "100000", "--sleep", "0.02"], subprocess.PIPE)
    try:
        _, _, until = _start_reading(procs[1])
        until(r"^step 3 ")
        procs[1].send_signal(how)
        lost = time.monotonic()
        err = procs[0].communicate(timeout=TIMEOUT + 60)[1]
        took = time.monotonic() - lost
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[0].returncode == 3, err[-3000:]
    assert "ir_runtime: error: process 1 stopped responding" in err, err[-3000:]
    # Silence counts from its last heartbeat, up to one beat (0.5 s) before the signal.
    assert TIMEOUT - 2 <= took < TIMEOUT + 10, (took, err[-3000:])


def test_launcher_ends_the_run_when_a_process_raises():
    cmd = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "4"]
    cmd += ["--timeout", str(TIMEOUT), SCRIPT, "--steps", "100000", "--raise-at", "3"]
    start = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "[1] RuntimeError: process 1 fails on purpose at step 3" in run.stdout
    assert "ir_runtime.launch: process 1 (pid" in run.stdout
    assert "exited with status 1; stopping the 1 other" in run.stdout
    assert time.monotonic() - start < 60


def test_a_process_waiting_for_a_step_the_others_never_run_is_named():
    """Process 1 runs 3 more steps than process 0: it waits inside a collective process 0 never
    joins. Process 0, finished, names it within the timeout instead of waiting forever."""
    procs = _start_alone(["--steps", "5", "--uneven"], subprocess.DEVNULL)
    try:
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
