"""Several processes, one SPMD program: jax.distributed, and a watchdog for lost processes.

Every process calls ``init`` with the same coordinator address and process count and its own id.
jax's distributed runtime connects them (gloo carries the collectives on CPU, NCCL on GPU); the
devices of all processes form one global list, and a mesh's device ids index it.

A collective waits for every process. If one dies or freezes, the others would wait inside XLA
forever, where no Python exception can reach them. So each process runs a watchdog thread: it
publishes a heartbeat (a counter, the number of programs this process has launched, and whether
it has finished) in the coordination service's key-value store, and reads everyone else's. A
process whose heartbeat stops changing for ``timeout`` seconds is named in an error on stderr,
and this process exits with ``EXIT_PROCESS_LOST``: it cannot take part in another collective.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import time

import jax

from ir_runtime._errors import DistributedError, ExecutionError, OutOfMemoryError
from ir_runtime._jaxapi import distributed_client

ENV_COORDINATOR = "IR_RUNTIME_COORDINATOR"
ENV_NUM_PROCESSES = "IR_RUNTIME_NUM_PROCESSES"
ENV_PROCESS_ID = "IR_RUNTIME_PROCESS_ID"
ENV_TIMEOUT = "IR_RUNTIME_TIMEOUT"
DEFAULT_TIMEOUT = 30.0  # seconds a process may go silent before the others give it up
EXIT_PROCESS_LOST = 3  # exit status of a process that ended because another one was lost
_KEY = "ir_runtime/alive/"


class _State:
    address: str | None = None
    num_processes = 1
    process_id = 0
    launched = 0  # programs this process has launched: every process runs the same sequence
    failed = False  # an uncaught exception is ending this process
    watchdog: _Watchdog | None = None


STATE = _State()


def env_value(name: str, convert, error, what: str):
    """``convert`` of environment variable ``name``; None when it is unset or empty."""
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        return convert(raw)
    except ValueError:
        raise error(f"{name}={raw!r} is not {what}") from None


def resolve(coordinator_address, num_processes, process_id, timeout):
    """The arguments, each from the environment where not given, checked; None when this is one
    process on its own."""
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = env_value(ENV_NUM_PROCESSES, int, DistributedError, "an integer")
    if process_id is None:
        process_id = env_value(ENV_PROCESS_ID, int, DistributedError, "an integer")
    if timeout is None:
        timeout = env_value(ENV_TIMEOUT, float, DistributedError, "a number of seconds")
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    if all(v is None for v in given.values()):
        return None
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise DistributedError(
            f"several processes need coordinator_address, num_processes and process_id together "
            f"(or {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}); missing: "
            f"{', '.join(missing)}"
        )
    if not isinstance(coordinator_address, str) or not re.fullmatch(
        r"\[?[\w.:-]+\]?:\d{1,5}", coordinator_address
    ):
        raise DistributedError(
            f"coordinator_address must be 'host:port', got {coordinator_address!r}"
        )
    for name, value in (("num_processes", num_processes), ("process_id", process_id)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise DistributedError(f"{name} must be an int, got {value!r}")
    if num_processes < 1:
        raise DistributedError(f"num_processes must be at least 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise DistributedError(
            f"process_id must be in 0..{num_processes - 1} for {num_processes} processes, "
            f"got {process_id}"
        )
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise DistributedError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return coordinator_address, num_processes, process_id, float(timeout)


def start(coordinator_address: str, num_processes: int, process_id: int, timeout: float):
    """Join the other processes through jax.distributed; start the watchdog."""
    if STATE.address is not None:
        if (STATE.address, STATE.num_processes, STATE.process_id) != (
            coordinator_address,
            num_processes,
            process_id,
        ):
            raise DistributedError(
                f"this process already joined {STATE.address} as process {STATE.process_id} of "
                f"{STATE.num_processes}; it cannot join {coordinator_address} as process "
                f"{process_id} of {num_processes}"
            )
        return
    # gloo carries collectives between processes on CPU (jax's default in 0.10; set it anyway,
    # since without an implementation cross-process programs fail).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=int(max(60, timeout)),
        # jax's own heartbeat is the backstop: it aborts the process, naming the task, only
        # if the watchdog below has not ended it first.
        heartbeat_timeout_seconds=int(2 * timeout + 10),
    )
    STATE.address, STATE.num_processes, STATE.process_id = (
        coordinator_address,
        num_processes,
        process_id,
    )
    if num_processes > 1:
        STATE.watchdog = _Watchdog(timeout)
        STATE.watchdog.start()
        atexit.register(_finish)
        global _previous_excepthook
        _previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook


def process_index() -> int:
    """This process's id among the processes of the run (0 when on its own)."""
    return jax.process_index()


def process_count() -> int:
    """How many processes take part in the run (1 when on its own)."""
    return jax.process_count()


def device_failure(e: Exception, what: str) -> ExecutionError | OutOfMemoryError:
    """The error for ``what`` failing on the devices. Across processes the usual cause is a lost
    process, which gloo reports at once as a reset connection naming only an address: the
    watchdog gets its timeout to name the process (which ends this one). If every process stays
    alive, the failure is the program's own."""
    w = STATE.watchdog
    if w is not None and not w.stop:
        deadline = time.monotonic() + w.timeout + 4 * w.interval
        while time.monotonic() < deadline:
            time.sleep(w.interval)
    if "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower():
        return OutOfMemoryError(f"{what} ran out of device memory: {type(e).__name__}: {e}")
    return ExecutionError(f"{what} failed on the device: {type(e).__name__}: {e}")


def fatal(message: str) -> None:
    """Report ``message`` and end this process at once: it waits inside a collective that can
    never finish, where nothing else can reach it."""
    try:
        sys.stdout.flush()
    finally:
        sys.stderr.write(f"ir_runtime: error: {message}; ending process {STATE.process_id}\n")
        sys.stderr.flush()
        os._exit(EXIT_PROCESS_LOST)


def _finish() -> None:
    """At exit: say so, so the others do not count this process's silence as a loss, then wait
    in jax's shutdown barrier for them (the watchdog still guards that wait). After an uncaught
    exception, leave at once instead: the others may wait inside a collective for this process,
    and their watchdogs name it when its heartbeat stops."""
    w = STATE.watchdog
    if w is None:
        return
    if STATE.failed:
        sys.stdout.flush()
        sys.stderr.write(
            f"ir_runtime: process {STATE.process_id} ended with an uncaught exception; leaving "
            f"without waiting for the other processes\n"
        )
        sys.stderr.flush()
        os._exit(1)
    w.done = True
    w.beat_once()
    jax.distributed.shutdown()
    w.stop = True


def _excepthook(kind, value, traceback) -> None:
    STATE.failed = True
    _previous_excepthook(kind, value, traceback)


_previous_excepthook = sys.excepthook


class _Watchdog:
    """Heartbeats through the coordination service; ends the process when another one is lost."""

    def __init__(self, timeout: float):
        self.client = distributed_client()
        self.timeout = timeout
        self.interval = min(0.5, timeout / 10)
        self.me = STATE.process_id
        self.n = 0
        self.done = False
        self.stop = False
        self.last_ok = time.monotonic()  # the last heartbeat the coordinator took
        self.seen: dict = {}  # process -> (its last heartbeat count, when it last changed)
        self.progress: dict = {}  # process -> (programs it launched, when that last changed)

    def start(self) -> None:
        threading.Thread(target=self._beat, name="ir_runtime-heartbeat", daemon=True).start()
        threading.Thread(target=self._timer, name="ir_runtime-watchdog", daemon=True).start()

    def beat_once(self) -> None:
        self.n += 1
        state = "done" if self.done else "run"
        self.client.key_value_set(
            f"{_KEY}{self.me}", f"{self.n}:{STATE.launched}:{state}", allow_overwrite=True
        )
        self.last_ok = time.monotonic()

    def _beat(self) -> None:
        start = time.monotonic()
        while not self.stop:
            try:
                self.beat_once()
                entries = dict(self.client.key_value_dir_get(_KEY))
            except Exception:  # the coordinator is gone or slow: _timer decides
                entries = None
            now = time.monotonic()
            if entries is not None:
                for p in range(STATE.num_processes):
                    if p != self.me:
                        self._check(p, entries.get(f"{_KEY}{p}"), now, start)
            time.sleep(self.interval)

    def _check(self, p: int, value, now: float, start: float) -> None:
        """Give up on process ``p`` when its heartbeat (``count:launched:state``) has stopped,
        or, once this process has finished, when ``p`` waits for a program it never will."""
        if value is None:
            if now - start > self.timeout:
                fatal(f"process {p} never reported to the coordinator within {now - start:.0f} s")
            return
        beat, launched, state = value.split(":")
        last = self.seen.get(p)
        if last is None or last[0] != beat:
            self.seen[p] = (beat, now)
        elif state != "done" and now - last[1] > self.timeout:
            fatal(
                f"process {p} stopped responding: no heartbeat for {now - last[1]:.0f} s (it "
                f"died, hung or was stopped; at its last heartbeat it had launched {launched} "
                f"programs, this process {STATE.launched})"
            )
        progress = self.progress.get(p)
        if progress is None or progress[0] != launched:
            self.progress[p] = (launched, now)
        elif (
            self.done
            and state != "done"
            and int(launched) > STATE.launched
            and now - progress[1] > self.timeout
        ):
            # Collectives finish only with every process, so p waits inside program
            # number `launched`, which this finished process never launches.
            fatal(
                f"process {p} has waited {now - progress[1]:.0f} s inside its program "
                f"{launched}, but this process finished after {STATE.launched}: every process "
                f"must run the same steps"
            )

    def _timer(self) -> None:
        # Makes no calls of its own, so it fires even when a call to a frozen coordinator blocks.
        while not self.stop:
            time.sleep(self.interval)
            silent = time.monotonic() - self.last_ok
            if silent > self.timeout and not self.stop:
                fatal(
                    f"lost the coordinator (process 0 at {STATE.address}): no answer for "
                    f"{silent:.0f} s"
                )
