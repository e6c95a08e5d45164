"""XLA's options per program: a CPU program whose every value is small splits its temporaries
into blocks that glibc's heap serves again run after run, instead of one block the kernel maps
and zero-fills afresh on every run."""

import os
import platform
import resource
import subprocess
import sys

import jax
import numpy as np
import pytest
from models import f32, op

import ir_runtime as irt
from ir_core import Shape, Value
from ir_runtime import _executable
from ir_runtime._graph import Graph

N = 1024  # a 4 MiB float32 matrix


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(_executable, "_XLA_FLAGS", "")  # (as if the user's named no option)
    irt.CACHE.clear()
    yield
    irt.CACHE.clear()


def _thp_always() -> bool:
    """Whether the kernel backs large mappings with huge pages unasked (then a block mapped
    afresh faults in 2 MiB at a time, and faults do not count its pages)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def chain(n=N, links=16):
    """A product of ``links`` matrix powers of a matrix, every power still needed at the end:
    XLA keeps them all at once, about 60 MiB of temporaries in values of 4 MiB."""
    rng = np.random.default_rng(0)
    x = Value(irt.to_device(rng.random((n, n), np.float32) / n))
    w = Value(irt.to_device(rng.random((n, n), np.float32) / n))
    ys = [x]
    for _ in range(links):
        ys.append(op("aten::mm.default", ys[-1], w, shape=f32(n, n)))
    out = ys[1]
    for y in ys[2:]:
        out = op(
            "aten::mul.Tensor", out, op("aten::tanh.default", y, shape=f32(n, n)), shape=f32(n, n)
        )
    return out


def test_a_program_of_small_values_gets_the_bound_and_a_large_value_takes_it_away(monkeypatch):
    small = Graph([chain(n=64, links=2)])
    assert _executable.compiler_options(small) == {
        "xla_multiheap_size_constraint_per_heap": _executable.CPU_HEAP_BYTES
    }
    # One value over the bound: XLA would give it a block of its own that nothing shares.
    big = 2048  # 2048 x 2048 float32: exactly 16 MiB, at the bound; one more row is over it
    assert _executable.compiler_options(Graph([chain(n=big, links=1)])) != {}
    x = Value(irt.to_device(np.ones((big + 1, big), np.float32)))
    over = Graph([op("aten::neg.default", x, shape=f32(big + 1, big))])
    assert _executable.compiler_options(over) == {}
    # bfloat16 counts as float32, the precision its ops compute in: 8 MiB of it is at the bound.
    h = Value(irt.to_device(np.ones((big, big), np.float32)))
    half = Shape("bfloat16", (big, big))
    at = Graph([op("aten::_to_copy.default", h, shape=half, dtype="bfloat16")])
    assert _executable.compiler_options(at) != {}
    h = Value(irt.to_device(np.ones((big + 1, big), np.float32)))
    half = Shape("bfloat16", (big + 1, big))
    past = Graph([op("aten::_to_copy.default", h, shape=half, dtype="bfloat16")])
    assert _executable.compiler_options(past) == {}
    # An op whose lowering makes values the graph does not show (attention's logits).
    s = f32(1, 1, 8, 8)
    q = Value(irt.to_device(np.ones((1, 1, 8, 8), np.float32)))
    hidden = Graph([op("ir::attention", q, q, q, shape=s)])
    assert _executable.compiler_options(hidden) == {}
    # A user's XLA_FLAGS naming the option wins.
    monkeypatch.setattr(_executable, "_XLA_FLAGS", "--xla_multiheap_size_constraint_per_heap=-1")
    assert _executable.compiler_options(small) == {}


def test_the_compiled_program_is_given_the_options_and_computes_the_same(monkeypatch):
    seen = []
    compile_ = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kwargs):
        seen.append(compiler_options)
        return compile_(self, compiler_options, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    root = chain(n=64, links=2)
    (out,) = irt.execute([root])
    assert seen == [_executable.compiler_options(Graph([root]))] and seen[0]
    # numpy's float64 of the same chain
    x, w = (np.asarray(v.node.handle, np.float64) for v in _leaves(root))
    y1 = x @ w
    want = y1 * np.tanh(y1 @ w)
    np.testing.assert_allclose(irt.to_host(out), want, rtol=1e-5)


def _leaves(root):
    """The chain's x and w."""
    mm = root.node.operands[0]  # y1 = x @ w
    return mm.node.operands


# glibc's thresholds held where its defaults would leave them after the first runs: blocks up
# to 32 MiB come from the heap, larger ones are mapped on their own; the heap's free top is
# kept; and one arena serves every thread. By default glibc also trims that top between runs
# when it grows past twice the largest block freed so far, and gives threads arenas of their
# own, whichever thread allocates a run's temporaries then growing its own: how many pages a
# run faults in varies with the process's history and the machine's load (in a test session
# 6,000-14,000 faults a run of this program). Fixed here, the faults left are the ones the
# split decides.
_TUNABLES = (
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
    ":glibc.malloc.arena_max=1"
)


def _faults_per_run(whole: bool, out: str, runs=3, batches=8) -> None:
    """In a process of its own: the fewest page faults per run of the program of ``chain()``
    over a few batches of runs, with its temporaries whole or split, printed; its result saved
    to ``out``."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(_executable, "_XLA_FLAGS", "")
    if whole:
        monkeypatch.setattr(_executable, "CPU_HEAP_BYTES", 0)  # (every value over it: no bound)
    root = chain()
    for _ in range(3):  # compile, then run twice: the heap has grown to what a run takes
        jax.block_until_ready(irt.execute([root])[0].handle)
    fewest = None
    for _ in range(batches):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(runs):
            (result,) = irt.execute([root])
            jax.block_until_ready(result.handle)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / runs
        fewest = faults if fewest is None else min(fewest, faults)
    np.save(out, irt.to_host(result))
    print(fewest)


def _faults_in_child(whole: bool, out) -> float:
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import test_cpu_options as t; t._faults_per_run({whole}, {str(out)!r})"
    env = dict(os.environ, GLIBC_TUNABLES=_TUNABLES)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the bound serves glibc's malloc, which maps a large block afresh on every run",
)
@pytest.mark.skipif(_thp_always(), reason="huge pages unasked: faults do not count pages")
def test_split_temporaries_are_not_mapped_afresh_on_every_run(tmp_path):
    root = chain()
    temporaries = irt.compile([root]).memory()["temporaries"]
    assert temporaries > 3 * _executable.CPU_HEAP_BYTES
    pages = temporaries / resource.getpagesize()
    whole = _faults_in_child(True, tmp_path / "whole.npy")
    split = _faults_in_child(False, tmp_path / "split.npy")
    # One block of temporaries, over glibc's largest mmap threshold: every page of it mapped
    # and faulted in again on every run.
    assert whole > 0.8 * pages, (whole, pages)
    # Split, every block comes back from the heap as it was: next to no page is faulted in
    # (none, once the heap has grown to what a run takes; the fewest of several batches).
    assert split < 0.1 * pages, (split, pages)
    # Where the temporaries live changes no value.
    np.testing.assert_array_equal(np.load(tmp_path / "split.npy"), np.load(tmp_path / "whole.npy"))
