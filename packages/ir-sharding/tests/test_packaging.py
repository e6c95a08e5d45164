"""The package installs with its sibling ranges satisfied and imports only ir_core and numpy."""

import subprocess
import sys
from importlib.metadata import requires, version

from packaging.requirements import Requirement

import ir_sharding


def test_version_matches_metadata():
    assert ir_sharding.__version__ == version("ir-sharding")


def test_sibling_ranges_are_satisfied_by_what_is_installed():
    siblings = [Requirement(r) for r in requires("ir-sharding") if r.startswith("ir-")]
    assert siblings, "ir-sharding must declare its range on ir-core"
    for req in siblings:
        assert version(req.name) in req.specifier, (req, version(req.name))


def test_importing_it_imports_no_jax_or_torch():
    code = (
        "import sys, ir_sharding; "
        "m = ir_sharding.ShardingSpec(ir_sharding.Mesh(range(4), (2, 2), ('a', 'b')), "
        "('a', None)); m.to_hlo_text(); m.visualize((4, 4)); "
        "print(sorted(k for k in ('jax', 'torch') if k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
