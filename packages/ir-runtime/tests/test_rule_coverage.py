"""Every lowering rule is exercised by a test against eager: the whole suite runs first
(``conftest.py`` orders this module last and records every rule looked up while lowering)."""

from pathlib import Path

import conftest

import ir_runtime as irt
from ir_runtime import _schema


def test_every_aten_rule_names_an_overload_the_front_end_records():
    bad = [op for op in irt.RULES if op.startswith("aten::") and not _schema.recordable(op)]
    assert not bad, bad


def test_every_rule_runs_in_some_test_against_eager(request):
    ran = {Path(str(item.fspath)).stem for item in request.session.items}
    # (test_opinfo_dynamo runs in a nox session of its own: its ops are test_opinfo's too)
    modules = {p.stem for p in Path(__file__).parent.glob("test_*.py")} - {"test_opinfo_dynamo"}
    missing = sorted(modules - ran)
    assert not missing, (
        f"the rule coverage needs the whole suite; these modules did not run: {missing} "
        f"(run pytest on the tests directory)"
    )
    unchecked = sorted(set(irt.RULES) - conftest.LOWERED)
    assert not unchecked, (
        f"{len(unchecked)} lowering rules run in no test (add a check against eager, e.g. "
        f"to test_rules.OUTSIDE_OPINFO): {unchecked}"
    )
