import os
import sys

import pytest

import ir_runtime
from ir_runtime import _check, _lower

sys.path.insert(0, os.path.dirname(__file__))

# Every graph a test compiles is checked against the IR dialect first (on a cache miss), here
# and in the processes tests start; IR_RUNTIME_CHECK=0 turns it off.
_check.ALWAYS[0] = os.environ.setdefault("IR_RUNTIME_CHECK", "1") != "0"

# Eight virtual CPU devices for every test in this process.
ir_runtime.init(cpu_devices=8)

LOWERED: set = set()  # every op whose lowering rule was looked up in this session


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
    """The rule-coverage check runs after everything else."""
    last = [item for item in items if item.fspath.basename == "test_rule_coverage.py"]
    items[:] = [item for item in items if item not in last] + last


def pytest_terminal_summary(terminalreporter):
    """The OpInfo totals and the length of the known-failure list, for each OpInfo suite that
    ran (float32, bfloat16, the ops that take no float32)."""
    for module, dtype, failures in (
        ("test_opinfo", "float32", "KNOWN_FAILURES"),
        ("test_opinfo_bf16", "bfloat16", "KNOWN_FAILURES"),
        ("test_opinfo_other_dtypes", "ops without float32, in their own dtype", "KNOWN_FAILURES"),
        ("test_opinfo_dynamo", "float32, torch.compile(backend='ir_runtime')", "KNOWN_FAILURES"),
    ):
        suite = sys.modules.get(module)
        if suite is None or not suite.OUTCOMES:
            continue
        outcomes = suite.OUTCOMES.values()
        values = sum(o.values == "pass" for o in outcomes)
        with_grads = [o for o in outcomes if o.grads is not None]
        grads = sum(o.grads == "pass" for o in with_grads)
        known = getattr(suite, failures)
        samples = "all" if suite.SAMPLES is None else suite.SAMPLES
        nearer = sum(bool(o.nearer) for o in outcomes)
        terminalreporter.write_line(
            f"OpInfo ({dtype}, {samples} samples): values {values} / {len(outcomes)}, values "
            f"and gradients {grads} / {len(with_grads)}; known failures: {len(known)} "
            f"({sum(p == 'values' for p, _ in known.values())} values, "
            f"{sum(p == 'gradients' for p, _ in known.values())} gradients only)"
            + (f"; {nearer} nearer float64 than eager where they differ" if nearer else "")
        )
