"""torch_xla's API over this engine: unchanged torch_xla scripts and tests run here.

    python -m ir_runtime.torch_xla train.py --flags       # an unchanged torch_xla script
    python -m ir_runtime.torch_xla -m pytest test/spmd    # an unchanged torch_xla test suite

or, in code, before the first ``import torch_xla``::

    import ir_runtime.torch_xla
    ir_runtime.torch_xla.install()
    import torch_xla  # served by this package

``install()`` adds an import finder that serves ``torch_xla`` and its submodules from
``ir_runtime/torch_xla/_served/torch_xla/`` (nothing named ``torch_xla`` is installed into
site-packages), and names the engine's device ``"xla"``: tensors read ``xla:0``, and
``torch.zeros(3, device="xla")``, ``.to("xla")`` and ``torch.autocast("xla")`` reach the same
engine ``"lazy"`` names otherwise. A process uses one name: ``install()`` comes before the
first lazy tensor, and a tensor asked for on the other name is refused by name.

A real torch_xla, if one is importable, is never shadowed unless ``install(shadow=True)``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).parent / "_served"

# torch_xla's own environment variable for the number of CPU devices: mapped onto this
# engine's (``IR_RUNTIME_CPU_DEVICES``) when that one is not set.
_CPU_DEVICES = ("CPU_NUM_DEVICES", "IR_RUNTIME_CPU_DEVICES")


class _Finder(importlib.abc.MetaPathFinder):
    """Serves ``torch_xla`` and ``torch_xla.*`` from ``_served``; a module it does not have is a
    ``ModuleNotFoundError`` naming what is served instead of a search elsewhere."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch_xla" and not fullname.startswith("torch_xla."):
            return None
        base = ROOT.joinpath(*fullname.split("."))
        init = base / "__init__.py"
        if init.is_file():
            return importlib.util.spec_from_file_location(
                fullname, init, submodule_search_locations=[str(base)]
            )
        module = base.with_suffix(".py")
        if module.is_file():
            return importlib.util.spec_from_file_location(fullname, module)
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: ir_runtime.torch_xla serves torch_xla's public "
            f"API over this engine, and this module is not part of it (see the README's "
            f"'Coming from torch_xla'); the modules it serves are under {ROOT}",
            name=fullname,
        )


_FINDER = _Finder()


def installed() -> bool:
    return _FINDER in sys.meta_path


def _real_torch_xla() -> str | None:
    """Where a real torch_xla is importable from, if anywhere (asked of the finders after
    ours, so ours never answers)."""
    present = sys.modules.get("torch_xla")
    if present is not None and not str(getattr(present, "__file__", "")).startswith(str(ROOT)):
        return str(getattr(present, "__file__", present))
    for finder in sys.meta_path:
        if finder is _FINDER or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec("torch_xla", None)
        if spec is not None:
            return str(spec.origin)
    return None


def install(shadow: bool = False) -> None:
    """Serve ``torch_xla`` from this package and name the engine's device ``"xla"``.

    Args:
        shadow: serve ``torch_xla`` even where a real one is importable (its modules already
            imported are left as they are); without it, a real torch_xla is an error.

    Raises:
        ImportError: a real torch_xla is importable (or imported) and ``shadow`` is False.
        DeviceMismatchError: the engine already runs under the name ``"lazy"`` in this process
            (a lazy tensor was made before ``install()``).
    """
    if installed():
        return
    real = _real_torch_xla()
    if real is not None and not shadow:
        raise ImportError(
            f"a real torch_xla is importable here ({real}): ir_runtime.torch_xla does not "
            f"shadow it unless asked, ir_runtime.torch_xla.install(shadow=True) (or "
            f"python -m ir_runtime.torch_xla --shadow)"
        )
    from ir_runtime._frontend import _install

    _install.name_device("xla")
    for name in [n for n in sys.modules if n == "torch_xla" or n.startswith("torch_xla.")]:
        del sys.modules[name]  # (a shadowed torch_xla's modules: ours are imported afresh)
    if os.environ.get(_CPU_DEVICES[1]) is None and os.environ.get(_CPU_DEVICES[0]):
        os.environ[_CPU_DEVICES[1]] = os.environ[_CPU_DEVICES[0]]
    _from_torchrun(os.environ)
    from ir_runtime.torch_xla import _guard

    _guard.load()
    _xla_key_fallback()
    sys.meta_path.insert(0, _FINDER)


def _from_torchrun(env) -> None:
    """torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)
    as this engine's processes: process id, count, and the coordinator ``jax.distributed``
    starts at, on the port after ``MASTER_PORT`` (that one is torch's store). Variables the
    engine's launcher set already win."""
    from ir_runtime._distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

    if int(env.get("WORLD_SIZE") or 1) <= 1 or env.get(ENV_COORDINATOR):
        return
    if not (env.get("MASTER_ADDR") and env.get("MASTER_PORT") and env.get("RANK")):
        return
    env[ENV_COORDINATOR] = f"{env['MASTER_ADDR']}:{int(env['MASTER_PORT']) + 1}"
    env.setdefault(ENV_NUM_PROCESSES, env["WORLD_SIZE"])
    env.setdefault(ENV_PROCESS_ID, env["RANK"])


_XLA_KEY: list = []  # the Library holding the XLA key's fallback, kept alive


def _xla_key_fallback() -> None:
    """What ``import ir_runtime`` does for the Lazy key, for the XLA key: an op made on the
    ``xla`` device with no kernel there installs the front end, then runs on its kernel."""
    import ir_runtime

    if not _XLA_KEY:
        _XLA_KEY.append(ir_runtime._lazy_key_fallback("XLA"))


__all__ = ["install", "installed"]
