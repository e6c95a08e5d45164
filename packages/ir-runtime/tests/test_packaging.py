"""The package installs with its declared sibling ranges satisfied."""

from importlib.metadata import requires, version
from pathlib import Path

from packaging.requirements import Requirement

import ir_runtime


def test_version_matches_metadata():
    assert ir_runtime.__version__ == version("ir-runtime")


def test_sibling_ranges_are_satisfied_by_what_is_installed():
    siblings = [Requirement(r) for r in requires("ir-runtime") if r.startswith("ir-")]
    assert siblings, "ir-runtime must declare its range on ir-core"
    for req in siblings:
        assert version(req.name) in req.specifier, (req, version(req.name))


def test_every_source_module_is_installed():
    """meson.build lists the sources it installs: a module added to the tree but not to that
    list would be missing from every wheel."""
    source = Path(__file__).parent.parent / "src" / "ir_runtime"
    installed = Path(ir_runtime.__file__).parent
    wanted = sorted(str(p.relative_to(source)) for p in source.rglob("*.py"))
    assert wanted, source
    missing = [name for name in wanted if not (installed / name).is_file()]
    assert not missing, f"not installed (add them to meson.build): {missing}"


def test_the_tracing_fast_path_is_compiled():
    from ir_runtime._frontend import _fast

    assert Path(_fast.__file__).suffix in (".so", ".pyd"), _fast.__file__
