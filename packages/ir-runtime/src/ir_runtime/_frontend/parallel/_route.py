"""torch's own names reach this project for its meshes.

``distribute_tensor``, ``distribute_module``, ``parallelize_module``, FSDP2's ``fully_shard``
and ``DTensor.from_local`` run per rank in torch (each builds ``DTensor`` shards and calls
collectives on process groups). Users import them before any ``ir_runtime`` call, so
replacing the module attributes would miss the names they already hold. Instead each function
object itself is routed, once: its code becomes a call to a dispatcher that runs this
project's version when the mesh argument (or the current ``with mesh:`` mesh) is a
``LazyDeviceMesh``, and torch's own code, unchanged, for any other mesh. The function keeps its
identity, name, signature and docstring.
"""

from __future__ import annotations

import inspect
import types

_ROUTED: dict = {}  # key -> the dispatcher (routing is done once per function)


def _copy(fn):
    """A new function object running ``fn``'s current code (torch's own, kept)."""
    copy = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy


def _trampoline(fn, global_name: str):
    """Code with ``fn``'s free variables (so it fits ``fn``'s closure) that calls
    ``global_name`` from ``fn``'s globals with every argument."""
    free = fn.__code__.co_freevars
    lines = ["def _outer():"]
    lines += [f"    {v} = None" for v in free] or ["    pass"]
    lines += [f"    def {fn.__name__}(*args, **kwargs):"]
    if free:
        lines += [f"        ({', '.join(free)},)"]
    lines += [f"        return {global_name}(*args, **kwargs)", f"    return {fn.__name__}"]
    scope: dict = {}
    exec("\n".join(lines), scope)  # (our own fixed source)
    code = scope["_outer"]().__code__
    assert code.co_freevars == free, (code.co_freevars, free)
    return code.replace(co_qualname=fn.__qualname__, co_firstlineno=fn.__code__.co_firstlineno)


def route(fn, key: str, mesh_arg: str, ours) -> None:
    """From now on, ``fn(...)`` runs ``ours(...)`` when its ``mesh_arg`` (or, when that is None,
    the current mesh) is a ``LazyDeviceMesh``, else torch's own code."""
    if key in _ROUTED or fn.__dict__.get("_ir_runtime_routed"):
        return  # (once: routing the trampoline again would make it call itself)
    from ir_runtime._frontend.parallel._mesh import LazyDeviceMesh

    signature = inspect.signature(fn)
    original = _copy(fn)

    def dispatch(*args, **kwargs):
        try:
            mesh = signature.bind(*args, **kwargs).arguments.get(mesh_arg)
        except TypeError:
            return original(*args, **kwargs)  # torch's own error for a bad call
        if mesh is None:
            from torch.distributed.device_mesh import _mesh_resources

            try:
                mesh = _mesh_resources.get_current_mesh()
            except RuntimeError:
                mesh = None
        if isinstance(mesh, LazyDeviceMesh):
            return ours(*args, **kwargs)
        return original(*args, **kwargs)

    global_name = f"_ir_runtime_route_{key}"
    fn.__globals__[global_name] = dispatch
    fn.__code__ = _trampoline(fn, global_name)
    fn.__signature__ = signature
    fn._ir_runtime_routed = True
    _ROUTED[key] = dispatch


def _one_process_dcp(module, name: str) -> None:
    """``torch.distributed.checkpoint``'s save or load (``module.name``, which ``dcp.save`` /
    ``dcp.load`` call) refuses lazy tensors across processes: DCP splits the work by torch
    rank, which a run of ``jax.distributed`` does not have, and each process would read whole
    tensors it does not hold. One process writes and reads DCP's format as it is."""
    inner = getattr(module, name)
    if getattr(inner, "_ir_runtime_checked", False):
        return

    def checked(state_dict, *args, **kwargs):
        from torch.utils._pytree import tree_leaves

        from ir_runtime._distributed import process_count
        from ir_runtime._errors import DistributedError
        from ir_runtime._frontend.recording._tensor import LazyTensor

        if process_count() > 1 and any(isinstance(x, LazyTensor) for x in tree_leaves(state_dict)):
            raise DistributedError(
                f"torch.distributed.checkpoint ({name.strip('_')}) of lazy tensors across "
                f"{process_count()} processes: DCP divides the work by torch rank, and this "
                f"run's processes are jax.distributed's, each holding part of every tensor. "
                f"Use ir_runtime.CheckpointManager, which writes and reads each process's "
                f"shards (one process writes DCP's format as it is)"
            )
        return inner(state_dict, *args, **kwargs)

    checked._ir_runtime_checked = True
    setattr(module, name, checked)


def install() -> None:
    """Route torch's five functions (module docstring), and check DCP's save and load;
    idempotent."""
    from torch.distributed import tensor as dt
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import parallel

    from ir_runtime._frontend.parallel import _dtensor, _plans

    _dtensor.install()
    route(dt.distribute_tensor, "distribute_tensor", "device_mesh", _dtensor.distribute_tensor)
    route(dt.distribute_module, "distribute_module", "device_mesh", _dtensor.distribute_module)
    route(
        parallel.parallelize_module,
        "parallelize_module",
        "device_mesh",
        _plans.parallelize_module,
    )
    route(fully_shard, "fully_shard", "mesh", _plans.fully_shard)
    from_local = dt.DTensor.__dict__["from_local"].__func__
    route(from_local, "from_local", "device_mesh", _dtensor.from_local)
    from torch.distributed.checkpoint import state_dict_loader, state_dict_saver

    _one_process_dcp(state_dict_saver, "_save_state_dict")
    _one_process_dcp(state_dict_loader, "_load_state_dict")
