"""The package installs with its declared sibling ranges satisfied."""

from importlib.metadata import requires, version

from packaging.requirements import Requirement

import ir_runtime


def test_version_matches_metadata():
    assert ir_runtime.__version__ == version("ir-runtime")


def test_sibling_ranges_are_satisfied_by_what_is_installed():
    siblings = [Requirement(r) for r in requires("ir-runtime") if r.startswith("ir-")]
    assert siblings, "ir-runtime must declare its range on ir-core"
    for req in siblings:
        assert version(req.name) in req.specifier, (req, version(req.name))
