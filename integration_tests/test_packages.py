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


def test_the_readmes_install_commands_are_what_this_suite_runs_on():
    """The top README's pip commands install the packages from their paths in dependency
    order, with the pins this session installed; the versions it names as tested are the
    ones installed here."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("### Installing the packages into your own environment") :]
    commands = re.search(r"```sh\n(.*?)\n```", section, re.S).group(1).splitlines()
    assert commands[0] == f"python3 -m pip install torch=={version('torch').split('+')[0]}"
    paths = commands[1].split("install ", 1)[1].replace("'", "").split()
    assert paths == [
        "./packages/ir-core",
        "./packages/ir-sharding",
        "./packages/ir-runtime[checkpoint]",
    ]
    root = Path(__file__).resolve().parents[1]
    assert all((root / p.split("[")[0]).is_dir() for p in paths)
    transformers = Requirement(re.search(r"'(transformers[^']*)'", commands[2]).group(1))
    assert version("transformers") in transformers.specifier
    tested = section[section.index("Tested together:") :].split(".\n")[0].replace("\n", " ")
    for name, shown in (
        ("torch", "torch"),
        ("jax", "jax and jaxlib"),
        ("jaxlib", "jax and jaxlib"),
        ("orbax-checkpoint", "orbax-checkpoint"),
    ):
        assert f"{shown} {version(name).split('+')[0]}" in tested, (name, tested)
    minor = ".".join(version("transformers").split(".")[:2])
    assert f"transformers {minor}" in tested
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in tested
