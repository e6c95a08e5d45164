"""Every aten rule names an overload the front end records. That every lowering rule is
exercised by a test against eager is checked at the end of a whole run, over every worker's
tests (``conftest.py``: ``_rule_coverage``)."""

import ir_runtime as irt
from ir_runtime import _schema


def test_every_aten_rule_names_an_overload_the_front_end_records():
    bad = [op for op in irt.RULES if op.startswith("aten::") and not _schema.recordable(op)]
    assert not bad, bad
