"""The three packages install together, their sibling ranges agree, and layering holds."""

import subprocess
import sys
from importlib.metadata import requires, version

import pytest
from packaging.requirements import Requirement

PACKAGES = ["ir-core", "ir-sharding", "ir-runtime"]


@pytest.mark.parametrize("name", PACKAGES)
def test_sibling_ranges_agree(name):
    for req in (Requirement(r) for r in requires(name) or []):
        if req.name in PACKAGES:
            assert version(req.name) in req.specifier, (name, str(req), version(req.name))


def test_ir_core_imports_no_numpy_jax_or_torch():
    code = (
        "import sys, ir_core\n"
        "heavy = {'numpy', 'jax', 'torch'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
