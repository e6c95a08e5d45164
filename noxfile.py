"""One session per package, plus integration, lint, bench and demo.

Every test session installs the packages it needs into a fresh virtualenv, as wheels built from
source (ir-core's and ir-runtime's Cython through their PEP 517 builds) once per nox run, and
runs their tests against the installed code, never the source tree. Bare ``nox`` runs lint and
every test session.
"""

import glob
import os
import shutil
import tempfile

import nox

# What bare ``nox`` (and CI) runs; torch_xla's suite runs inside ``integration`` and the OpInfo
# suite through torch.compile inside ``runtime`` (one install for both). Not default, for CI's
# time: ``integration_transformers4`` (the Hugging Face models on the older transformers line),
# ``opinfo_all``, ``torch_xla_suite_training``.
nox.options.sessions = ["lint", "core", "sharding", "runtime", "integration"]
nox.options.error_on_external_run = True

CORE = "packages/ir-core"
SHARDING = "packages/ir-sharding"
RUNTIME = "packages/ir-runtime"
# The CPU wheel of torch on this machine's disk; an unpinned torch pulls a multi-GB CUDA build.
TORCH = "torch==2.13.0"
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100"]
# Real models for the integration suite, built from small configs (no weights downloaded):
# transformers 5, what a new user gets; the 4.57 line through its own, smaller session.
TRANSFORMERS = "transformers>=5.25,<5.26"
TRANSFORMERS_4 = "transformers>=4.57,<4.58"


# Each package is built once per nox run, from the source as it is at that run's first session
# that needs it, into a wheel every later session installs: ir-core's and ir-runtime's Cython
# take about half a minute each to build, and up to five sessions install them. Each run builds
# into a directory of its own, so a wheel of an earlier run is never installed.
_WHEELS: dict = {}  # package name -> its wheel built in this run
_RUN_DIR: list = []  # this run's wheel directory
_PACKAGES = {"ir-core": CORE, "ir-sharding": SHARDING, "ir-runtime": RUNTIME}


def _wheels_dir(session) -> str:
    if not _RUN_DIR:
        root = os.path.abspath(os.path.join(session.cache_dir, "wheels"))
        shutil.rmtree(root, ignore_errors=True)  # (earlier runs' wheels)
        os.makedirs(root)
        _RUN_DIR.append(tempfile.mkdtemp(dir=root))
    return _RUN_DIR[0]


def _pkg(session, name: str, extras: str = "") -> str:
    """The wheel of package ``name`` built in this run (built now if it is the first to ask),
    with ``extras`` (``"test"``) as pip reads them after a path."""
    wheel = _WHEELS.get(name)
    if wheel is None:
        out = os.path.join(_wheels_dir(session), name)
        session.run(
            "python", "-m", "pip", "wheel", "-q", "--no-deps", f"./{_PACKAGES[name]}", "-w", out
        )
        (wheel,) = glob.glob(os.path.join(out, "*.whl"))
        _WHEELS[name] = wheel
    return f"{wheel}[{extras}]" if extras else wheel


def _install(session, *requirements) -> None:
    """``pip install`` the requirements, then this run's wheels among them once more, alone:
    pip keeps an installed package of the same version, so an environment reused (``nox -r``)
    would otherwise test an earlier run's build."""
    session.install(*requirements)
    ours = [r.split("[")[0] for r in requirements if r.startswith(_wheels_dir(session))]
    if ours:
        session.run("python", "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", *ours)


def _ours(session, runtime: str = "", sharding: str = "") -> list:
    """The three packages' wheels, ir-runtime's and ir-sharding's with these extras."""
    return [
        _pkg(session, "ir-core"),
        _pkg(session, "ir-sharding", sharding),
        _pkg(session, "ir-runtime", runtime),
    ]


def _workers(dist: str = "loadfile") -> list:
    """pytest-xdist's arguments: the larger suites run in two or more worker processes (up to
    4, one per core), whole files to a worker (``dist``: or test by test, for one large file).
    XLA compiles most of their time, each program on one core: two workers took ir-runtime's
    suite from 1,281 to 898 s on a 2-core machine, the integration suite from 512 to 401 s.
    ``-n 0`` among a session's arguments runs them in one process."""
    n = min(4, len(os.sched_getaffinity(0)))
    return ["-n", str(n), "--dist", dist] if n > 1 else []


def _pytest(session, package, *args):
    """pytest on the package's tests, or on the files its arguments name (``nox -s runtime --
    tests/test_cache.py``)."""
    session.chdir(package)
    named = any(a.startswith("tests") and os.path.exists(a.split("::")[0]) for a in session.posargs)
    session.run("pytest", *([] if named else ["tests"]), *args, *session.posargs)


@nox.session
def core(session):
    """ir-core alone: no numpy, jax or torch."""
    _install(session, _pkg(session, "ir-core", "test"))
    _pytest(session, CORE)


@nox.session
def sharding(session):
    _install(session, _pkg(session, "ir-core"), _pkg(session, "ir-sharding", "test"))
    _pytest(session, SHARDING)


@nox.session
def runtime(session):
    """ir-runtime's tests, then (without arguments, which narrow the first run only)
    ``opinfo_dynamo``'s in a process of their own, in the same environment."""
    _install(session, *_ours(session, "test"), TORCH)
    _pytest(session, RUNTIME, *_workers(), "--ignore=tests/test_opinfo_dynamo.py")
    if not session.posargs:
        session.run("pytest", *_workers("load"), "tests/test_opinfo_dynamo.py")


@nox.session
def opinfo_dynamo(session):
    """torch's OpInfo suite through torch.compile(backend="ir_runtime"): one sample per op,
    values and gradients against eager (Dynamo and AOTAutograd per op: a process of its own;
    ``runtime`` runs it too)."""
    _install(session, *_ours(session, "test"), TORCH)
    session.chdir(RUNTIME)
    session.run("pytest", *_workers("load"), "tests/test_opinfo_dynamo.py", *session.posargs)


@nox.session
def opinfo_all(session):
    """torch's OpInfo suite over every sample of every op (slow: not a default session).

    CI runs the first three samples; the later ones carry the keyword arguments the first ones
    lack. Prints the totals; narrow it with pytest's arguments: ``nox -s opinfo_all -- -k conv``.
    """
    _install(session, *_ours(session, "test"), TORCH)
    session.chdir(RUNTIME)
    session.run(
        "pytest",
        "tests/test_opinfo.py",
        *session.posargs,
        env={"IR_RUNTIME_OPINFO_SAMPLES": "all"},
    )


# torch_xla 2.9's SPMD suite, vendored unchanged (integration_tests/torch_xla_suite): the 13
# files the torch_xla compatibility layer is measured against.
TORCH_XLA_SUITE = [
    f"integration_tests/torch_xla_suite/test/spmd/{name}.py"
    for name in (
        "test_xla_sharding",
        "test_xla_sharded_tensor",
        "test_spmd_debugging",
        "test_xla_spmd_python_api_interaction",
        "test_fsdp_v2",
        "test_mp_input_sharding",
        "test_xla_virtual_device",
        "test_train_spmd_linear_model",
        "test_spmd_graph_dump",
        "test_xla_dtensor_placements",
        "test_dtensor_integration",
        "test_dtensor_integration2",
        "test_xla_dtensor_spec_conversion",
    )
]


# Trains a 141M-parameter model (16834 -> 8417 -> 3) five times: its own session, as CI's two
# cores would spend most of a quarter hour on it.
TORCH_XLA_TRAINING = "integration_tests/torch_xla_suite/test/spmd/test_train_spmd_linear_model.py"
_TORCH_XLA_PYTEST = (
    "python",
    "-m",
    "ir_runtime.torch_xla",
    "-m",
    "pytest",
    "-p",
    "no:cacheprovider",
)


@nox.session
def torch_xla_suite(session):
    """torch_xla's own SPMD tests, unchanged, through ``python -m ir_runtime.torch_xla`` on 8
    CPU devices: every test passes, skips as on torch_xla's CPU CI, or is a listed known
    failure (``integration_tests/torch_xla_suite/conftest.py`` prints them by category). The
    graph-dump test runs apart, with the environment torch_xla's CI gives it; the linear-model
    training file in ``torch_xla_suite_training``. ``integration`` runs it too."""
    _install(session, *_ours(session, "test"), TORCH, "rich")
    _torch_xla_suite(session)


def _torch_xla_suite(session):
    dump = "integration_tests/torch_xla_suite/test/spmd/test_spmd_graph_dump.py"
    rest = [f for f in TORCH_XLA_SUITE if f not in (dump, TORCH_XLA_TRAINING)]
    session.run(*_TORCH_XLA_PYTEST, "-q", *rest, *session.posargs, env={"CPU_NUM_DEVICES": "8"})
    graphs = os.path.join(session.create_tmp(), "graphs.txt")
    env = {"CPU_NUM_DEVICES": "8", "XLA_SAVE_TENSORS_FILE": graphs, "XLA_SAVE_TENSORS_FMT": "text"}
    session.run(*_TORCH_XLA_PYTEST, "-q", dump, env=env)


@nox.session
def torch_xla_suite_training(session):
    """The 13th file of torch_xla's suite, ``test_train_spmd_linear_model.py`` (baseline,
    gradient checkpointing and gradient accumulation of a 141M-parameter model agree): not a
    default session, for CI's time."""
    _install(session, *_ours(session, "test"), TORCH)
    session.run(*_TORCH_XLA_PYTEST, "-q", TORCH_XLA_TRAINING, env={"CPU_NUM_DEVICES": "8"})


@nox.session
def integration(session):
    """The cross-package suite on transformers 5, then torch_xla's SPMD suite
    (``torch_xla_suite``) in the same environment."""
    _install(
        session,
        *_ours(session, "checkpoint,test"),
        TORCH,
        "packaging",
        "rich",
        TRANSFORMERS,
        *TEST_DEPS,
    )
    session.run("pytest", *_workers(), "integration_tests", *session.posargs)
    if not session.posargs:  # (arguments narrow the cross-package suite only)
        _torch_xla_suite(session)


@nox.session
def integration_transformers4(session):
    """The Hugging Face parts of the integration suite on transformers 4.57: training every
    model under compile_step, and generation (not a default session: new users get 5)."""
    _install(
        session,
        *_ours(session, "checkpoint"),
        TORCH,
        TRANSFORMERS_4,
        *TEST_DEPS,
    )
    session.run(
        "pytest",
        "integration_tests/test_transformers_train.py",
        "integration_tests/test_generate.py",
        *session.posargs,
    )


@nox.session
def lint(session):
    session.install("ruff>=0.6", "cython-lint>=0.16")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    pyx = [
        f"{CORE}/src/ir_core/{name}"
        for name in ("_nodes.pyx", "_nodes.pxd", "_graph.pyx", "_canon.pxd")
    ] + [
        f"{CORE}/bench/floor.pyx",
        f"{RUNTIME}/src/ir_runtime/_launch.pyx",
        f"{RUNTIME}/src/ir_runtime/_frontend/recording/_fast.pyx",
        f"{RUNTIME}/src/ir_runtime/_frontend/steps/_hot.pyx",
        f"{RUNTIME}/src/ir_runtime/_lowering/_ffi.pyx",
    ]
    session.run("cython-lint", "--max-line-length", "100", *pyx)


@nox.session
def bench(session):
    """Benchmarks side by side with their peers; a table on stdout, JSON under .bench/."""
    _install(
        session,
        *_ours(session, "checkpoint", sharding="jax"),
        TORCH,
        "xxhash>=3.4",
        TRANSFORMERS,
        "cython>=3.0.10",  # bench_core's floor row builds floor.pyx
    )
    session.run("python", f"{CORE}/bench/bench_core.py", "--json", ".bench/ir-core.json")
    session.run(
        "python", f"{SHARDING}/bench/bench_sharding.py", "--json", ".bench/ir-sharding.json"
    )
    for name, out in (
        ("bench_runtime", "ir-runtime"),
        ("bench_frontend", "ir-frontend"),
        ("bench_multiprocess", "ir-multiprocess"),
        ("bench_models", "ir-models"),
        ("bench_memory", "ir-memory"),
        ("bench_checkpoints", "ir-checkpoints"),
        ("bench_manual", "ir-manual"),
        ("bench_torch_xla", "ir-torch-xla"),
        ("bench_cpu_llama", "ir-cpu-llama"),
    ):
        session.run("python", f"{RUNTIME}/bench/{name}.py", "--json", f".bench/{out}.json")


@nox.session
def demo(session):
    """The main job (see README.md): a small Llama learns Python's help texts, placed 2-D with
    PyTorch's own APIs over 8 CPU devices, checkpointed and resumed, next to torch eager."""
    _install(session, *_ours(session, "checkpoint"), TORCH, TRANSFORMERS, "tqdm>=4.66")
    session.run("python", "demo.py", *session.posargs)
