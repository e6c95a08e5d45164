"""torch's operator suite (OpInfo) through ``torch.compile(backend="ir_runtime")``, one sample
per op (values and input gradients) against torch eager (see ``opinfo_dynamo.py``). Every op
passes or is in ``KNOWN_FAILURES`` with the reason, as in ``test_opinfo.py``; a wrong value
fails the run whatever the list says. Its own nox session (``nox -s opinfo_dynamo``)."""

from __future__ import annotations

import opinfo
import opinfo_dynamo
import pytest
from opinfo_known_failures import KNOWN_FAILURES as LAZY_FAILURES

# Ops Dynamo runs as they are, handing the backend no graph (checked: eager against eager
# would prove nothing): Dynamo breaks its graph where a result's shape, or a Python value,
# depends on the data (torch's capture_dynamic_output_shape_ops and capture_scalar_outputs
# are off by default), or on a storage resize.
_DATA_DEPENDENT = {
    "item": "a tensor read into a Python number",
    "allclose": "a Python bool of the data",
    "equal": "a Python bool of the data",
    "combinations": "a shape that depends on the data (its nonzero mask)",
    "corrcoef": "a data-dependent check inside torch.cov",
    "cov": "a data-dependent check of its weights",
    "masked_select": "a shape that depends on the mask's values",
    "tensor_split": "split points read from a tensor",
    "unique": "a shape that depends on the data",
    "unique_consecutive": "a shape that depends on the data",
    "nonzero": "a shape that depends on the data",
    "argwhere": "a shape that depends on the data",
    "resize_": "a storage resize",
    "resize_as_": "a storage resize",
    "nn.functional.ctc_loss": "target lengths read into Python",
    "nn.functional.gaussian_nll_loss": "a data-dependent check of its variance",
    "linalg.lstsq": "a data-dependent driver check",
    "linalg.lstsq.grad_oriented": "a data-dependent driver check",
}
KNOWN_FAILURES = {
    "chalf": LAZY_FAILURES["chalf"],
    **{
        name: ("values", f"Dynamo hands the backend no graph: {why}")
        for name, why in _DATA_DEPENDENT.items()
    },
}
SAMPLES = 1
OPS = opinfo.population()
OUTCOMES: dict = {}  # op id -> Outcome, for the run's summary


@pytest.mark.parametrize("op", OPS, ids=opinfo.op_id)
def test_op_through_torch_compile_matches_eager(op):
    name = opinfo.op_id(op)
    outcome = OUTCOMES[name] = opinfo_dynamo.check(op)
    opinfo.judge(name, outcome, KNOWN_FAILURES.get(name), "KNOWN_FAILURES")
