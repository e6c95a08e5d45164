"""``stack_layers(layers)``: a stack's tensors stored stacked, one array per name, so that a
``scan_layers`` step's gradient and optimizer update run once per stack, not once per layer.

XLA's compile time grows with the number of arrays a program reads, updates and returns, not
only with the ops it runs: a 32-layer stack whose parameters are stored per layer compiles about
3x as long as the same stack stored stacked, even with the layers' forward as one scan (jax
shows the same: its own ``lax.scan`` step with per-layer parameters compiles as slowly). Storing
stacked is what JAX users do (Flax's ``nn.scan``, MaxText); this is that storage, for torch
modules.

``stack_layers(layers)``, on a ``ModuleList`` or ``Sequential`` of lazy layers of one structure
(``scan_layers``' rule), changes it in place and returns it:

- each parameter and buffer name of the layers (``mlp.fc1.weight``) becomes one tensor of the
  container with the layer as its first dim, named with ``__`` for the dots
  (``layers.mlp__fc1__weight``, ``[layers, *shape]``); it is what ``parameters()`` yields, so an
  optimizer made afterwards updates each name once per step;
- each layer's ``layer.mlp.fc1.weight`` is a view of its row (read fresh on each access:
  writes into it, ``reset_parameters()``, ``init.normal_`` write the stacked tensor);
- ``state_dict()`` has the per-layer keys it had (``layers.3.mlp.fc1.weight``), in the same
  order, and ``load_state_dict()`` takes them (a checkpoint of the unstacked model loads; a
  ``CheckpointManager`` module restores both ways);
- sharding annotations carry over with the layer dim unsplit; ``fully_shard`` splits a stacked
  parameter on its dim 1 (each layer's dim 0, as it split the layer's own parameter);
- the optimizer holds one parameter per name, so its ``state_dict()`` holds stacked state: an
  optimizer checkpoint of the unstacked model does not restore into it (the parameter counts
  differ, and are named). The gradient is the stacked parameter's ``.grad``; a layer's view has
  none (views are not leaves).

An optimizer's update of a stacked parameter is the per-layer update only when it is
elementwise: torch's SGD, Adam, AdamW, Adamax, Adagrad, Adadelta, RMSprop, Rprop, ASGD, NAdam,
RAdam and SparseAdam are (LBFGS updates all parameters at once, stacked or not). Adafactor and
Muon normalize each parameter as a whole, and any other optimizer class may: such an
optimizer's ``step()`` over a stacked parameter raises (by exact class; ``STACK_SAFE_OPTIMIZERS``
takes a class the user knows is elementwise). An optimizer made before ``stack_layers`` (or
``unstack_layers``) holds the parameters it replaced; its ``step()`` raises too, naming one.

Each layer keeps the row it was given, by a tag on its modules (``rows_of``): a layer deleted,
moved or replaced after stacking never reads, saves, loads or restores another's row, and a
replaced module keeps its own tensors; ``scan_layers`` refuses such a stack (``intact``).

Where the layers cannot be stored stacked, ``stack_layers`` leaves them as they were with one
``StackWarning`` naming why: a tensor shared between layers (tied), a name frozen in some layers
and not others, annotations that differ between layers, parameters ``fully_shard`` already
manages. ``scan_layers`` over stacked layers reads the stacked tensors (a contiguous run of them,
``layers[2:]``, as a slice); over layers mixed with others, it stacks their views per call, as
for unstacked layers, with one ``StackWarning``. ``unstack_layers(layers)`` gives each layer its
own tensors back.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.weak import WeakIdKeyDictionary

from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_sharding import ShardingKind, ShardingSpec

SEP = "__"  # a stacked tensor's name: the layer's dotted path with this for the dots


class StackWarning(UserWarning):
    """``stack_layers`` left layers unstacked, or ``scan_layers`` stacked views per call."""


# Optimizer classes whose update of a stacked parameter is each layer's update.
STACK_SAFE_OPTIMIZERS: set = {
    getattr(torch.optim, name)
    for name in (
        "SGD",
        "Adam",
        "AdamW",
        "Adamax",
        "Adagrad",
        "Adadelta",
        "RMSprop",
        "Rprop",
        "ASGD",
        "NAdam",
        "RAdam",
        "SparseAdam",
        "LBFGS",
    )
}

_STACKED = WeakIdKeyDictionary()  # stacked parameter -> its container's dotted name for errors
_RETIRED = WeakIdKeyDictionary()  # a per-layer parameter stack_layers replaced -> its name
_HOOK: list = []  # the optimizer step pre-hook's handle, registered on first use


class _Stack:
    """What ``stack_layers`` did to a container: the per-layer tensors' ``entries``
    ``(path, flat, is_parameter, persistent)`` in ``scan_layers``' order (parameters, then
    buffers), the layer ``count``, and the per-layer ``state_dict`` keys in their order."""

    __slots__ = ("count", "entries", "keys")

    def __init__(self, entries, count, keys):
        self.entries, self.count, self.keys = entries, count, keys

    def tensor(self, owner, flat):
        t = owner._parameters.get(flat)
        return owner._buffers[flat] if t is None else t


def stack_of(layers):
    """The ``_Stack`` of a container ``stack_layers`` stacked, else None."""
    return layers.__dict__.get("_irt_stack")


def layer_of(layer):
    """``(container, index)`` of a layer of a stacked container, else None."""
    return layer.__dict__.get("_irt_layer")


# -- the per-layer views ------------------------------------------------------------------------


class _Viewing:
    """Mixed into the class of each module that lost tensors to the stack: each lost name reads
    its row of the stacked tensor (or, while ``bound``, the tensor bound to it)."""

    def __setattr__(self, name, value):
        if name in type(self)._irt_names:
            _, index, prefix = self.__dict__["_irt_view"]
            raise AttributeError(
                f"{prefix}{name} of layer {index} is a view of the stacked tensor "
                f"{prefix.replace('.', SEP)}{name} (ir_runtime.stack_layers): write into it "
                f"(with torch.no_grad(): ....copy_(new)), or ir_runtime.unstack_layers the "
                f"layers first"
            )
        super().__setattr__(name, value)


def _view(name):
    def get(self):
        bound = self.__dict__.get("_irt_bound")
        if bound is not None and name in bound:
            return bound[name]
        owner, index, prefix = self.__dict__["_irt_view"]
        flat = (prefix + name).replace(".", SEP)
        return stack_of(owner).tensor(owner, flat).select(0, index)

    return property(get, doc=f"this layer's row of the stacked {name!r}")


_CLASSES: dict = {}


def _viewing_class(cls, names: tuple):
    key = (cls, names)
    made = _CLASSES.get(key)
    if made is None:
        body = {n: _view(n) for n in names}
        body["_irt_names"] = frozenset(names)
        body["__module__"] = cls.__module__
        body["__qualname__"] = cls.__qualname__
        made = _CLASSES[key] = type(cls.__name__, (_Viewing, cls), body)
    return made


@contextlib.contextmanager
def bound(layer, tensors: dict):
    """Within: ``layer``'s stacked names (its dotted paths, as ``entries``) read ``tensors``
    (the placeholders of ``scan_layers``' trace)."""
    subs = dict(layer.named_modules())
    touched = []
    try:
        for path, t in tensors.items():
            sub, _, name = path.rpartition(".")
            m = subs[sub]
            m.__dict__.setdefault("_irt_bound", {})[name] = t
            touched.append(m)
        yield
    finally:
        for m in touched:
            m.__dict__.pop("_irt_bound", None)


# -- stacking -----------------------------------------------------------------------------------


def _why_not(layers, tensors) -> str | None:
    """Why these layers cannot be stored stacked (None: they can)."""
    from ir_runtime._frontend.parallel._plans import _MANAGED

    seen = {}
    for i in range(len(layers)):
        for path, t in tensors[i]:
            if id(t) in seen:
                return f"{path} of layer {i} is the same tensor as {seen[id(t)]} (tied)"
            seen[id(t)] = f"{path} of layer {i}"
            if t in _MANAGED:
                return f"fully_shard manages {path} of layer {i}: stack the layers first"
    for j, (path, first) in enumerate(tensors[0]):
        for i in range(1, len(layers)):
            t = tensors[i][j][1]
            if t.requires_grad != first.requires_grad:
                return (
                    f"{path} requires grad in layer 0 and not in layer {i}, or the other way "
                    f"(a frozen layer)"
                )
            if t._spec != first._spec:
                return f"{path} is annotated differently in layer {i} than in layer 0"
        spec = first._spec
        if (
            spec is not None
            and spec.partition_spec is None
            and spec.kind != ShardingKind.REPLICATED
        ):
            return f"{path} carries a {spec.kind.name.lower()} sharding, which a stack cannot"
    return None


def _stacked_spec(spec):
    if spec is None:
        return None
    if spec.partition_spec is None:
        return ShardingSpec.replicated(spec.mesh)
    return ShardingSpec(spec.mesh, (None, *spec.partition_spec))


def stack_layers(layers):
    """Store ``layers``' tensors stacked, one per name (module docstring); returns ``layers``,
    changed in place (or unchanged with a ``StackWarning`` saying why not). Stacked already:
    nothing to do."""
    from ir_runtime._frontend.recording._api import annotate
    from ir_runtime._frontend.regions._scan import _check, _tensors

    if not isinstance(layers, torch.nn.ModuleList | torch.nn.Sequential):
        raise TypeError(
            f"stack_layers takes the ModuleList or Sequential that holds the layers (it keeps "
            f"the stacked tensors), got {type(layers).__name__}"
        )
    if stack_of(layers) is not None:
        return layers
    listed = _check(layers)
    if any(layer_of(layer) is not None for layer in listed):
        raise ValueError(
            "stack_layers: these layers belong to another stack already (ir_runtime."
            "unstack_layers that one first)"
        )
    for layer in listed:
        for name, m in layer.named_modules():
            if stack_of(m) is not None:
                raise ValueError(
                    f"stack_layers: {name or 'the layer'} of these layers is a stack already "
                    f"(ir_runtime.unstack_layers it first: stacks do not nest)"
                )
    tensors = [_tensors(layer) for layer in listed]
    why = _why_not(listed, tensors)
    if why is None and not tensors[0]:
        why = "the layers hold no parameters or buffers"
    if why is not None:
        warnings.warn(
            f"stack_layers: {why}; the layers keep their own tensors (scan_layers stacks them "
            f"per step)",
            StackWarning,
            stacklevel=2,
        )
        return layers
    first = listed[0]
    buffers = {n for n, _ in first.named_buffers()}
    keys = list(first.state_dict(keep_vars=True))
    persistent = set(keys)
    entries = []
    made = {}
    for j, (path, t0) in enumerate(tensors[0]):
        flat = path.replace(".", SEP)
        taken = layers._parameters, layers._buffers, layers._modules, made
        if any(flat in names for names in taken):
            raise ValueError(
                f"stack_layers: {path!r} would be named {flat!r}, which the container has "
                f"already (or another name of the layers gives)"
            )
        with torch.no_grad():
            data = torch.stack([row[j][1].detach() for row in tensors])
        if path in buffers:
            made[flat] = (data, False, path in persistent)
        else:
            p = torch.nn.Parameter(data, requires_grad=t0.requires_grad)
            p._view = None  # (Parameter detaches a temporary: no base to write)
            made[flat] = (p, True, True)
        spec = _stacked_spec(t0._spec)
        if spec is not None:
            annotate(made[flat][0], spec)
        entries.append((path, flat, path not in buffers, made[flat][2]))
    _compute([t for t, _, _ in made.values()])
    if not _HOOK:
        _HOOK.append(register_optimizer_step_pre_hook(_check_optimizer))
    # Everything is made: now the container changes.
    for flat, (t, is_param, keep) in made.items():
        if is_param:
            layers.register_parameter(flat, t)
            _STACKED[t] = flat
        else:
            layers.register_buffer(flat, t, persistent=keep)
    for i, layer in enumerate(listed):
        lost: dict = {}
        for path, _, is_param, _ in entries:
            sub, _, name = path.rpartition(".")
            m = layer.get_submodule(sub)
            if is_param:
                _RETIRED[m._parameters.pop(name)] = (f"{i}.{path}", "stack_layers", "a stacked one")
            else:
                m._buffers.pop(name)
                m._non_persistent_buffers_set.discard(name)
            lost.setdefault(sub, (m, []))[1].append(name)
        for sub, (m, names) in lost.items():
            m.__class__ = _viewing_class(type(m), tuple(names))
            m.__dict__["_irt_view"] = (layers, i, f"{sub}." if sub else "")
        layer.__dict__["_irt_layer"] = (layers, i)
    layers.__dict__["_irt_stack"] = _Stack(entries, len(listed), keys)
    layers.__dict__["_irt_hooks"] = (
        layers._register_state_dict_hook(_save_hook),
        layers._register_load_state_dict_pre_hook(_load_hook, with_module=True),
        layers.register_load_state_dict_post_hook(_loaded_hook),
    )
    return layers


def _compute(tensors) -> None:
    """Run the pending ``tensors`` now, as one program (the stacks, or the rows), so that the
    first step compiles the program every later step runs; the data others hold is kept."""
    from ir_runtime._frontend.steps import _step

    tensors = [t for t in tensors if _step.pending(t)]
    if tensors:
        busy, held = _step.split_live()
        _step.run(tensors, held | _step.read_besides(tensors, busy))


def unstack_layers(layers):
    """Give each layer of a stacked container its own tensors back: the row it reads (by its
    own tag, so a deleted or moved layer takes nothing from another), annotations without the
    layer dim; returns ``layers``. An optimizer of the stacked parameters then refuses to step.
    Not stacked: nothing to do."""
    from ir_runtime._frontend.recording._api import annotate

    stack = stack_of(layers)
    if stack is None:
        return layers
    rows = rows_of(layers)
    given = {}  # (flat, row) -> its own tensor, made before anything changes
    for _, _, flat, row in rows:
        if (flat, row) in given:
            continue
        t = stack.tensor(layers, flat)
        spec = t._spec
        if spec is not None and spec.partition_spec is not None:
            spec = ShardingSpec(spec.mesh, spec.partition_spec[1:])
        with torch.no_grad():
            r = t.detach()[row].clone()
        if flat in layers._parameters:
            r = torch.nn.Parameter(r, requires_grad=t.requires_grad)
            r._view = None
        if spec is not None:
            annotate(r, spec)
        given[(flat, row)] = r
    _compute(list(given.values()))
    keep = {flat: k for _, flat, _, k in stack.entries}
    for handle in layers.__dict__.pop("_irt_hooks"):
        handle.remove()
    for position, path, flat, row in rows:
        sub, _, name = path.rpartition(".")
        m = layers[position].get_submodule(sub)
        if isinstance(m, _Viewing):
            m.__class__ = type(m).__mro__[2]
            del m.__dict__["_irt_view"]
        if flat in layers._parameters:
            m.register_parameter(name, given[(flat, row)])
        else:
            m.register_buffer(name, given[(flat, row)], persistent=keep[flat])
    for layer in layers.modules():
        if isinstance(layer, _Viewing) and layer.__dict__["_irt_view"][0] is layers:
            layer.__class__ = type(layer).__mro__[2]  # (a layer no longer in the container)
            del layer.__dict__["_irt_view"]
        if layer.__dict__.get("_irt_layer", (None,))[0] is layers:
            del layer.__dict__["_irt_layer"]
    for _, flat, is_param, _ in stack.entries:
        if is_param:
            p = layers._parameters.pop(flat)
            _STACKED.pop(p, None)
            _RETIRED[p] = (flat, "unstack_layers", "each layer's own row")
        else:
            layers._buffers.pop(flat)
            layers._non_persistent_buffers_set.discard(flat)
    del layers.__dict__["_irt_stack"]
    return layers


# -- state_dict --------------------------------------------------------------------------------


def rows_of(layers) -> list:
    """``(position, path, flat, row)`` for each stacked name each layer at ``position`` of the
    container still reads from the stack (its module there is the view ``stack_layers`` made
    for that row): by the layers' own tags, so a deleted, moved or replaced layer or submodule
    is never given another's row (a replaced one has its own tensors, and keys)."""
    stack = stack_of(layers)
    out = []
    for position, layer in enumerate(layers):
        at = layer_of(layer)
        if at is None or at[0] is not layers:
            continue
        modules = dict(layer.named_modules())
        for path, flat, _, _ in stack.entries:
            sub, _, name = path.rpartition(".")
            m = modules.get(sub)
            view = None if m is None else m.__dict__.get("_irt_view")
            if view is not None and view[0] is layers and name in type(m)._irt_names:
                out.append((position, path, flat, view[1]))
    return out


def intact(layers) -> bool:
    """Whether every layer of the container reads every stacked name from its own row, in
    order: nothing deleted, moved or replaced since ``stack_layers``."""
    stack = stack_of(layers)
    rows = rows_of(layers)
    return (
        len(layers) == stack.count
        and len(rows) == stack.count * len(stack.entries)
        and all(position == row for position, _, _, row in rows)
    )


def _save_hook(module, state_dict, prefix, local_metadata):
    """The container's stacked entries as per-layer keys, each layer's in the order the
    unstacked layer had them (a replaced layer or submodule: its own tensors, as they come)."""
    stack = stack_of(module)
    mine = {k: state_dict.pop(k) for k in list(state_dict) if k.startswith(prefix)}
    stacked = {flat: mine.pop(f"{prefix}{flat}") for _, flat, _, keep in stack.entries if keep}
    rows = {(position, path): (flat, row) for position, path, flat, row in rows_of(module)}
    for position in range(len(module)):
        here = f"{prefix}{position}."
        for key in stack.keys:
            name = here + key
            if name in mine:
                state_dict[name] = mine.pop(name)
            elif (position, key) in rows:
                flat, row = rows[(position, key)]
                state_dict[name] = stacked[flat][row]
        for k in [k for k in mine if k.startswith(here)]:
            state_dict[k] = mine.pop(k)
    state_dict.update(mine)  # what is not a layer's: as it was


def _load_hook(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
    """Per-layer keys stacked into the container's entries, each into the row its layer reads
    (a row whose key is absent keeps its value, and the key is named missing)."""
    stack = stack_of(module)
    wanted: dict = {}  # flat -> {row: key}
    for position, path, flat, row in rows_of(module):
        wanted.setdefault(flat, {})[row] = f"{prefix}{position}.{path}"
    for _, flat, _, keep in stack.entries:
        keys = wanted.get(flat, {})
        if not keep or not any(k in state_dict for k in keys.values()):
            continue
        current = stack.tensor(module, flat)
        given = {row: torch.as_tensor(state_dict[k]) for row, k in keys.items() if k in state_dict}
        bad = [(keys[row], r) for row, r in given.items() if r.shape != current.shape[1:]]
        if bad:  # (torch's own message for a shape that does not fit; nothing changes)
            errors.append(
                f"size mismatch for {bad[0][0]}: copying a param with shape "
                f"{bad[0][1].shape} from checkpoint, the shape in current model is "
                f"{current.shape[1:]} (a row of the stacked {prefix}{flat})"
            )
            continue
        rows = []
        for row in range(stack.count):
            if row in given:
                del state_dict[keys[row]]
                rows.append(given[row])
            else:
                if row in keys:
                    missing.append(keys[row])
                rows.append(current.detach()[row])
        if any(isinstance(r, LazyTensor) for r in rows):
            rows = [r if isinstance(r, LazyTensor) else r.to(current.device) for r in rows]
        else:
            rows = [r.to(current.dtype) for r in rows]
        with torch.no_grad():
            state_dict[f"{prefix}{flat}"] = torch.stack(rows)


def _loaded_hook(module, incompatible):
    """After a load (``assign=True`` makes new tensors): the stacked parameters known again."""
    for _, flat, is_param, _ in stack_of(module).entries:
        if is_param:
            _STACKED[module._parameters[flat]] = flat


def stacked_rows(module) -> dict:
    """``{state_dict key: (container, flat, row)}`` for every per-layer key a stacked container
    within ``module`` reads from its stack (``CheckpointManager`` restores those into it)."""
    out = {}
    for name, m in module.named_modules():
        stack = stack_of(m)
        if stack is None:
            continue
        prefix = f"{name}." if name else ""
        keep = {path for path, _, _, k in stack.entries if k}
        for position, path, flat, row in rows_of(m):
            if path in keep:
                out[f"{prefix}{position}.{path}"] = (m, flat, row)
    return out


# -- optimizers ---------------------------------------------------------------------------------


def _check_optimizer(opt, args, kwargs):
    """Before each ``step()``: no parameter ``stack_layers`` replaced, and a stacked one only
    under an elementwise optimizer (module docstring)."""
    if not _STACKED and not _RETIRED:
        return
    for group in opt.param_groups:
        for p in group["params"]:
            retired = _RETIRED.get(p)
            if retired is not None:
                name, by, what = retired
                raise ValueError(
                    f"{type(opt).__name__} holds the parameter {name} that {by} replaced "
                    f"with {what}: make the optimizer after {by} (it would update a tensor the "
                    f"model no longer reads)"
                )
            flat = _STACKED.get(p)
            if flat is not None and type(opt) not in STACK_SAFE_OPTIMIZERS:
                raise ValueError(
                    f"{type(opt).__name__} updates the stacked parameter {flat} "
                    f"{list(p.shape)} (stack_layers): its update is each layer's only if it is "
                    f"elementwise, and {type(opt).__name__} is not known to be (Adafactor and "
                    f"Muon normalize a parameter as a whole). Leave these layers unstacked, or, "
                    f"if it is elementwise, add it to ir_runtime.STACK_SAFE_OPTIMIZERS"
                )


def register(p, flat: str) -> None:
    """``p`` is a stacked parameter named ``flat`` (a deep copy's, a loaded one's)."""
    if p not in _STACKED:
        _STACKED[p] = flat
