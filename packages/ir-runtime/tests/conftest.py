import os
import sys
from pathlib import Path

import pytest

import ir_runtime
from ir_runtime import _check, _lower

sys.path.insert(0, os.path.dirname(__file__))

# Every graph a test compiles is checked against the IR dialect first (on a cache miss), here
# and in the processes tests start; IR_RUNTIME_CHECK=0 turns it off.
_check.ALWAYS[0] = os.environ.setdefault("IR_RUNTIME_CHECK", "1") != "0"

# Eight virtual CPU devices for every test in this process.
ir_runtime.init(cpu_devices=8)

# Every op whose lowering rule was looked up in this session, in every worker (pytest-xdist's
# workers send theirs when they finish), and the test modules that ran.
LOWERED: set = set()
MODULES: set = set()
DESELECTED = [0]
WORKER_DIED = [False]  # (a worker that crashed sent nothing: the run is not whole)


@pytest.fixture(scope="session", autouse=True)
def _record_lowered_rules():
    rule_for = _lower.rule_for

    def recording(op):
        LOWERED.add(op)
        return rule_for(op)

    _lower.rule_for = recording
    yield
    _lower.rule_for = rule_for


@pytest.fixture(scope="module", autouse=True)
def _one_device_order():
    """After a module whose meshes used two device orders, ops stop being checked for them
    (each op then goes through Python): the modules after it run as a process of one mesh."""
    yield
    from ir_runtime import _placement
    from ir_runtime._frontend.recording import _fast

    _placement.ORDERS.clear()
    _fast.check_devices(None)


def pytest_collection_modifyitems(items):
    MODULES.update(Path(str(item.fspath)).stem for item in items)


def pytest_deselected(items):
    DESELECTED[0] += len(items)


# -- What a whole run checks at its end, over every worker's tests -------------------------------
#
# The suite runs in two processes under pytest-xdist (``nox -s runtime``: ``-n 2 --dist
# loadfile``), so what it checks over all tests is checked once every worker has finished, in
# the process that started them: each worker sends what it saw (pytest_sessionfinish), the
# starting process merges it (pytest_testnodedown), then checks and reports it. A plain
# ``pytest tests`` does the same in its one process.


OPINFO_SUITES = {
    "test_opinfo": "float32",
    "test_opinfo_bf16": "bfloat16",
    "test_opinfo_other_dtypes": "ops without float32, in their own dtype",
    "test_opinfo_dynamo": "float32, torch.compile(backend='ir_runtime')",
}
_MERGED: dict = {"opinfo": {}, "coverage": None}  # (failed?, line) once the run ends
_SUMMED = ("values", "ops", "grads", "with_grads", "nearer")


def _opinfo_totals() -> dict:
    """Per OpInfo suite that ran in this process: its counts (which _merge_opinfo sums over
    workers) and what every worker has alike (samples, the known-failure list)."""
    totals = {}
    for module in OPINFO_SUITES:
        suite = sys.modules.get(module)
        if suite is None or not suite.OUTCOMES:
            continue
        outcomes = suite.OUTCOMES.values()
        with_grads = [o for o in outcomes if o.grads is not None]
        known = suite.KNOWN_FAILURES
        totals[module] = {
            "values": sum(o.values == "pass" for o in outcomes),
            "ops": len(outcomes),
            "grads": sum(o.grads == "pass" for o in with_grads),
            "with_grads": len(with_grads),
            "nearer": sum(bool(o.nearer) for o in outcomes),
            "samples": "all" if suite.SAMPLES is None else suite.SAMPLES,
            "known": len(known),
            "known_values": sum(p == "values" for p, _ in known.values()),
            "known_grads": sum(p == "gradients" for p, _ in known.values()),
        }
    return totals


def _merge_opinfo(totals: dict) -> None:
    for module, t in totals.items():
        into = _MERGED["opinfo"].setdefault(module, dict(t, **dict.fromkeys(_SUMMED, 0)))
        for key in _SUMMED:
            into[key] += t[key]


@pytest.hookimpl(optionalhook=True)  # (a hook of pytest-xdist's: absent in a plain run)
def pytest_testnodedown(node, error):
    """(pytest-xdist, in the starting process) A worker finished: merge what it saw."""
    if error is not None:
        WORKER_DIED[0] = True
    out = getattr(node, "workeroutput", None) or {}
    LOWERED.update(out.get("lowered", ()))
    MODULES.update(out.get("modules", ()))
    DESELECTED[0] = max(DESELECTED[0], out.get("deselected", 0))  # (each collects them all)
    _merge_opinfo(out.get("opinfo", {}))


def _rule_coverage(session, exitstatus) -> tuple[bool, str] | None:
    """None when the run was not the whole suite run to its end; else whether every lowering
    rule was looked up in some test. The whole suite: every module but test_opinfo_dynamo
    (whose ops are test_opinfo's too) ran, nothing deselected, no stop before the end (``-x``,
    an interrupt, a worker lost)."""
    ended = (
        exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
        and not session.shouldstop
        and not session.shouldfail
        and not WORKER_DIED[0]
    )
    if session.config.option.collectonly or "test_rule_coverage" not in MODULES:
        return None  # (a run of some files, not of the suite)
    modules = {p.stem for p in Path(__file__).parent.glob("test_*.py")} - {"test_opinfo_dynamo"}
    missing = sorted(modules - MODULES)
    if missing or DESELECTED[0] or not ended:
        why = (
            "not the whole suite"
            if not missing
            else f"no test ran in {missing}"
            if len(missing) <= 5
            else f"{len(modules) - len(missing)} of {len(modules)} modules ran"
        )
        return False, f"rule coverage: not checked ({why})"
    unchecked = sorted(set(ir_runtime.RULES) - LOWERED)
    if not unchecked:
        rules = len(ir_runtime.RULES)
        return False, f"rule coverage: each of the {rules} lowering rules ran in a test"
    return True, (
        f"rule coverage FAILED: {len(unchecked)} lowering rules run in no test (add a check "
        f"against eager, e.g. to test_rules.OUTSIDE_OPINFO): {unchecked}"
    )


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: send what it saw
        config.workeroutput["lowered"] = sorted(LOWERED)
        config.workeroutput["modules"] = sorted(MODULES)
        config.workeroutput["deselected"] = DESELECTED[0]
        config.workeroutput["opinfo"] = _opinfo_totals()
        return
    if not getattr(config.option, "numprocesses", None):  # a plain run: its own totals
        _merge_opinfo(_opinfo_totals())
    coverage = _MERGED["coverage"] = _rule_coverage(session, exitstatus)
    if coverage is not None and coverage[0] and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    """The OpInfo totals and the length of the known-failure list, for each OpInfo suite that
    ran (float32, bfloat16, the ops that take no float32); the rule coverage of a whole run."""
    if hasattr(terminalreporter.config, "workerinput"):
        return
    for module, dtype in OPINFO_SUITES.items():
        t = _MERGED["opinfo"].get(module)
        if t is None:
            continue
        terminalreporter.write_line(
            f"OpInfo ({dtype}, {t['samples']} samples): values {t['values']} / {t['ops']}, "
            f"values and gradients {t['grads']} / {t['with_grads']}; known failures: "
            f"{t['known']} ({t['known_values']} values, {t['known_grads']} gradients only)"
            + (
                f"; {t['nearer']} nearer float64 than eager where they differ"
                if t["nearer"]
                else ""
            )
        )
    if _MERGED["coverage"] is not None:
        failed, line = _MERGED["coverage"]
        terminalreporter.write_line(line, red=failed)
