"""torch's operator suite (OpInfo) through the lazy device, values and input gradients, against
torch eager on the CPU (see ``opinfo.py``).

Every op passes, or is in ``KNOWN_FAILURES`` with the reason; a known failure must still fail,
and only by raising: a wrong value fails the run whatever the list says. The list only
shrinks: an op on it that passes fails the run until its entry is removed. The run ends with
the totals and the length of the list (``conftest.py``'s summary).

The last test checks the other direction: every lowering rule registered is exercised by these
samples, or checked against eager by a test named in ``CHECKED_ELSEWHERE``.
"""

from __future__ import annotations

import importlib

import pytest

import ir_runtime as irt
import opinfo
from ir_runtime import _compile, _schema
from opinfo_known_failures import KNOWN_FAILURES
from test_rules import OUTSIDE_OPINFO as OUTSIDE

SAMPLES = 3  # the first three samples of each op, as the coverage figures are measured

OPS = opinfo.population()
OUTCOMES: dict = {}  # op id -> Outcome, for the summary and the rule coverage check
LOWERED: set = set()  # op names whose rules ran while these samples were lowered


@pytest.fixture(scope="module", autouse=True)
def _record_lowered_rules():
    """Record each rule looked up while lowering; cached programs are dropped first, so every
    graph of this module is lowered here."""
    irt.CACHE.clear()
    rule_for = _compile.rule_for

    def recording(op):
        LOWERED.add(op)
        return rule_for(op)

    _compile.rule_for = recording
    yield
    _compile.rule_for = rule_for


def _run(op):
    outcome = OUTCOMES.get(opinfo.op_id(op))
    if outcome is None:
        outcome = OUTCOMES[opinfo.op_id(op)] = opinfo.check(op, SAMPLES)
    return outcome


@pytest.mark.parametrize("op", OPS, ids=opinfo.op_id)
def test_op_matches_eager(op):
    name = opinfo.op_id(op)
    outcome = _run(op)
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


# Rules that OpInfo's float32 samples do not reach, with the test (module.function, in this
# directory) that checks each against eager.
CHECKED_ELSEWHERE = {
    **{f"aten::{name}": "test_rules.test_overloads_outside_opinfos_samples" for name in OUTSIDE},
    "ir::random_permutation": "test_rules.test_randperm_is_a_permutation_and_draws_follow_the_seed",
    "aten::special_zeta.self_scalar": "test_special.test_zeta",
    "aten::special_zeta.other_scalar": "test_special.test_zeta",
    **{
        f"aten::special_{name}_polynomial_{kind}.{form}": "test_special.test_polynomials"
        for name, kinds in (
            ("chebyshev", "tuvw"),
            ("shifted_chebyshev", "tuvw"),
            ("hermite", ("h", "he")),
            ("laguerre", "l"),
            ("legendre", "p"),
        )
        for kind in kinds
        for form in ("x_scalar", "n_scalar")
    },
}


def test_every_rule_is_checked_against_eager():
    """Every ATen rule names a real overload, and every rule ran on an OpInfo sample here or is
    checked by a named test."""
    for op in OPS:  # a run of a subset (-k) still checks the whole suite's coverage
        _run(op)
    for op in irt.RULES:
        if op.startswith("aten::"):
            assert _schema.overload(op) is not None, op
    for test in CHECKED_ELSEWHERE.values():
        module, _, function = test.partition(".")
        assert callable(getattr(importlib.import_module(module), function, None)), test
    unchecked = sorted(set(irt.RULES) - LOWERED - set(CHECKED_ELSEWHERE))
    assert not unchecked, (
        f"{len(unchecked)} rules are not checked against eager (add an OpInfo-reachable use "
        f"or a test in test_rules.py, and name it in CHECKED_ELSEWHERE): {unchecked}"
    )
