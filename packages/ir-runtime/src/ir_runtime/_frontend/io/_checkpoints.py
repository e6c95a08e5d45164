"""``CheckpointManager``: sharded checkpoints of a training run, saved and restored with orbax.

A checkpoint is an orbax ``CheckpointManager`` step directory with two items: ``arrays`` (every
tensor, as orbax's pytree of arrays: each process writes only the shards it holds, nothing is
gathered to one host; absent when the state holds no tensor) and ``meta`` (JSON: plain Python
values and the small tensors inside them, optimizer hyperparameters and the order each
parameter's state was made in, which tensors were host tensors, the sharding annotation each
lazy tensor carried, the random streams). orbax writes a step into a temporary directory and
renames it when complete, so a process killed during a save leaves the earlier checkpoints as
they were and no partial one listed; ``max_to_keep`` deletes the oldest only once the newest
is complete, and moves it out of the listed names (one rename, into ``deleting/``) before
removing its files, so a process killed while deleting leaves no partial one listed either
(``_remove_deleted``).

What a state holds (a mapping of names to): modules (their ``state_dict``), optimizers (their
``state_dict``: per-parameter state and the parameter groups' hyperparameters, tensors among
them), tensors (lazy or host), and plain values (None, bool, int, float, str, and lists, tuples
and dicts of them, with small tensors inside: a scheduler's ``state_dict()``).
The lazy random stream and torch's CPU generator are saved with every checkpoint and restored
with it, so dropout after a resume draws what an uninterrupted run would.

Restoring reads only what the state names (the weights alone, from a training run's
checkpoint), each array straight into its placement, whatever the layout it was saved from:
another mesh, another process count, sharded or replicated. The placement is what the running
state had (``_placement``): the target's own annotation (an optimizer state, its parameter's),
else, on the mesh it was saved from, the annotation it was saved with, else replicated over the
state's mesh as a program leaves unannotated data; so a resumed compiled step meets the
programs the uninterrupted one compiled. Everything is checked before anything is assigned: a
key, shape or dtype that does not match is named, with both sides, and nothing changes; a
``meta`` file that is missing, not JSON or not shaped as written is named with its step and
path (``CheckpointReadError``).

A save that fails in the background (``save_async``: a full disk, a lost mount) is reported
once, as ``CheckpointSaveError`` naming the step, by whichever comes first of ``join()`` and the
next ``save``, ``save_async`` (one the interval does not skip) or ``restore``; the call that
reports it does nothing else. The steps saved before it are untouched, and the manager saves
and restores normally afterwards.

Longer than 400 lines, as one module: saving and restoring are the two directions of one
on-disk format (the ``arrays`` and ``meta`` items, their keys, the plain-value encoding, the
random streams), and side by side each key written can be seen to be read back.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import torch

from ir_core import DeviceData, Shape, Value
from ir_runtime._dtypes import name_of, to_numpy_dtype
from ir_runtime._errors import (
    CheckpointArgumentError,
    CheckpointDirectoryError,
    CheckpointExistsError,
    CheckpointKeyError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointReadError,
    CheckpointSaveError,
    CheckpointStateError,
)
from ir_runtime._frontend.recording import _rng
from ir_runtime._frontend.recording._convert import host_numpy, host_tensor, ir_dtype
from ir_runtime._frontend.recording._tensor import LazyTensor, live, wrap
from ir_runtime._frontend.recording._views import write_through
from ir_runtime._frontend.regions._stack import stack_of, stacked_rows
from ir_runtime._frontend.steps import _step
from ir_sharding import Mesh, ShardingSpec

_PLAIN = (type(None), bool, int, float, str)
_META_FILE = "metadata"  # the ``meta`` item's file in its step directory
_SMALL = 4096  # elements of a tensor inside a plain value, kept in ``meta`` (_small_tensor)
_DELETING = "deleting"  # where max_to_keep's steps wait for removal (``_remove_deleted``)

# What ``_snapshot`` writes into ``meta``, as ``restore`` reads it back: key -> JSON type. Also,
# absent from checkpoints written before them: "specs" (key -> a sharding annotation) and, per
# optimizer, "keys" (parameter index -> the order its state was made in).
_META = {"plain": dict, "host": list, "optimizers": dict, "rng": dict}
_META_RNG = {"seed": int, "step": int, "offset": int, "torch": list}
_META_OPTIMIZER = {"groups": list, "plain": dict, "indices": list}


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:  # an optional dependency: ir-runtime[checkpoint]
        raise ImportError(
            "CheckpointManager needs orbax-checkpoint: pip install 'ir-runtime[checkpoint]'"
        ) from e
    return ocp


def _plain(value, where: str):
    """A plain value as JSON (tuples kept apart from lists)."""
    if isinstance(value, _PLAIN):
        if isinstance(value, float) and not np.isfinite(value):
            return {"__float__": repr(value)}
        return value
    if isinstance(value, tuple):
        return {"__tuple__": [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CheckpointStateError(
                    f"checkpoint state {where}: dict keys must be str, got {k!r}"
                )
            out[k] = _plain(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, torch.Tensor):
        return _small_tensor(value, where)
    raise CheckpointStateError(
        f"checkpoint state {where} is a {type(value).__name__}: a state holds modules, "
        f"optimizers, tensors and plain values (None, bool, int, float, str, lists, tuples, "
        f"dicts, and small tensors inside them)"
    )


def _small_tensor(t: torch.Tensor, where: str) -> dict:
    """A tensor inside a plain value (an optimizer's learning rate held in a tensor, a
    scheduler's ``base_lrs``): its bytes in ``meta``, exactly, with its dtype, shape and kind
    (host or lazy), restored as the same kind."""
    if t.numel() > _SMALL:
        raise CheckpointStateError(
            f"checkpoint state {where} is a tensor of {t.numel()} elements inside a plain "
            f"value; those are kept in the JSON metadata, up to {_SMALL} elements: put a "
            f"larger tensor in the state by its own name"
        )
    a = _step.to_torch(t) if isinstance(t, LazyTensor) else t.detach()
    data = host_numpy(a)  # (tobytes writes C order)
    return {
        "__tensor__": {
            "dtype": name_of(data.dtype),
            "shape": list(data.shape),
            "hex": data.tobytes().hex(),
            "lazy": isinstance(t, LazyTensor),
            "requires_grad": t.requires_grad,
        }
    }


def _unsmall(saved: dict) -> torch.Tensor:
    dtype = saved["dtype"]
    a = np.frombuffer(bytes.fromhex(saved["hex"]), to_numpy_dtype(dtype)).reshape(saved["shape"])
    if saved["lazy"]:
        t = LazyTensor(_value_of(a.copy(), None))
    else:
        t = host_tensor(a, dtype)
    return t.requires_grad_(saved["requires_grad"])


def _unplain(value):
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_unplain(v) for v in value["__tuple__"])
        if set(value) == {"__float__"}:
            return float(value["__float__"])
        if set(value) == {"__tensor__"}:
            return _unsmall(value["__tensor__"])
        return {k: _unplain(v) for k, v in value.items()}
    return value


def _array_of(t: torch.Tensor):
    """A tensor's data as orbax saves it: a lazy tensor's device array, a host tensor's numpy."""
    if isinstance(t, LazyTensor):
        node = _step.materialize(t)
        h = node.handle
        if isinstance(h, jax.Array) and not _local(h):
            return h
        return np.asarray(h)  # (this process's own copy of data every process holds alike)
    return host_numpy(t.detach())


def _local(a: jax.Array) -> bool:
    """Data on this process's devices only, in a run of several: what a tensor holds before
    its first program places it over the mesh, the same in every process."""
    return jax.process_count() > 1 and a.is_fully_addressable


class _Entry:
    """One tensor of the state: its shape and dtype, where its data is to be placed (None:
    host memory), the annotation it is to carry, and how the restored array goes back in."""

    __slots__ = ("assign", "dtype", "lazy", "shape", "sharding", "spec", "user")

    def __init__(self, t: torch.Tensor):
        self.shape, self.dtype = tuple(t.shape), ir_dtype(t.dtype)
        self.lazy = isinstance(t, LazyTensor)
        self.sharding = _sharding_of(t) if self.lazy else None
        self.spec = _annotation(t) if self.lazy else None
        self.user = t._spec if self.lazy else None  # (what the user annotated)
        self.assign = (
            (lambda a, t=t: _rebind(t, a, self.spec))
            if self.lazy
            else (lambda a, t=t: _copy_host(t, a))
        )

    def place(self, default, saved) -> None:
        """Where lazy data goes (``_placement``), ``saved`` being the annotation the saved
        tensor carried."""
        if self.lazy:
            self.sharding, self.spec = _placement(
                saved, self.user, self.sharding, self.spec, default, len(self.shape)
            )


def _placement(saved, user, sharding, spec, default, ndim: int) -> tuple:
    """``(placement, annotation)`` of a restored lazy tensor: as the running state had it.
    What the user annotated on the target is kept (a restore into another layout); else the
    annotation the saved tensor carried (a program's result: its sharding, as XLA chose it),
    where the state is on the mesh it was saved from (compared as meshes, before any jax
    device is looked up: a checkpoint from more devices names some this run lacks); else the
    target's own placement, data no program placed yet (``_or_default``) going where the
    programs would put it."""
    if (
        user is None
        and saved is not None
        and default is not None
        and saved.rank in (None, ndim)
        and saved.mesh == default.mesh
    ):
        return saved.to_jax(), saved
    return _or_default(sharding, spec, default), spec


def _spec_json(spec: ShardingSpec) -> dict:
    mesh = spec.mesh
    fn, args = spec.__reduce__()
    return {
        "mesh": [list(mesh.device_ids), list(mesh.shape), list(mesh.axis_names)],
        "make": fn.__name__,  # (ShardingSpec, replicated, maximal or manual)
        "args": [_plain(a, "a sharding") for a in args[1:]],
    }


def _spec_of_json(saved: dict) -> ShardingSpec:
    mesh = Mesh(*saved["mesh"])
    args = [_unplain(a) for a in saved["args"]]
    if saved["make"] == "ShardingSpec":
        return ShardingSpec(mesh, *args)
    return getattr(ShardingSpec, saved["make"])(mesh, *args)


def _sharding_of(t: LazyTensor):
    """Where a lazy tensor's data lives now: its data's placement, else its annotation; None
    for host data not yet placed (restored to host memory, placed by the next program as it
    would have been). A tensor a failed step set aside is not run (a restore is the way out of
    that failure): its annotation or last placement says."""
    if not (_step.SET_ASIDE and _step.pending(t) and _step._set_aside(t)):
        h = _step.materialize(t).handle
        if isinstance(h, jax.Array) and not _local(h):
            return h.sharding
    spec = _held(t)
    return spec.to_jax() if spec is not None else None


def _held(t: LazyTensor):
    """``t``'s annotation or placement as its data is held (``ShardingSpec.evenly``: a dim an
    uneven annotation splits stays whole)."""
    spec = t._where()
    return spec.evenly(tuple(t.shape)) if spec is not None else None


def _value_of(array, spec) -> Value:
    """A restored array as a lazy value: placed data (annotated with ``spec``, the annotation
    its tensor carries in the running state), or host data to be placed."""
    if not isinstance(array, jax.Array):
        a = np.array(array)
        return Value(DeviceData(Shape(name_of(a.dtype), a.shape), handle=a))
    shape = Shape(name_of(array.dtype), tuple(array.shape))
    return Value(DeviceData(shape, handle=array, sharding=spec))


def _annotation(t: LazyTensor):
    """The sharding spec ``t``'s data carries (None: placed by the programs that made it, not
    annotated): a restored tensor carries the same, so that the programs it meets are those
    the running state met."""
    node = t._ir.node
    return node.sharding if type(node) is DeviceData else _held(t)


class _Default:
    """Where the programs of a run put data that is not annotated: ``sharding``, replicated
    over their ``mesh`` (ir-sharding's)."""

    __slots__ = ("mesh", "sharding")

    def __init__(self, mesh: jax.sharding.Mesh):
        self.sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self.mesh = ShardingSpec.from_jax(self.sharding, 0).mesh


def _replicated(shardings) -> _Default | None:
    """The ``_Default`` of the one mesh of ``shardings`` (the placed tensors of a restore's
    state), or None when they are on no mesh or on several."""
    meshes = {s.mesh for s in shardings if isinstance(s, jax.sharding.NamedSharding)}
    if len(meshes) != 1:
        return None
    return _Default(meshes.pop())


def _or_default(sharding, spec, default):
    """``sharding``, unless its tensor is not annotated (``spec`` None), its data is on no
    device or on one (data no program placed yet: host data, or where ``to_lazy`` put it)
    and the state has a ``default`` placement: then that one."""
    if (
        default is not None
        and spec is None
        and (sharding is None or isinstance(sharding, jax.sharding.SingleDeviceSharding))
    ):
        return default.sharding
    return sharding


def _rebind(t: LazyTensor, array, spec) -> None:
    value = _value_of(array, spec)
    if isinstance(array, jax.Array):
        t._bind(value.node)
    else:
        t._set(value)  # host data, as to_lazy leaves it: the next program places it
    if t._views:
        write_through(t)


class _Restack:
    """A stacked tensor of ``stack_layers`` restored from its per-layer keys: once every row
    is read, the stacked tensor takes them, stacked on the device."""

    __slots__ = ("flat", "owner", "rows")

    def __init__(self, owner, flat):
        self.owner, self.flat = owner, flat
        self.rows: dict = {}  # row -> its restored tensor (None: still to read)

    def take(self, i: int, spec, array) -> None:
        self.rows[i] = wrap(_value_of(array, spec))
        if all(r is not None for r in self.rows.values()):
            t = stack_of(self.owner).tensor(self.owner, self.flat)
            # (a row no layer reads any more, a deleted layer's, keeps its value)
            rows = [self.rows[i] if i in self.rows else t.detach()[i] for i in range(t.shape[0])]
            with torch.no_grad():
                t.copy_(torch.stack(rows))
            self.rows = dict.fromkeys(self.rows)


def _copy_host(t: torch.Tensor, array) -> None:
    with torch.no_grad():
        t.copy_(host_tensor(np.asarray(array), ir_dtype(t.dtype)))


class CheckpointManager:
    """Save and restore a training run's state (module docstring) under ``directory``.

    Args:
        directory: where the checkpoints go (created if missing): one subdirectory per step.
        save_interval: ``save``/``save_async`` save only steps that are multiples of it (or
            when ``force=True``).
        max_to_keep: how many checkpoints to keep (None: all); the oldest go first, once the
            newest is complete (unlisted at once, their files removed by the next ``join``,
            ``save``, ``restore`` or manager).

    A ``save_async`` that fails in the background raises ``CheckpointSaveError`` (naming its
    step, orbax's error as the cause) once: at ``join()`` or at the next ``save``,
    ``save_async`` or ``restore``, whichever comes first. Those wait for a save still running,
    so every process of a run reports it at the same call; a ``save_async`` the interval
    skips neither waits nor reports.
    """

    def __init__(self, directory, save_interval: int = 1, max_to_keep: int | None = None):
        if (
            isinstance(save_interval, bool)
            or not isinstance(save_interval, int)
            or save_interval < 1
        ):
            raise CheckpointArgumentError(
                f"save_interval must be a positive int, got {save_interval!r}"
            )
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1
        ):
            raise CheckpointArgumentError(
                f"max_to_keep must be None or a positive int, got {max_to_keep!r}"
            )
        ocp = _orbax()
        self.directory = os.path.abspath(os.fspath(directory))
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise CheckpointDirectoryError(
                f"checkpoint directory {self.directory} is a file: pass a directory, or a path "
                f"that does not exist yet (it is created)"
            )
        self.save_interval = save_interval
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=True,
            create=True,
            todelete_subdir=_DELETING,
        )
        self._ocp = ocp
        self._mngr = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                "arrays": ocp.PyTreeCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(_META_FILE),
            },
        )
        self._saving: int | None = None  # the step save_async started that join has not seen
        self._remove_deleted()  # (what a process killed while removing them left)

    # -- what there is ---------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """The steps with a complete checkpoint, oldest first."""
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    # -- saving ----------------------------------------------------------------------------

    def save(self, step: int, state, force: bool = False) -> bool:
        """Save ``state`` as ``step`` and wait until it is written; False when the interval
        skips this step."""
        saved = self.save_async(step, state, force)
        self.join()
        return saved

    def save_async(self, step: int, state, force: bool = False) -> bool:
        """Snapshot ``state`` as ``step`` and write it in the background: returns once the
        device data is copied out, so training can go on; a save still running is waited for
        first (and its failure raised: class docstring). False when the interval skips this
        step: then it returns at once, neither waiting nor reporting."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointArgumentError(f"a checkpoint step is a non-negative int, got {step!r}")
        if not force and step % self.save_interval:
            return False
        self.join()  # before all_steps(): a step still being written is listed until it fails
        if step in self.all_steps():
            raise CheckpointExistsError(
                f"step {step} is already saved in {self.directory}: a step is saved once; save "
                f"this one under another step"
            )
        arrays, meta = self._snapshot(state)
        ocp = self._ocp
        items = {"meta": ocp.args.JsonSave(meta)}
        if arrays:  # orbax refuses an empty tree: a state of plain values saves no arrays item
            items["arrays"] = ocp.args.PyTreeSave(arrays)
        try:
            self._mngr.save(step, args=ocp.args.Composite(**items), force=True)
        except Exception as e:
            raise self._save_error(step, e) from e
        self._saving = step
        return True

    def join(self) -> None:
        """Wait until every save started has been written; a failed one raises
        ``CheckpointSaveError`` (class docstring)."""
        step, self._saving = self._saving, None
        try:
            self._mngr.wait_until_finished()
        except Exception as e:
            raise self._save_error(step, e) from e
        self._remove_deleted()

    def _remove_deleted(self) -> None:
        """Remove the files of the steps ``max_to_keep`` dropped. orbax would remove a step in
        place, file by file in no set order, and lists a step directory until its last file is
        gone: a process killed meanwhile left a step listed that no longer restores (its
        metadata gone, or its arrays). So orbax only renames it into ``deleting/`` (its
        ``todelete_subdir``: atomic, out of the step names it lists) and it is removed here,
        where a kill leaves nothing listed and the next manager removes the rest."""
        if jax.process_index() == 0:  # (the process orbax's renames run in)
            # Errors ignored as orbax's own deleter does: nothing lists these files, and what
            # stays is tried again at the next call.
            shutil.rmtree(os.path.join(self.directory, _DELETING), ignore_errors=True)

    def close(self) -> None:
        """Wait for the save still running (raising its failure), and release orbax's
        threads: closed either way."""
        try:
            self.join()
        finally:
            self._mngr.close()

    def _save_error(self, step, e: Exception) -> CheckpointSaveError:
        return CheckpointSaveError(
            f"saving checkpoint step {step} in {self.directory} failed: "
            f"{type(e).__name__}: {e}. Step {step} is not saved; the steps saved before it "
            f"({self.all_steps()}) are untouched: fix the cause (disk space, permissions) and "
            f"save the step again"
        )

    def _snapshot(self, state):
        if not isinstance(state, dict):
            raise CheckpointStateError(
                f"a checkpoint state is a dict of str names to its parts, got a "
                f"{type(state).__name__}"
            )
        for k in state:
            if not isinstance(k, str):
                raise CheckpointStateError(
                    f"a checkpoint state is a dict of str names to its parts, got the name {k!r}"
                )
        _run_pending()
        arrays, meta = {}, {"plain": {}, "host": [], "optimizers": {}, "rng": _rng_state()}
        specs = meta["specs"] = {}  # key -> the annotation its lazy tensor's data carries

        def kind(key: str, t: torch.Tensor) -> None:
            if not isinstance(t, LazyTensor):
                meta["host"].append(key)
            elif (spec := _annotation(t)) is not None:
                specs[key] = _spec_json(spec)

        for name, part in state.items():
            if isinstance(part, torch.nn.Module):
                arrays[name] = {k: _array_of(t) for k, t in part.state_dict().items()}
                for k, t in part.state_dict().items():
                    kind(f"{name}/{k}", t)
            elif isinstance(part, torch.optim.Optimizer):
                sd = part.state_dict()
                tensors, plain = {}, {}
                for i, s in sd["state"].items():
                    for k, v in s.items():
                        if isinstance(v, torch.Tensor):
                            tensors.setdefault(str(i), {})[k] = _array_of(v)
                            kind(f"{name}/{i}/{k}", v)
                        else:
                            plain.setdefault(str(i), {})[k] = _plain(v, f"{name!r} state {i} {k!r}")
                arrays[name] = tensors
                groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
                meta["optimizers"][name] = {
                    "groups": _plain(groups, f"{name!r} param_groups"),
                    "plain": plain,
                    "indices": sorted(int(i) for i in sd["state"]),
                    "keys": {str(i): list(s) for i, s in sd["state"].items()},
                }
            elif isinstance(part, torch.Tensor):
                arrays[name] = {"": _array_of(part)}
                kind(f"{name}/", part)
            else:
                meta["plain"][name] = _plain(part, repr(name))
        return arrays, meta

    # -- restoring -------------------------------------------------------------------------

    def restore(self, step, state) -> int:
        """Restore ``step`` (None: the latest) into ``state`` (as ``save`` took it, or a part
        of it): tensors rebound to the saved data placed as the running state had it (module
        docstring), optimizers loaded, plain values written back into ``state``. Returns the
        step. A save still running is waited for first (and its failure raised: class
        docstring)."""
        self.join()
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise CheckpointNotFoundError(
                    f"no complete checkpoint in {self.directory}; restore(None, ...) takes the "
                    f"latest, and there is none"
                )
            step = steps[-1]
        if step not in steps:
            raise CheckpointNotFoundError(
                f"no checkpoint of step {step} in {self.directory}; the complete ones are {steps}"
            )
        ocp = self._ocp
        meta = self._read_meta(step)
        try:  # (no arrays item: the state saved held no tensor)
            saved = self._mngr.item_metadata(step).get("arrays") or {}
        except Exception as e:
            raise CheckpointReadError(
                f"checkpoint {step} in {self.directory} cannot be read: {e}"
            ) from e
        _run_pending()
        targets = self._targets(state, meta)
        default = _replicated(_placed(targets))
        try:  # (absent from checkpoints written before annotations were saved)
            specs = {k: _spec_of_json(v) for k, v in meta.get("specs", {}).items()}
        except Exception as e:
            raise CheckpointReadError(
                f"checkpoint step {step}: the shardings in its meta file cannot be read "
                f"({type(e).__name__}: {e}); restore another step ({steps})"
            ) from e
        abstract = _check(targets, saved, default, specs)
        restored = {}
        if abstract:  # (orbax refuses an empty tree, as in save_async)
            try:
                # What the state does not name is not read (a partial restore: the weights
                # alone, from a checkpoint of a training run).
                arrays = ocp.args.PyTreeRestore(
                    abstract,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                    partial_restore=True,
                )
                restored = self._mngr.restore(step, args=ocp.args.Composite(arrays=arrays))[
                    "arrays"
                ]
            except Exception as e:
                raise CheckpointReadError(
                    f"checkpoint {step} in {self.directory} cannot be read: {e}"
                ) from e
        for name, part in targets.items():  # everything checked and read: assign
            if isinstance(part, _OptimizerTarget):
                part.load(restored.get(name, {}), meta)
            else:
                for k, entry in part.items():
                    a = restored[name][k]
                    entry.assign(np.asarray(a) if entry.sharding is None else a)
        for name, value in meta["plain"].items():
            if name in state:
                state[name] = _unplain(value)
        _restore_rng(meta["rng"])
        return step

    def _read_meta(self, step: int) -> dict:
        """The ``meta`` item of ``step``, checked to be shaped as ``_snapshot`` writes it: a
        damaged file is named here, not met as a KeyError halfway through a restore."""
        path = os.path.join(self.directory, str(step), "meta", _META_FILE)
        others = [s for s in self.all_steps() if s != step]
        fix = (
            "a step restores only from the meta file its save wrote: restore another step "
            f"({others})"
        )
        try:
            meta = self._mngr.restore(
                step, args=self._ocp.args.Composite(meta=self._ocp.args.JsonRestore())
            )["meta"]
        except Exception as e:
            if not os.path.exists(path):
                what = "is missing"
            elif isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):
                what = f"is not JSON, truncated or overwritten ({type(e).__name__}: {e})"
            else:
                what = f"cannot be read ({type(e).__name__}: {e})"
            raise CheckpointReadError(
                f"checkpoint step {step}: its meta file {path} {what}; {fix}"
            ) from e
        wrong = _meta_problem(meta)
        if wrong is not None:
            raise CheckpointReadError(
                f"checkpoint step {step}: its meta file {path} is JSON but not what save "
                f"writes ({wrong}); {fix}"
            )
        return meta

    def _targets(self, state, meta) -> dict:
        """Per part of ``state``: ``{key: _Entry}`` for tensors, or an assignment function."""
        out = {}
        for name, part in state.items():
            if isinstance(part, torch.nn.Module):
                own = dict(part.named_parameters())
                own.update(part.named_buffers())
                out[name] = {
                    k: _Entry(own.get(k, t)) for k, t in part.state_dict(keep_vars=True).items()
                }
                restacks: dict = {}
                rows = {k: at for k, at in stacked_rows(part).items() if k in out[name]}
                for owner, flat, i in rows.values():
                    r = restacks.get((id(owner), flat))
                    if r is None:
                        r = restacks[(id(owner), flat)] = _Restack(owner, flat)
                    r.rows[i] = None  # (a row to wait for)
                for k, (owner, flat, i) in rows.items():
                    r, entry = restacks[(id(owner), flat)], out[name][k]
                    entry.assign = lambda a, r=r, i=i, e=entry: r.take(i, e.spec, a)
            elif isinstance(part, torch.optim.Optimizer):
                out[name] = _OptimizerTarget(part, meta, name)
            elif isinstance(part, torch.Tensor):
                out[name] = {"": _Entry(part)}
            elif name not in meta["plain"]:
                raise CheckpointKeyError(
                    f"the checkpoint has no {name!r}; it has {sorted(meta['plain'])}"
                )
        return out


class _OptimizerTarget:
    """An optimizer's part of a restore: its state's entries placed as the running state's are
    (``abstract``), made in the order the running optimizer made them (``load``)."""

    def __init__(self, opt, meta: dict, name):
        optimizers = meta["optimizers"]
        saved = optimizers.get(name)
        if saved is None:
            raise CheckpointKeyError(
                f"the checkpoint has no optimizer {name!r}; it has {sorted(optimizers)}"
            )
        self.opt, self.saved, self.name, self.host = opt, saved, name, set(meta["host"])
        params = [p for g in opt.param_groups for p in g["params"]]
        if len(saved["groups"]) != len(opt.param_groups) or any(
            len(s["params"]) != len(g["params"])
            for s, g in zip(saved["groups"], opt.param_groups, strict=True)
        ):
            raise CheckpointMismatchError(
                f"optimizer {name!r}: the checkpoint's parameter groups hold "
                f"{[len(s['params']) for s in saved['groups']]} parameters, this optimizer's "
                f"{[len(g['params']) for g in opt.param_groups]}"
            )
        self.params = params
        self.placed: dict = {}  # (index, key) -> (placement, annotation) (abstract())
        self.order: dict = {}  # index -> its state's keys in the order made (_check_keys)

    def shardings(self) -> list:
        return [_sharding_of(p) for p in self.params if isinstance(p, LazyTensor)]

    def _check_keys(self, saved_arrays) -> None:
        """``order``: per parameter, the order its state was made in, checked to name exactly
        what was saved (a damaged meta file is named here, before anything is assigned);
        saved order where the checkpoint has none (written before it)."""
        keys = self.saved.get("keys", {})
        plain = self.saved["plain"]
        for i in self.saved["indices"]:
            order = keys.get(str(i)) if isinstance(keys, dict) else keys
            have = [*saved_arrays.get(str(i), {}), *plain.get(str(i), {})]
            if order is not None and (not isinstance(order, list) or set(order) != set(have)):
                raise CheckpointReadError(
                    f"optimizer {self.name!r}: the meta file's state keys of parameter {i} "
                    f"are {order!r}, its saved state {sorted(have)}: the meta file is not what "
                    f"save writes"
                )
            self.order[i] = have if order is None else order

    def abstract(self, saved_arrays, default, specs: dict) -> dict:
        """The restore's tree for this optimizer's state, placed as the running state is
        (``_placement``): a host tensor when it was saved from one (a CPU step count); else
        as it was saved, on the same mesh; else with the parameter's shape (moments), placed
        and annotated like its parameter, and other shapes (a capturable step count) as a
        program leaves them, unannotated on the ``default`` placement."""
        self._check_keys(saved_arrays)
        host = self.host
        tree = {}
        for i, keys in saved_arrays.items():
            p = self.params[int(i)]
            for k, m in keys.items():
                sharding, spec = None, None
                key = f"{self.name}/{i}/{k}"
                if isinstance(p, LazyTensor) and key not in host:
                    if tuple(m.shape) == tuple(p.shape):
                        sharding, spec = _sharding_of(p), _annotation(p)
                    sharding, spec = _placement(
                        specs.get(key), p._spec, sharding, spec, default, len(m.shape)
                    )
                self.placed[(i, k)] = (sharding, spec)
                tree.setdefault(i, {})[k] = _abstract(tuple(m.shape), m.dtype, sharding)
        return tree

    def load(self, arrays: dict, meta) -> None:
        """Load the restored state into the optimizer, each parameter's entries made in the
        order the running optimizer made them (the saved ``keys``): a step's program lists
        its results in the order their tensors were made, and a resumed run is to meet the
        programs the uninterrupted one compiled."""
        host = self.host
        sd = {"state": {}, "param_groups": _unplain(self.saved["groups"])}
        for i in self.saved["indices"]:
            tensors, plain = arrays.get(str(i), {}), self.saved["plain"].get(str(i), {})
            s = {}
            for k in self.order.get(i, [*tensors, *plain]):
                if k in plain:
                    s[k] = _unplain(plain[k])
                    continue
                a = tensors[k]
                if f"{self.name}/{i}/{k}" in host:  # saved from a host tensor (a CPU step)
                    s[k] = host_tensor(np.asarray(a), name_of(np.asarray(a).dtype))
                else:  # (host data where its parameter holds host data too)
                    sharding, spec = self.placed.get((str(i), k), (None, None))
                    s[k] = LazyTensor(_value_of(a if sharding else np.asarray(a), spec))
            sd["state"][i] = s
        before = [dict(g) for g in self.opt.param_groups]
        self.opt.load_state_dict(sd)
        _keep_hyperparameter_tensors(before, self.opt.param_groups)


def _keep_hyperparameter_tensors(before: list, after: list) -> None:
    """A hyperparameter held in a tensor (``lr=torch.tensor(1e-3)``) keeps its tensor, the
    saved value copied in: torch's ``load_state_dict`` replaces it with the restored one, and
    whoever holds the running one (a scheduler's caller, a compiled step's program input) would
    be left with a tensor the optimizer no longer reads."""
    with torch.no_grad():
        for old, new in zip(before, after, strict=True):
            for k, was in old.items():
                now = new.get(k)
                if not isinstance(was, torch.Tensor) or was is now:
                    continue
                if isinstance(now, (int, float)) and not isinstance(now, bool):
                    was.fill_(now)  # (saved from a run that held the value in a number)
                elif not (
                    isinstance(now, torch.Tensor)
                    and was.shape == now.shape
                    and was.dtype == now.dtype
                    and type(was) is type(now)
                ):
                    continue
                elif type(was) is LazyTensor:
                    was._set(now._ir)  # (its value, with no op recorded)
                else:
                    was.copy_(now)
                new[k] = was


def _meta_problem(meta) -> str | None:
    """What makes ``meta`` other than ``_snapshot`` writes it (its keys and their JSON types,
    the random streams' and each optimizer's too), or None."""

    def problem(d, keys: dict, where: str) -> str | None:
        if not isinstance(d, dict):
            return f"{where} is a {type(d).__name__}, not a dict"
        for k, kind in keys.items():
            if k not in d:
                return f"{where} has no {k!r}; it has {sorted(d)}"
            if not isinstance(d[k], kind):
                return f"{where}[{k!r}] is a {type(d[k]).__name__}, not a {kind.__name__}"
        return None

    if (found := problem(meta, _META, "the top level")) is not None:
        return found
    inner = [("'rng'", meta["rng"], _META_RNG)]
    inner += [(f"optimizer {n!r}", o, _META_OPTIMIZER) for n, o in meta["optimizers"].items()]
    return next(filter(None, (problem(d, keys, where) for where, d, keys in inner)), None)


def _placed(targets: dict) -> list:
    """The placements of the lazy tensors of a restore's state (``_replicated``)."""
    out = []
    for part in targets.values():
        if isinstance(part, _OptimizerTarget):
            out += part.shardings()
        elif isinstance(part, dict):
            out += [e.sharding for e in part.values() if e.lazy]
    return [s for s in out if s is not None]


def _check(targets: dict, saved, default, specs: dict) -> dict:
    """The restore's abstract tree, after checking every key, shape and dtype against the
    checkpoint's; the first mismatch is named with both sides."""
    abstract = {}
    for name, part in targets.items():
        if not (isinstance(part, dict) or isinstance(part, _OptimizerTarget)):
            continue
        have = saved.get(name) if hasattr(saved, "get") else None
        if have is None:
            raise CheckpointKeyError(f"the checkpoint has no {name!r}; it has {sorted(saved)}")
        if isinstance(part, _OptimizerTarget):
            abstract[name] = part.abstract(have, default, specs)
            continue
        missing = [k for k in part if k not in have]
        extra = [k for k in have if k not in part]
        if missing or extra:
            first = (missing or extra)[0]
            side = "the checkpoint lacks" if missing else "the target lacks"
            raise CheckpointKeyError(
                f"{name!r}: {side} {first!r} (and {len(missing) + len(extra) - 1} more); a "
                f"restore takes the keys the checkpoint was saved with, no more, no fewer"
            )
        tree = {}
        for k, entry in part.items():
            entry.place(default, specs.get(f"{name}/{k}"))
            m = have[k]
            if tuple(m.shape) != entry.shape or str(np.dtype(m.dtype)) != entry.dtype:
                raise CheckpointMismatchError(
                    f"{name!r} {k!r}: the checkpoint holds {list(m.shape)} {np.dtype(m.dtype)}, "
                    f"the target {list(entry.shape)} {entry.dtype}"
                )
            tree[k] = _abstract(entry.shape, m.dtype, entry.sharding)
        abstract[name] = tree
    return abstract


def _abstract(shape, dtype, sharding):
    if sharding is None:  # a host tensor: restored to host memory
        return np.zeros(shape, np.dtype(dtype))
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=sharding)


def _run_pending() -> None:
    """Pending work first: what is saved or restored into is data."""
    if any(type(t._ir.node) is not DeviceData for t in live()):
        _step.mark_step()


def _rng_state() -> dict:
    step, offset = _rng.state()
    return {
        "seed": torch.initial_seed(),
        "step": step,
        "offset": offset,
        "torch": torch.get_rng_state().tolist(),
    }


def _restore_rng(saved: dict) -> None:
    torch.set_rng_state(torch.tensor(saved["torch"], dtype=torch.uint8))
    _rng.restore(saved["step"], saved["offset"])


def consolidated_state_dict(module: torch.nn.Module) -> dict:
    """An ordinary CPU ``state_dict`` of ``module`` (every tensor gathered to this host), for
    ``torch.save``, safetensors or Hugging Face."""
    _run_pending()
    return {
        k: (_step.to_torch(v) if isinstance(v, LazyTensor) else v)
        for k, v in module.state_dict().items()
    }


__all__ = ["CheckpointManager", "consolidated_state_dict"]
