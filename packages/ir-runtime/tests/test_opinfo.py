"""torch's operator suite (OpInfo) through the lazy device, values and input gradients, against
torch eager on the CPU (see ``opinfo.py``).

Every op passes, or is in ``KNOWN_FAILURES`` with the reason; a known failure must still fail,
and only by raising: a wrong value fails the run whatever the list says. The list only
shrinks: an op on it that passes fails the run until its entry is removed. The run ends with
the totals and the length of the list (``conftest.py``'s summary).

The end of a whole run checks the other direction (``conftest.py``): every lowering rule
registered runs in some test against eager, these samples or another module's.
"""

from __future__ import annotations

import os

import opinfo
import pytest
from opinfo_known_failures import ALL_SAMPLES_FAILURES, KNOWN_FAILURES

# The first three samples of each op, as the coverage figures are measured (and CI runs);
# IR_RUNTIME_OPINFO_SAMPLES=all runs every sample (``nox -s opinfo_all``): op_db's later
# samples carry the keyword arguments the first ones lack.
SAMPLES = os.environ.get("IR_RUNTIME_OPINFO_SAMPLES", "3")
if SAMPLES == "all":
    KNOWN_FAILURES = {**KNOWN_FAILURES, **ALL_SAMPLES_FAILURES}
else:
    SAMPLES = int(SAMPLES)

OPS = opinfo.population()
OUTCOMES: dict = {}  # op id -> Outcome, for the run's summary


@pytest.mark.parametrize("op", OPS, ids=opinfo.op_id)
def test_op_matches_eager(op):
    name = opinfo.op_id(op)
    outcome = OUTCOMES[name] = opinfo.check(op, None if SAMPLES == "all" else SAMPLES)
    opinfo.judge(name, outcome, KNOWN_FAILURES.get(name), "KNOWN_FAILURES")


def test_known_failures_name_real_ops():
    ids = {opinfo.op_id(op) for op in OPS}
    every = {**KNOWN_FAILURES, **ALL_SAMPLES_FAILURES}
    assert set(every) <= ids, sorted(set(every) - ids)
    for name, (part, reason) in every.items():
        assert part in ("values", "gradients") and reason, name
