import os
import sys
import tempfile

import pytest

import ir_runtime
from ir_runtime import _check
from ir_runtime import torch_xla as _torch_xla

# torch_xla's own suite (vendored under torch_xla_suite/) imports torch_xla: it is collected only
# in a process the torch_xla layer serves (``python -m ir_runtime.torch_xla -m pytest
# integration_tests/torch_xla_suite``, which ``nox -s torch_xla_suite`` runs).
collect_ignore = [] if _torch_xla.installed() else ["torch_xla_suite"]

# Every graph a test compiles is checked against the IR dialect first (on a cache miss), here
# and in the processes tests start; IR_RUNTIME_CHECK=0 turns it off.
_check.ALWAYS[0] = os.environ.setdefault("IR_RUNTIME_CHECK", "1") != "0"

# Eight virtual CPU devices for every integration test.
ir_runtime.init(cpu_devices=8)


# -- XLA's partitioner, watched -----------------------------------------------------------------
#
# When XLA's SPMD partitioner cannot move a value from one placement to another directly, it
# replicates the whole value on every device and partitions it again, and says so only in its
# C++ log ("Involuntary full rematerialization"), on file descriptor 2. No test of this suite
# may make it (but torch_xla's vendored suite): every sharded model here is placed so that the
# partitioner never falls back.
# (jax's own program for the 1 GiB GPT of bench_memory.py, FSDP over 8 devices, does, at its
# embedding's gradient; ours reads that gradient's ids whole: ``_rewrite._ids_whole``.)

REMATERIALIZED = "Involuntary full rematerialization"
# The runtime bounds a CPU program's blocks of temporaries only when every value of its graph
# fits in the bound; XLA warns of a buffer over it (one the graph did not show).
OVER_THE_BOUND = "larger than the per-heap size limit"
WATCHED = {
    REMATERIALIZED: "XLA's partitioner rematerialized a value in full {n} time(s) during this "
    "test (a placement it cannot reach efficiently)",
    OVER_THE_BOUND: "XLA found {n} buffer(s) over the bound on a CPU program's blocks of "
    "temporaries during this test (a value the graph did not show)",
}


class StderrAtFd:
    """What the process writes to file descriptor 2 while it is open (C++ logging included),
    in ``text`` once closed; written on to the stderr it replaced, so nothing is lost."""

    def __enter__(self):
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        self.text = ""
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        raw = self._file.read()
        self._file.close()
        os.write(2, raw)
        self.text = raw.decode(errors="replace")
        return False


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "rematerializes: the test makes XLA rematerialize a value in full, on purpose"
    )


def _watched(item):
    """Runs a test phase with its file descriptor 2 read (inside pytest's own capture, which
    takes the descriptor back at each phase), and fails the test if XLA logged what ``WATCHED``
    names meanwhile."""
    reads_fd = {"capfd", "capfdbinary"} & set(getattr(item, "fixturenames", ()))
    if "torch_xla_suite" in item.path.parts or reads_fd:
        # (torch_xla's own suite, which reshards on purpose between any two placements; a test
        # reading descriptor 2 itself, which the watch would take from it)
        return (yield)
    watched = dict(WATCHED)
    if item.get_closest_marker("rematerializes"):  # (the test that shows the watch works)
        del watched[REMATERIALIZED]
    with StderrAtFd() as err:
        result = yield
    for needle, what in watched.items():
        lines = [line for line in err.text.splitlines() if needle in line]
        if lines:
            raise AssertionError(what.format(n=len(lines)) + f"; the first:\n{lines[0]}")
    return result


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item):
    return (yield from _watched(item))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item):
    return (yield from _watched(item))
