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
