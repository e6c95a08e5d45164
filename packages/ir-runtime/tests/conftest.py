import os
import sys

import ir_runtime

sys.path.insert(0, os.path.dirname(__file__))

# Eight virtual CPU devices for every test in this process.
ir_runtime.init(cpu_devices=8)


def pytest_terminal_summary(terminalreporter):
    """The OpInfo totals and the length of the known-failure list, when that suite ran."""
    suite = sys.modules.get("test_opinfo")
    if suite is None or not suite.OUTCOMES:
        return
    outcomes = suite.OUTCOMES.values()
    values = sum(o.values == "pass" for o in outcomes)
    with_grads = [o for o in outcomes if o.grads is not None]
    grads = sum(o.grads == "pass" for o in with_grads)
    failures = suite.KNOWN_FAILURES
    terminalreporter.write_line(
        f"OpInfo (float32, {suite.SAMPLES} samples): values {values} / {len(outcomes)}, values "
        f"and gradients {grads} / {len(with_grads)}; known failures: {len(failures)} "
        f"({sum(p == 'values' for p, _ in failures.values())} values, "
        f"{sum(p == 'gradients' for p, _ in failures.values())} gradients only)"
    )
