"""Every name in ``ir_core.__all__`` is there once and resolves, and every public name the
package defines is in it. torch_xla once lost ``mark_sharding`` from its ``__all__`` to a
missing comma (two names joined into one string that names nothing)."""

import types

import ir_core


def test_every_name_in_all_resolves_once():
    names = ir_core.__all__
    repeated = sorted({name for name in names if names.count(name) > 1})
    assert sorted(set(names)) == sorted(names), f"repeated in __all__: {repeated}"
    missing = [name for name in names if not hasattr(ir_core, name)]
    assert not missing, f"in __all__ but not defined: {missing}"


def test_every_public_name_is_in_all():
    public = {
        name
        for name, value in vars(ir_core).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert not public - set(ir_core.__all__), sorted(public - set(ir_core.__all__))
