"""The package installs whole (every source module, the compiled fast path), and importing it
changes no torch or jax setting until the front end is used. Its version and sibling ranges:
integration_tests/test_packages.py, for the three packages."""

from pathlib import Path

import ir_runtime


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
    from ir_runtime._frontend.recording import _fast

    assert Path(_fast.__file__).suffix in (".so", ".pyd"), _fast.__file__


def test_importing_changes_no_torch_or_jax_setting_until_the_front_end_is_used():
    """``import ir_runtime`` (the graph-level API) leaves torch and jax as they were; the first
    use of a front-end name installs the front end into torch."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import importlib
        import jax, torch, torch._lazy
        adam = importlib.import_module("torch.optim.adam")
        before = (torch.manual_seed, torch._lazy.mark_step,
                  adam._get_capturable_supported_devices)
        import ir_runtime as irt
        after = (torch.manual_seed, torch._lazy.mark_step,
                 adam._get_capturable_supported_devices)
        assert after == before, "import changed torch"
        assert not jax.config.jax_enable_x64, "import turned on x64"
        assert "ir_runtime._frontend" not in __import__("sys").modules
        # The graph-level API, through a rule that reads torch's dtype promotion: still nothing.
        import numpy as np
        from ir_core import Generic, Shape, Value
        irt.init(cpu_devices=1)
        b, v = irt.to_device(np.arange(4.0)), irt.to_device(np.array([1.5, 2.5]))
        node = Generic("aten::searchsorted.Tensor", [Value(b), Value(v)],
                       [Shape("int64", (2,))],
                       {"out_int32": False, "right": False, "side": None, "sorter": None})
        assert irt.to_host(irt.execute([Value(node)])[0]).tolist() == [2, 3]
        assert "ir_runtime._frontend" not in __import__("sys").modules
        assert torch.manual_seed is before[0]
        irt.to_lazy  # the first use of a front-end name
        assert torch.manual_seed is not before[0]
        assert torch._lazy.mark_step is not before[1]
        assert "lazy" in adam._get_capturable_supported_devices()
        assert jax.config.jax_enable_x64
        print(float(irt.to_torch(irt.to_lazy(torch.ones(2)) * 3).sum()))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "6.0"


def test_importing_any_front_end_module_is_passive_and_the_rule_table_is_complete():
    """Every module under ir_runtime._frontend imports without touching torch (only
    ``install()`` does), and every lowering rule, the region nodes' included, is registered by
    ``import ir_runtime`` alone: ``supported_ops()`` is the same before and after the front end."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        import torch, torch._lazy
        import torch.utils.checkpoint as ckpt
        before = (torch.manual_seed, torch._lazy.mark_step, ckpt.CheckpointFunction,
                  getattr(torch, "lazy", None))
        import ir_runtime as irt
        ops = irt.supported_ops()
        for name in ("ir::scan_layers", "ir::scan_layers_grad", "ir::shard_map",
                     "ir::shard_map_grad", "ir::all_reduce", "ir::all_gather",
                     "ir::reduce_scatter", "ir::all_to_all", "ir::ppermute", "ir::axis_index",
                     "ir::call_jax", "ir::call_jax_vjp", "ir::attention",
                     "ir::attention_backward"):
            assert name in ops, name
        import ir_runtime._frontend as fe
        names = [m.name for m in pkgutil.walk_packages(fe.__path__, "ir_runtime._frontend.")]
        assert len(names) > 25, names
        for name in names:
            importlib.import_module(name)
        after = (torch.manual_seed, torch._lazy.mark_step, ckpt.CheckpointFunction,
                 getattr(torch, "lazy", None))
        assert after == before, "importing the front end changed torch"
        irt.install()
        assert torch.manual_seed is not before[0] and torch._lazy.mark_step is not before[1]
        assert ckpt.CheckpointFunction is not before[2] and torch.lazy is not None
        assert irt.supported_ops() == ops
        print(len(names))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.strip()) > 25


def test_every_name_in_all_resolves_and_the_lazy_names_match_it():
    """``__all__`` names each public name once, and every one resolves. The front end's names
    are found on first use (``_FRONTEND``, name -> module under ``ir_runtime._frontend``), so a
    typo there or in ``__all__`` (torch_xla once lost ``mark_sharding`` from its ``__all__`` to
    a missing comma) would show only when a user first asks for the name: a fresh process asks
    for every one. A name not defined at import is a lazy one, and every lazy name is public."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import ir_runtime
        names, lazy = ir_runtime.__all__, set(ir_runtime._FRONTEND)
        eager = set(vars(ir_runtime))  # before any lookup: a lazy name is kept once found
        repeated = sorted({n for n in names if names.count(n) > 1})
        assert sorted(set(names)) == sorted(names), f"repeated in __all__: {repeated}"
        assert lazy <= set(names), f"lazy but not in __all__: {sorted(lazy - set(names))}"
        unknown = set(names) - eager - lazy
        assert not unknown, f"in __all__, neither defined at import nor lazy: {sorted(unknown)}"
        shadowed = lazy & eager
        assert not shadowed, f"lazy names defined at import (never installed): {sorted(shadowed)}"
        assert set(names) <= set(dir(ir_runtime)), "dir() lists every public name, lazy too"
        for name in names:
            getattr(ir_runtime, name)
        print(len(names))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(len(ir_runtime.__all__))
