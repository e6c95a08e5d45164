"""The package imports only ir_core and numpy. Its version and sibling ranges:
integration_tests/test_packages.py, for the three packages."""

import subprocess
import sys


def test_importing_it_imports_no_jax_or_torch():
    code = (
        "import sys, ir_sharding; "
        "m = ir_sharding.ShardingSpec(ir_sharding.Mesh(range(4), (2, 2), ('a', 'b')), "
        "('a', None)); m.to_hlo_text(); m.visualize((4, 4)); "
        "print(sorted(k for k in ('jax', 'torch') if k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
