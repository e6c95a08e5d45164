"""torch's operator suite (OpInfo) through the lazy device, values and input gradients, against
torch eager on the CPU (see ``opinfo.py``).

Every op passes, or is in ``KNOWN_FAILURES`` with the reason; a known failure must still fail,
and only by raising: a wrong value fails the run whatever the list says. The list only
shrinks: an op on it that passes fails the run until its entry is removed. The run ends with
the totals and the length of the list (``conftest.py``'s summary).

``test_rule_coverage.py`` checks the other direction: every lowering rule registered runs in
some test against eager, these samples or another module's.
"""

from __future__ import annotations

import opinfo
import pytest
from opinfo_known_failures import KNOWN_FAILURES

SAMPLES = 3  # the first three samples of each op, as the coverage figures are measured

OPS = opinfo.population()
OUTCOMES: dict = {}  # op id -> Outcome, for the run's summary


@pytest.mark.parametrize("op", OPS, ids=opinfo.op_id)
def test_op_matches_eager(op):
    name = opinfo.op_id(op)
    outcome = OUTCOMES[name] = opinfo.check(op, SAMPLES)
    assert "wrong" not in (outcome.values, outcome.grads), f"{name}: {outcome.detail}"
    passed = outcome.values == "pass" and outcome.grads in ("pass", None)
    known = KNOWN_FAILURES.get(name)
    if known is None:
        assert passed, f"{name} ({outcome.values}, gradients {outcome.grads}): {outcome.detail}"
        return
    part, reason = known
    assert not passed, f"{name} passes now: remove it from KNOWN_FAILURES ({reason})"
    if part == "gradients":
        assert outcome.values == "pass", f"{name}'s values fail too: {outcome.detail}"


def test_known_failures_name_real_ops():
    ids = {opinfo.op_id(op) for op in OPS}
    assert set(KNOWN_FAILURES) <= ids, sorted(set(KNOWN_FAILURES) - ids)
    for name, (part, reason) in KNOWN_FAILURES.items():
        assert part in ("values", "gradients") and reason, name
