"""The three packages install together, each the version its metadata says, their sibling
ranges agree, and layering holds."""

import importlib
import subprocess
import sys
from importlib.metadata import requires, version

import pytest
from packaging.requirements import Requirement

PACKAGES = ["ir-core", "ir-sharding", "ir-runtime"]


@pytest.mark.parametrize("name", PACKAGES)
def test_version_matches_metadata(name):
    assert importlib.import_module(name.replace("-", "_")).__version__ == version(name)


@pytest.mark.parametrize("name", PACKAGES)
def test_sibling_ranges_agree(name):
    siblings = [req for req in map(Requirement, requires(name) or []) if req.name in PACKAGES]
    if name != "ir-core":
        assert "ir-core" in {req.name for req in siblings}, f"{name} must declare its ir-core range"
    for req in siblings:
        assert version(req.name) in req.specifier, (name, str(req), version(req.name))


def test_ir_core_imports_no_numpy_jax_or_torch():
    code = (
        "import sys, ir_core\n"
        "heavy = {'numpy', 'jax', 'torch'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
