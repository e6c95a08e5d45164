"""Run a script as several processes of one SPMD run on this machine.

    python -m ir_runtime.launch --nprocs 2 --cpu-devices 4 train.py --epochs 3

Each process runs ``train.py`` with ``IR_RUNTIME_COORDINATOR`` (a free loopback port),
``IR_RUNTIME_NUM_PROCESSES``, ``IR_RUNTIME_PROCESS_ID`` and ``IR_RUNTIME_CPU_DEVICES`` set, so
the script's ``ir_runtime.init()`` joins the others. Their output is streamed line by line, each
line prefixed with ``[k]``. When a process fails, the launcher says which one and how, ends all
the others (and anything they started), and exits with status 1; when all succeed, with 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from ir_runtime._distributed import EXIT_PROCESS_LOST

# Seconds between asking the others to stop and killing them. Short: a process whose peer is
# gone can only wait inside a collective (and jax takes SIGTERM as a preemption notice).
GRACE = 1.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stream(k: int, pipe, out, lock) -> None:
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(f"[{k}] {line}\n")
            out.flush()
    pipe.close()


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def cause(failed: dict) -> int:
    """Of processes found ended with these statuses at one look (index -> status), the one to
    name: the cause, not one that ended because it lost a peer. Losing a peer ends a process
    with ``EXIT_PROCESS_LOST`` (its watchdog) or, inside a collective, by SIGABRT (gloo's
    C++ error aborts it within milliseconds of the peer's death, so both can be seen ended at
    the same look); either is named only when nothing else ended."""

    def consequence(code):
        return 2 if code == EXIT_PROCESS_LOST else 1 if code == -signal.SIGABRT else 0

    return min(failed, key=lambda k: (consequence(failed[k]), k))


def _stop(procs, survivors) -> None:
    """SIGTERM each survivor's process group, then SIGKILL what is left after GRACE."""
    for k in survivors:
        try:
            os.killpg(procs[k].pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + GRACE
    for k in survivors:
        try:
            procs[k].wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for k in survivors:
        try:
            os.killpg(procs[k].pid, signal.SIGKILL)  # the group: nothing it started survives
        except ProcessLookupError:
            pass
        procs[k].wait()


def launch(
    nprocs: int, cpu_devices: int | None, argv: list, timeout: float | None = None, out=None
) -> int:
    """Run ``python argv...`` as ``nprocs`` processes; the launcher's exit status."""
    out = out or sys.stdout
    port = free_port()
    lock = threading.Lock()
    procs, threads = [], []
    for k in range(nprocs):
        env = dict(
            os.environ,
            IR_RUNTIME_COORDINATOR=f"127.0.0.1:{port}",
            IR_RUNTIME_NUM_PROCESSES=str(nprocs),
            IR_RUNTIME_PROCESS_ID=str(k),
            PYTHONUNBUFFERED="1",
        )
        if cpu_devices is not None:
            env["IR_RUNTIME_CPU_DEVICES"] = str(cpu_devices)
        if timeout is not None:
            env["IR_RUNTIME_TIMEOUT"] = str(timeout)
        p = subprocess.Popen(
            [sys.executable, *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, ended as a whole
        )
        procs.append(p)
        t = threading.Thread(target=_stream, args=(k, p.stdout, out, lock), daemon=True)
        t.start()
        threads.append(t)

    def say(message: str) -> None:
        with lock:
            out.write(f"ir_runtime.launch: {message}\n")
            out.flush()

    status = 0
    try:
        running = set(range(nprocs))
        while running:
            ended = {k: procs[k].poll() for k in sorted(running)}
            ended = {k: code for k, code in ended.items() if code is not None}
            running -= set(ended)
            failed = {k: code for k, code in ended.items() if code != 0}
            if failed:
                k = cause(failed)
                say(
                    f"process {k} (pid {procs[k].pid}) {_how(failed[k])}; stopping the "
                    f"{len(running)} other process(es)"
                )
                _stop(procs, sorted(running))
                running.clear()
                status = 1
            time.sleep(0.05)
    except KeyboardInterrupt:
        say("interrupted; stopping every process")
        _stop(procs, range(nprocs))
        status = 130
    for t in threads:
        t.join(timeout=5)
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ir_runtime.launch",
        description="Run a script as several processes of one SPMD run on this machine.",
    )
    parser.add_argument("--nprocs", type=int, required=True, help="how many processes")
    parser.add_argument(
        "--cpu-devices", type=int, default=None, help="virtual CPU devices per process"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds a process may stop responding before the others give up on it",
    )
    parser.add_argument("script", help="the Python script each process runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    a = parser.parse_args(argv)
    if a.nprocs < 1:
        parser.error(f"--nprocs must be at least 1, got {a.nprocs}")
    if a.cpu_devices is not None and a.cpu_devices < 1:
        parser.error(f"--cpu-devices must be at least 1, got {a.cpu_devices}")
    if a.timeout is not None and a.timeout <= 0:
        parser.error(f"--timeout must be positive, got {a.timeout}")
    if not os.path.isfile(a.script):
        parser.error(f"no such script: {a.script}")
    return launch(a.nprocs, a.cpu_devices, [a.script, *a.args], a.timeout)


if __name__ == "__main__":
    sys.exit(main())
