"""Plans: ``parallelize_module`` with torch's parallel styles, FSDP2's ``fully_shard``, and a
Hugging Face model's ``tp_plan`` (``apply_tp_plan``), on a mesh of ``ir_runtime.device_mesh``.

A style is read, not run: torch's styles run per rank on shards (``from_local``, collectives
on process groups); here each becomes the placements it stands for, on global tensors:

- ``ColwiseParallel``: a ``Linear``'s weight and bias ``Shard(0)`` (an ``Embedding``'s weight
  ``Shard(1)``); its input placed as ``input_layouts`` then ``desired_input_layouts``, its
  output as ``output_layouts``.
- ``RowwiseParallel``: a ``Linear``'s weight ``Shard(1)``, bias replicated (an ``Embedding``'s
  weight ``Shard(0)``, its input replicated); its output as ``output_layouts`` (``Replicate()``
  is the all-reduce, ``Shard(1)`` the reduce-scatter of sequence parallelism).
- ``SequenceParallel``: parameters replicated; input and output ``Shard(sequence_dim)``.
- ``PrepareModuleInput`` / ``PrepareModuleOutput`` / ``PrepareModuleInputOutput``: each input
  (positional or keyword) or output placed as its layout, then as its desired layout.
- ``use_local_output`` changes nothing: a module's output is the global tensor either way, so
  the per-rank lines of torch's tutorial that divide ``n_heads`` by the TP size must go (kept,
  they fail with a shape error at the first ``view``).
- A style of the user's own (a subclass that overrides ``_apply``) runs its ``_apply``, whose
  ``distribute_module`` / ``distribute_tensor`` calls come here.

Activations are constrained with their gradients (the gradient placed as the activation was),
as ``DTensor`` redistributes a gradient back; on a sub-mesh, the dims a placement does not split
are left to XLA (the root's other axes, such as data parallelism's, are the rest of the
program's to choose).
"""

from __future__ import annotations

import fnmatch
import warnings
import weakref

import torch
from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.distributed.tensor.parallel.style import ParallelStyle
from torch.utils.weak import WeakIdKeyDictionary

from ir_runtime._frontend.parallel import _placements as P
from ir_runtime._frontend.parallel._dtensor import place
from ir_runtime._frontend.parallel._mesh import LazyDeviceMesh, as_lazy_mesh
from ir_runtime._frontend.recording._api import to_lazy
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._frontend.regions._stack import stack_of
from ir_sharding import ShardingError

_TORCH_STYLES = (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    PrepareModuleInputOutput,
)


# -- activations ----------------------------------------------------------------------------


def _layout(x, mesh, layout, desired, what):
    """``x`` placed as ``layout``, then as ``desired`` (None: as it is); not a tensor: as is."""
    if not isinstance(x, torch.Tensor):
        return x
    if layout is not None and not isinstance(layout, Partial):
        x = P.constrain(x, mesh, (layout,), (layout,), what)
    if desired is not None and desired != layout:
        x = P.constrain(x, mesh, (desired,), (desired,), what)
    return x


def _inputs_hook(module, mesh, layouts, desired, what):
    def hook(mod, args):
        return tuple(
            _layout(a, mesh, lay, want, f"{what}: input {i}")
            for i, (a, lay, want) in enumerate(
                zip(args, _pad(layouts, args), _pad(desired, args), strict=True)
            )
        )

    return hook


def _kwargs_hook(module, mesh, layouts, desired, kw_layouts, kw_desired, what):
    positional = _inputs_hook(module, mesh, layouts, desired, what)

    def hook(mod, args, kwargs):
        args = positional(mod, args)
        kwargs = dict(kwargs)
        for name, lay in kw_layouts.items():
            if name in kwargs:
                kwargs[name] = _layout(
                    kwargs[name], mesh, lay, kw_desired.get(name), f"{what}: input {name!r}"
                )
        return args, kwargs

    return hook


def _pad(layouts, values) -> tuple:
    """One layout per value (None past the layouts given); more layouts than values is
    torch's error."""
    layouts = tuple(layouts)
    if len(layouts) > len(values):
        raise ShardingError(
            f"{len(layouts)} layout(s) {list(layouts)} for {len(values)} value(s): the module's "
            f"inputs (outputs) and their layouts must have the same length"
        )
    return layouts + (None,) * (len(values) - len(layouts))


def _outputs_hook(mesh, layouts, desired, what):
    def hook(mod, inputs, outputs):
        if isinstance(outputs, torch.Tensor):
            return _layout(outputs, mesh, layouts[0], desired[0] if desired else None, what)
        if isinstance(outputs, tuple):
            return tuple(
                _layout(o, mesh, lay, want, f"{what}: output {i}")
                for i, (o, lay, want) in enumerate(
                    zip(outputs, _pad(layouts, outputs), _pad(desired or (), outputs), strict=True)
                )
            )
        return outputs

    return hook


# -- styles -> actions (everything checked before anything changes) ---------------------------


def _param_actions(module, mesh, placements_of, path):
    """One action per parameter: placed as ``placements_of(name, param)`` on ``mesh``; the spec
    is computed now, so a dim that does not divide is refused before any change."""
    actions = []
    for name, p in module.named_parameters(recurse=False):
        placements = P.check_placements(mesh, placements_of(name, p), p.dim(), f"{path}.{name}")
        base = p._spec if isinstance(p, LazyTensor) else None  # (as place() will compute it)
        what = f"{path}.{name} {tuple(p.shape)}"
        P.spec_for(mesh, placements, tuple(p.shape), base=base, what=what)
        actions.append(lambda m=module, n=name, pl=placements: _place_param(m, n, mesh, pl))
    return actions


def _place_param(module, name, mesh, placements):
    place(module._parameters[name], mesh, placements, name)


def _linear_or_embedding(module, style, path):
    if not isinstance(module, nn.Linear | nn.Embedding):
        raise ShardingError(
            f"{type(style).__name__} on {path or 'the module'}: a {type(module).__name__}; it "
            f"shards an nn.Linear or an nn.Embedding (torch's rule; PrepareModuleInput/Output "
            f"place other modules' activations)"
        )


def _style_actions(style, module, mesh, path) -> list:
    what = f"{type(style).__name__} on {path or 'the module'}"
    if not isinstance(style, ParallelStyle):
        raise ShardingError(
            f"parallelize_module: the plan gives {path or 'the module'} {style!r}, not a "
            f"ParallelStyle"
        )
    base = next((c for c in type(style).__mro__ if c in _TORCH_STYLES), None)
    if base is None:  # a ParallelStyle of the user's own: its _apply, through the routes
        return [lambda: style._apply(module, mesh)]
    overridden = sorted(
        name
        for cls in type(style).__mro__[: type(style).__mro__.index(base)]
        for name in vars(cls)
        if name in vars(base)
        and callable(getattr(base, name))
        and name.startswith("_")
        and not name.startswith("__")
    )
    if overridden:
        raise ShardingError(
            f"{type(style).__name__} on {path or 'the module'} overrides {overridden} of "
            f"{base.__name__}: those run per rank on shards, and are not run on global "
            f"tensors here; use {base.__name__} itself, or a ParallelStyle whose _apply places "
            f"the tensors (distribute_tensor, redistribute)"
        )
    hooks = []
    if isinstance(style, ColwiseParallel | RowwiseParallel):
        _linear_or_embedding(module, style, path)
        embedding = isinstance(module, nn.Embedding)
        if isinstance(style, ColwiseParallel):
            dims = {"weight": 1 if embedding else 0, "bias": 0}
            desired = style.desired_input_layouts
        else:
            dims = {"weight": 0 if embedding else 1, "bias": None}
            desired = (Replicate(),) if embedding else (Shard(-1),)

        def placements_of(name, p):
            d = dims.get(name)
            return (Shard(d),) if d is not None else (Replicate(),)

        params = _param_actions(module, mesh, placements_of, path)
        pre = _inputs_hook(module, mesh, style.input_layouts, desired, what)
        post = _outputs_hook(mesh, style.output_layouts, None, what)
        hooks = [
            lambda: module.register_forward_pre_hook(pre),
            lambda: module.register_forward_hook(post),
        ]
        return params + hooks
    if isinstance(style, SequenceParallel):
        params = _param_actions(module, mesh, lambda n, p: (Replicate(),), path)
        seq = style.sequence_sharding
        pre = _inputs_hook(module, mesh, seq, (), what)
        post = _outputs_hook(mesh, seq, None, what)
        return [
            *params,
            lambda: module.register_forward_pre_hook(pre),
            lambda: module.register_forward_hook(post),
        ]
    actions = []
    inputs = style.prepare_module_input if isinstance(style, PrepareModuleInputOutput) else style
    outputs = style.prepare_module_output if isinstance(style, PrepareModuleInputOutput) else style
    if isinstance(inputs, PrepareModuleInput):
        if inputs.with_kwargs:
            pre = _kwargs_hook(
                module,
                mesh,
                inputs.input_layouts,
                inputs.desired_input_layouts,
                inputs.input_kwarg_layouts,
                inputs.desired_input_kwarg_layouts,
                what,
            )
            actions.append(lambda: module.register_forward_pre_hook(pre, with_kwargs=True))
        else:
            pre = _inputs_hook(
                module, mesh, inputs.input_layouts, inputs.desired_input_layouts, what
            )
            actions.append(lambda: module.register_forward_pre_hook(pre))
    if isinstance(outputs, PrepareModuleOutput):
        post = _outputs_hook(mesh, outputs.output_layouts, outputs.desired_output_layouts, what)
        actions.append(lambda: module.register_forward_hook(post))
    return actions


def _resolve(module: nn.Module, plan: dict, what: str) -> list:
    """``(submodule, path, style)`` for every plan entry, the keys matched token by token with
    ``fnmatch`` as torch does; a key that matches no submodule is refused."""
    out = []
    for key, style in plan.items():
        matched = [(module, "")]
        if key:
            for token in key.split("."):
                matched = [
                    (child, f"{path}.{name}" if path else name)
                    for m, path in matched
                    for name, child in m.named_children()
                    if fnmatch.fnmatch(name, token)
                ]
                if not matched:
                    raise ShardingError(
                        f"{what}: plan key {key!r} names no submodule of "
                        f"{type(module).__name__}: nothing matches {token!r} (nothing was "
                        f"changed)"
                    )
        out.extend((m, path, style) for m, path in matched)
    return out


def parallelize_module(module, device_mesh=None, parallelize_plan=None, *, src_data_rank=0):
    """torch's ``parallelize_module`` on a mesh of ``ir_runtime.device_mesh`` (module
    docstring). Every entry of the plan is checked (its key names a submodule, its style fits
    the module, its placements divide the parameters) before any is applied. ``src_data_rank``
    is accepted: parameters are global tensors, from no rank in particular."""
    mesh = as_lazy_mesh(device_mesh, "parallelize_module")
    if mesh.ndim != 1:
        raise ShardingError(
            f"parallelize_module takes a 1-d mesh (torch's rule), got {mesh.ndim} dims "
            f"{mesh.mesh_dim_names}: pass a sub-mesh such as mesh[{mesh.mesh_dim_names[-1]!r}]"
        )
    if parallelize_plan is None:
        warnings.warn(
            "No parallelize_plan is provided: parallelize_module does nothing", stacklevel=2
        )
        return module
    plan = parallelize_plan if isinstance(parallelize_plan, dict) else {"": parallelize_plan}
    actions = [
        action
        for sub, path, style in _resolve(module, plan, "parallelize_module")
        for action in _style_actions(style, sub, mesh, path)
    ]
    to_lazy(module)
    for action in actions:
        action()
    return module


# -- Hugging Face tp_plan ---------------------------------------------------------------------

_R, _S = Replicate(), Shard


def _hf_style(name: str):
    colwise = {"colwise", "unit_colwise", "packed_colwise"}
    rowwise = {"rowwise", "unit_rowwise", "packed_rowwise"}
    if name in colwise:
        return ColwiseParallel(input_layouts=_R, output_layouts=_S(-1))
    if name in ("colwise_rep", "colwise_gather_output", "embedding_colwise"):
        return ColwiseParallel(input_layouts=_R, output_layouts=_R)
    if name in rowwise:
        return RowwiseParallel(input_layouts=_S(-1), output_layouts=_R)
    if name in ("rowwise_rep", "rowwise_split_input", "embedding_rowwise"):
        return RowwiseParallel(input_layouts=_R, output_layouts=_R)
    if name == "sequence_parallel":
        return SequenceParallel(use_local_output=True)
    if name in _REPLICATED:
        return _Replicated()
    return None


_REPLICATED = ("replicate", "local_params", "replicated_with_grad_allreduce", "all_reduce")
HF_STYLES = (
    "colwise",
    "unit_colwise",
    "packed_colwise",
    "colwise_rep",
    "colwise_gather_output",
    "embedding_colwise",
    "rowwise",
    "unit_rowwise",
    "packed_rowwise",
    "rowwise_rep",
    "rowwise_split_input",
    "embedding_rowwise",
    "sequence_parallel",
    *_REPLICATED,
)


class _Replicated(ParallelStyle):
    """transformers' ``replicate`` / ``local_params``: every parameter whole on every device."""

    def _apply(self, module, device_mesh):
        for p in module.parameters(recurse=False):
            place(p, device_mesh, (Replicate(),), "replicate")
        return module


def _hf_plan(model) -> dict:
    plan = getattr(model, "tp_plan", None)
    if plan is None:
        plan = getattr(model, "_tp_plan", None)
    if plan is None:
        config = getattr(model, "config", None)
        plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        raise ShardingError(
            f"apply_tp_plan: {type(model).__name__} has no tensor-parallel plan (tp_plan, "
            f"config.base_model_tp_plan): pass plan="
        )
    return dict(plan)


def apply_tp_plan(model: nn.Module, mesh: LazyDeviceMesh, plan: dict | None = None):
    """Apply a Hugging Face model's tensor-parallel plan (``model.tp_plan``: its
    ``config.base_model_tp_plan`` and the head's entries) on ``mesh`` (a 1-d mesh, or the
    ``"tp"`` dim of a larger one): each style name becomes the torch style it stands for
    (``colwise`` -> ``ColwiseParallel(output_layouts=Shard(-1))``, ``rowwise`` ->
    ``RowwiseParallel()``, ``colwise_gather_output`` / ``colwise_rep`` -> ``ColwiseParallel(
    output_layouts=Replicate())``, ``embedding_rowwise`` -> ``RowwiseParallel(input_layouts=
    Replicate())`` on the embedding, ``sequence_parallel`` -> ``SequenceParallel()``,
    ``replicate`` / ``local_params`` -> replicated parameters, ...: ``HF_STYLES``), applied as
    ``parallelize_module`` applies a plan, every entry checked before any is applied.
    transformers' own entry point (``from_pretrained(tp_plan="auto")``) builds a mesh of
    process groups, one rank per process, which a single controller does not have."""
    mesh = as_lazy_mesh(mesh, "apply_tp_plan")
    if mesh.ndim > 1:
        if "tp" not in (mesh.mesh_dim_names or ()):
            raise ShardingError(
                f"apply_tp_plan: a {mesh.ndim}-d mesh {mesh.mesh_dim_names} needs a dim named "
                f"'tp' (or pass the 1-d sub-mesh)"
            )
        mesh = mesh["tp"]
    plan = _hf_plan(model) if plan is None else dict(plan)
    styles = {}
    for key, name in plan.items():
        style = _hf_style(name) if isinstance(name, str) else name
        if style is None:
            raise ShardingError(
                f"apply_tp_plan: plan entry {key!r}: {name!r} is not a style taken here "
                f"(taken: {', '.join(HF_STYLES)})"
            )
        styles[key] = style
    return parallelize_module(model, mesh, styles)


# -- FSDP2 ------------------------------------------------------------------------------------

_SHARDED: weakref.WeakSet = weakref.WeakSet()  # modules fully_shard took
_MANAGED = WeakIdKeyDictionary()  # parameters a fully_shard call took (by identity)


class _Cast(torch.autograd.Function):
    """A parameter cast for the forward (``param_dtype``); its gradient reduced in
    ``reduce_dtype`` and given back in the parameter's dtype."""

    @staticmethod
    def forward(ctx, p, dtype, reduce_dtype):
        ctx.dtypes = p.dtype, reduce_dtype
        return p.to(dtype)

    @staticmethod
    def backward(ctx, grad):
        original, reduce_dtype = ctx.dtypes
        if reduce_dtype is not None:
            grad = grad.to(reduce_dtype)
        return grad.to(original), None, None


class _Unit:
    """One ``fully_shard`` call's mixed precision: its parameters (``(module, name,
    parameter)`` where each is held) and its policy.

    With a ``param_dtype``, the unit's forward sees each parameter cast (``_Cast``): the
    unit's pre-forward hook puts the casts in the holders' ``_parameters`` and its post-forward
    hook (which runs on an error too) puts the parameters back. A holder's own forward, run
    outside the unit's (activation checkpointing's recompute, in the backward), casts its own
    parameters the same way, so a recompute computes what the forward did."""

    def __init__(self, params, mp_policy):
        self.params = params
        self.mp = mp_policy
        self.active: list = []  # the casts installed by the unit's forward, running
        self.by_owner: dict = {}  # id(holder) -> the casts its own forward installed

    def _install(self, params) -> list:
        mp, installed = self.mp, []
        for owner, name, p in params:
            if (
                owner._parameters.get(name) is p
                and p.is_floating_point()
                and p.dtype != mp.param_dtype
            ):
                owner._parameters[name] = _Cast.apply(p, mp.param_dtype, mp.reduce_dtype)
                installed.append((owner, name, p))
        return installed

    @staticmethod
    def _restore(installed) -> None:
        for owner, name, p in reversed(installed):
            owner._parameters[name] = p
        installed.clear()

    def pre_forward(self, module, args, kwargs):
        mp = self.mp
        self._restore(self.active)  # (what an interrupted forward left)
        if mp.param_dtype is not None:
            self.active = self._install(self.params)
            if mp.cast_forward_inputs:
                args, kwargs = _cast_floats((args, kwargs), mp.param_dtype)
        return args, kwargs

    def post_forward(self, module, args, output):
        self._restore(self.active)
        if self.mp.output_dtype is not None:
            return _cast_floats(output, self.mp.output_dtype)
        return output

    def owner_hooks(self, owner):
        mine = [(o, n, p) for o, n, p in self.params if o is owner]

        def pre(module, args):
            if not self.active:  # (outside the unit's forward: a recompute)
                self._restore(self.by_owner.get(id(owner), []))
                self.by_owner[id(owner)] = self._install(mine)

        def post(module, args, output):
            self._restore(self.by_owner.get(id(owner), []))

        return pre, post


def _cast_floats(tree, dtype):
    from torch.utils._pytree import tree_map

    return tree_map(
        lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x,
        tree,
    )


class LazyFSDPModule:
    """What ``fully_shard`` adds to a module's class, as torch's ``FSDPModule`` does. XLA
    schedules every gather and reduce-scatter inside the step's program, so the scheduling
    calls are accepted and change nothing: ``unshard``, ``reshard``,
    ``set_requires_gradient_sync`` (gradients of accumulated micro-batches are summed in the
    program whatever it says), ``set_reshard_after_forward``, ``set_reshard_after_backward``,
    ``set_is_last_backward``, ``set_modules_to_forward_prefetch``,
    ``set_modules_to_backward_prefetch``, ``set_requires_all_reduce``."""

    def unshard(self, async_op: bool = False):
        return None

    def reshard(self):
        return None

    def _accept(self, *args, **kwargs):
        return None

    set_requires_gradient_sync = set_reshard_after_forward = set_reshard_after_backward = _accept
    set_is_last_backward = set_modules_to_forward_prefetch = _accept
    set_modules_to_backward_prefetch = set_requires_all_reduce = set_unshard_in_backward = _accept


_CLASSES: dict = {}


def _fsdp_class(cls):
    if issubclass(cls, LazyFSDPModule):
        return cls
    made = _CLASSES.get(cls)
    if made is None:
        made = _CLASSES[cls] = type(f"FSDP{cls.__name__}", (LazyFSDPModule, cls), {})
    return made


def fully_shard(
    module,
    *,
    mesh=None,
    reshard_after_forward=None,
    shard_placement_fn=None,
    mp_policy=None,
    offload_policy=None,
    ignored_params=None,
    dp_mesh_dims=None,
):
    """FSDP2's ``fully_shard`` on a mesh of ``ir_runtime.device_mesh``: every parameter of
    ``module`` not taken by an inner ``fully_shard`` (nor in ``ignored_params``) sharded on dim
    0 (a stacked one of ``stack_layers``: dim 1, each layer's dim 0; or the ``Shard`` that
    ``shard_placement_fn`` returns) over ``mesh`` (a 2-d mesh: replicated
    over dim 0, sharded over dim 1, as HSDP), beside the placements tensor parallelism gave it;
    its gradient placed alike. ``mp_policy``: the parameters cast to ``param_dtype`` for the
    module's forward, gradients reduced in ``reduce_dtype``, floating inputs cast when
    ``cast_forward_inputs``, outputs to ``output_dtype``. ``reshard_after_forward`` is accepted:
    XLA schedules the gathers (and frees what it gathered) inside the program.
    Everything is checked before anything changes."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

    mesh = as_lazy_mesh(mesh, "fully_shard")
    modules = list(module) if isinstance(module, list | tuple) else [module]
    for m in modules:
        if not isinstance(m, nn.Module) or isinstance(m, nn.ModuleList | nn.ModuleDict):
            raise ShardingError(
                f"fully_shard takes a module with a forward (torch's rule), got {type(m).__name__}"
            )
        if m in _SHARDED:
            raise ShardingError(f"fully_shard: {type(m).__name__} is already fully sharded")
    if mesh.ndim not in (1, 2):
        raise ShardingError(f"fully_shard takes a 1-d or 2-d mesh, got {mesh.ndim} dims")
    if dp_mesh_dims is not None:
        raise ShardingError(
            "fully_shard: dp_mesh_dims is not taken here; pass the data-parallel sub-mesh "
            "(mesh=mesh['dp'], or mesh['replicate', 'shard'] for HSDP)"
        )
    if offload_policy is not None and type(offload_policy) is not OffloadPolicy:
        raise ShardingError(
            f"fully_shard: {type(offload_policy).__name__} is not taken here: XLA keeps "
            f"parameters in device memory"
        )
    if not (reshard_after_forward is None or isinstance(reshard_after_forward, bool | int)):
        raise ShardingError(
            f"fully_shard: reshard_after_forward is a bool or an int, got {reshard_after_forward!r}"
        )
    mp_policy = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    ignored = {id(p) for p in ignored_params or ()}
    owners: dict = {}
    for m in modules:
        for owner in m.modules():
            for name, p in owner._parameters.items():
                if p is None or id(p) in ignored or p in _MANAGED:
                    continue
                owners.setdefault(id(p), (p, []))[1].append((owner, name))
    plan = []
    for p, where in owners.values():
        # A stacked parameter (stack_layers) is split on each layer's dim 0, its dim 1: the
        # layer dim stays whole, so a scan's step reads its layer where it is.
        stacked = any(stack_of(o) is not None for o, _ in where)
        if stacked and mp_policy.param_dtype is not None:
            raise ShardingError(
                f"fully_shard: param_dtype casts a module's parameters around its forward, and "
                f"the stacked {where[0][1]} (stack_layers) is read by scan_layers, outside any "
                f"forward of its layers; cast the model, or leave the layers unstacked"
            )
        default = Shard(1) if stacked else Shard(0)
        shard = shard_placement_fn(p) if shard_placement_fn is not None else default
        if shard is None:
            shard = default
        if type(shard) is not Shard:
            raise ShardingError(
                f"fully_shard: shard_placement_fn gave {shard!r} for {where[0][1]}: a Shard"
            )
        placements = (shard,) if mesh.ndim == 1 else (Replicate(), shard)
        if p.dim() == 0 or (stacked and p.dim() == 1):  # (a scalar: on every device)
            placements = (Replicate(),) * mesh.ndim
        what = f"fully_shard: {where[0][1]} {tuple(p.shape)}"
        placements = P.check_placements(mesh, placements, p.dim(), what)
        base = p._spec if isinstance(p, LazyTensor) else None
        P.spec_for(mesh, placements, tuple(p.shape), base=base, what=what)
        plan.append((where, placements))
    for m in modules:
        to_lazy(m)
    managed = []
    for where, placements in plan:
        owner, name = where[0]
        p = owner._parameters[name]
        place(p, mesh, placements, name)
        managed.extend((o, n, p) for o, n in where)
    for _, _, p in managed:
        _MANAGED[p] = True
    unit = _Unit(managed, mp_policy)
    P.DATA_AXES.update((mesh._ir_mesh, a) for axes in mesh._axes for a in axes)
    for m in modules:
        _SHARDED.add(m)
        if mp_policy.param_dtype is not None or mp_policy.output_dtype is not None:
            m.register_forward_pre_hook(unit.pre_forward, with_kwargs=True)
            m.register_forward_hook(unit.post_forward, always_call=True)
        m.__class__ = _fsdp_class(type(m))
    if mp_policy.param_dtype is not None:
        for owner in {id(o): o for o, _, _ in managed}.values():
            pre, post = unit.owner_hooks(owner)
            owner.register_forward_pre_hook(pre)
            owner.register_forward_hook(post, always_call=True)
    return module
