"""torch's operator suite (OpInfo) through ``torch.compile(backend="ir_runtime")``, one sample
per op (values and input gradients) against torch eager (see ``opinfo_dynamo.py``). Every op
passes or is in ``KNOWN_FAILURES`` with the reason, as in ``test_opinfo.py``; a wrong value
fails the run whatever the list says. Its own nox session (``nox -s opinfo_dynamo``)."""

from __future__ import annotations

import opinfo
import opinfo_dynamo
import pytest
from opinfo_known_failures import KNOWN_FAILURES as LAZY_FAILURES

KNOWN_FAILURES = {"chalf": LAZY_FAILURES["chalf"]}
SAMPLES = 1
OPS = opinfo.population()
OUTCOMES: dict = {}  # op id -> Outcome, for the run's summary


@pytest.mark.parametrize("op", OPS, ids=opinfo.op_id)
def test_op_through_torch_compile_matches_eager(op):
    name = opinfo.op_id(op)
    outcome = OUTCOMES[name] = opinfo_dynamo.check(op)
    opinfo.judge(name, outcome, KNOWN_FAILURES.get(name), "KNOWN_FAILURES")
