"""``scan_layers(layers, x)``: a stack of identical layers compiled once (torch_xla's name).

``scan_layers(layers, x)`` is ``for layer in layers: x = layer(x)``, recorded as one
``ir::scan_layers`` node (lowered by ``ir_runtime._lowering.regions.scan``): the first
layer's forward is traced once, on
placeholders for its input, parameters and buffers, and the stack runs as one ``lax.scan`` over
every layer's parameters, stacked. XLA compiles one layer, however deep the stack; compile time
stops growing with depth. Parameters stay each layer's own: the stacking is recorded in the
step, and the gradient of each comes back to it (a ``torch.autograd.Function`` whose backward
is the scan's ``jax.vjp``), so optimizers, ``state_dict`` and sharding annotations see
ordinary per-layer parameters.

What a layer may do: take one tensor and return one of the same shape and dtype (under autocast,
the first layer may turn the input's dtype into the autocast dtype: it runs on its own, the rest
as the scan, as eager would run them), read its own
parameters and buffers (not write them: batch norm in training mode is refused), Python
numbers, and random numbers (each layer draws its own). It may not read other tensors (pass
them in through a module attribute that is a buffer), read values to the host, or differ from
the first layer in type, parameter names, shapes or dtypes: each is refused by name, before
anything is recorded.
"""

from __future__ import annotations

import warnings

import torch
from torch.func import functional_call

from ir_core import DeviceData, Generic, Shape, Value
from ir_runtime._frontend.recording._convert import ir_dtype
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap
from ir_runtime._frontend.regions import _stack
from ir_runtime._frontend.steps import _step
from ir_runtime._lowering.regions.scan import Body, add_body


def _tensors(layer) -> list:
    """The layer's parameters and buffers, by name, in a fixed order."""
    return [*layer.named_parameters(), *layer.named_buffers()]


def _described(layer) -> list:
    """``(name, shape, dtype)`` of each tensor the layer reads, in ``_tensors``' order: a
    stacked layer's (``stack_layers``) from its stack, without making views."""
    at = _stack.layer_of(layer)
    if at is None:
        return [(n, tuple(t.shape), t.dtype) for n, t in _tensors(layer)]
    owner, _ = at
    stack = _stack.stack_of(owner)
    tensors = [(path, stack.tensor(owner, flat)) for path, flat, _, _ in stack.entries]
    return [(path, tuple(t.shape[1:]), t.dtype) for path, t in tensors]


def _layer_tensors(layer) -> list:
    """``_tensors``, a stacked layer's as views of its rows."""
    at = _stack.layer_of(layer)
    if at is None:
        return _tensors(layer)
    owner, i = at
    stack = _stack.stack_of(owner)
    return [(path, stack.tensor(owner, flat).select(0, i)) for path, flat, _, _ in stack.entries]


def _stacked_run(layers):
    """The stacked tensors of ``layers`` when they are a contiguous run of one stack (sliced
    unless the whole of it), else None."""
    at = [_stack.layer_of(layer) for layer in layers]
    owner = at[0][0] if at[0] is not None else None
    if owner is None or any(a is None or a[0] is not owner for a in at):
        return None
    start = at[0][1]
    if [a[1] for a in at] != list(range(start, start + len(at))):
        return None
    stack = _stack.stack_of(owner)
    if stack is None or not _stack.intact(owner):
        raise ValueError(
            "scan_layers: the layers of this stack were deleted, moved or replaced (or a "
            "submodule of one) since stack_layers; ir_runtime.unstack_layers them, change "
            "them, then stack_layers again"
        )
    out = [stack.tensor(owner, flat) for _, flat, _, _ in stack.entries]
    for t, (_, flat, is_param, _) in zip(out, stack.entries, strict=True):
        if is_param:
            _stack.register(t, flat)  # (the container's own, whatever replaced it: a copy)
    if len(at) != stack.count:
        out = [t[start : start + len(at)] for t in out]
    return out


def _check(layers) -> list:
    if isinstance(layers, torch.nn.Module) and not isinstance(
        layers, (torch.nn.ModuleList, torch.nn.Sequential)
    ):
        raise TypeError(
            f"scan_layers takes a sequence of modules (a list, ModuleList or Sequential), got a "
            f"single {type(layers).__name__}"
        )
    layers = list(layers)
    if not layers:
        raise ValueError("scan_layers needs at least one layer")
    first = layers[0]
    spec = _described(first)
    for i, layer in enumerate(layers[1:], 1):
        if type(layer) is not type(first):
            raise ValueError(
                f"scan_layers needs layers of one structure: layer {i} is a "
                f"{type(layer).__name__}, layer 0 a {type(first).__name__}"
            )
        mine = _described(layer)
        if mine != spec:
            for a, b in zip(spec + [None] * len(mine), mine + [None] * len(spec), strict=True):
                if a != b:
                    break
            raise ValueError(
                f"scan_layers needs layers of one structure: layer {i} has {_said(b)} where "
                f"layer 0 has {_said(a)}"
            )
        if layer.training is not first.training:
            raise ValueError(f"scan_layers: layer {i} is in another mode (train/eval) than layer 0")
    for name, t in _tensors(first) if _stack.layer_of(first) is None else ():
        if not isinstance(t, LazyTensor):
            raise TypeError(
                f"scan_layers runs lazy layers; {name!r} of layer 0 is on {t.device} "
                f"(ir_runtime.to_lazy the model first)"
            )
    return layers


def _said(entry) -> str:
    if entry is None:
        return "nothing"
    name, shape, dtype = entry
    return f"{name!r} {list(shape)} {str(dtype).removeprefix('torch.')}"


def _trace_body(layer, x: LazyTensor) -> tuple[Body, list]:
    """One layer's forward on placeholders: its body, and the Values of its free inputs."""
    carry = DeviceData(Shape(ir_dtype(x.dtype), tuple(x.shape)))
    names, placeholders = [], []
    for name, shape, dtype in _described(layer):
        names.append(name)
        placeholders.append(DeviceData(Shape(ir_dtype(dtype), shape)))
    # Isolated: nothing recorded on the placeholders is live (an error leaves no pending work
    # that no step could run), and a tensor from outside written in place keeps its value.
    kind = f"scan_layers: {type(layer).__name__}.forward"
    with _step.Isolated(kind) as isolated, _step.watch() as seen, torch.no_grad():
        inputs = {n: wrap(Value(p)) for n, p in zip(names, placeholders, strict=True)}
        before = {n: v._ir for n, v in inputs.items()}
        if _stack.layer_of(layer) is None:
            out = functional_call(layer, inputs, (wrap(Value(carry)),))
        else:  # (a stacked layer's names are views: bound to the placeholders instead)
            with _stack.bound(layer, inputs):
                out = layer(wrap(Value(carry)))
    if isolated.written:
        raise ValueError(
            f"{kind} writes a tensor {isolated.written[0]} that is neither its input nor one "
            f"of its parameters or buffers in place (it keeps its value)"
        )
    if seen.host_reads:
        raise ValueError(
            f"scan_layers: {type(layer).__name__}.forward reads a value to the host (.item(), "
            f"a Python if on a tensor); a scanned layer must stay on the device"
        )
    if isinstance(out, LazyTensor) and out.shape == x.shape and out.dtype != x.dtype:
        raise _OtherDtype(out.dtype)
    if not isinstance(out, LazyTensor) or out.shape != x.shape:
        got = type(out).__name__
        if isinstance(out, torch.Tensor):
            got = f"{list(out.shape)} {out.dtype}"
        raise ValueError(
            f"scan_layers: each layer must return one tensor like its input ({list(x.shape)} "
            f"{x.dtype}), so the next can take it; {type(layer).__name__} returned {got}"
        )
    written = [n for n, v in inputs.items() if v._ir is not before[n]]
    if written:
        raise ValueError(
            f"scan_layers: {type(layer).__name__} writes its {written[0]!r} in place (batch "
            f"norm in training mode); a scanned layer may only read its parameters and buffers"
        )
    free, values, key_at = _step.free_inputs(
        [out._ir],
        [carry, *placeholders],
        lambda shape: ValueError(
            f"scan_layers: {type(layer).__name__}.forward reads a tensor {shape} that is "
            f"neither its input nor one of its parameters or buffers; register it as a "
            f"buffer of the layer, or pass it through the input"
        ),
    )
    return Body(out._ir, carry, placeholders, free, key_at), values


class _OtherDtype(Exception):
    """The first layer returns its input's shape in another dtype (under autocast)."""

    def __init__(self, dtype):
        self.dtype = dtype


class _Scan(torch.autograd.Function):
    """The stack's forward as one scan node; its backward, the scan's vjp node."""

    @staticmethod
    def forward(ctx, body_name, free, layers_count, is_stacked, x, *tensors):
        if is_stacked:  # (stored stacked: stack_layers)
            p, stacked = len(tensors), list(tensors)
        else:
            p = len(tensors) // layers_count
            stacked = [torch.stack(tensors[j::p]) for j in range(p)]
        attrs = {"body": body_name, "params": p, "layers": layers_count}
        node = Generic(
            "ir::scan_layers", [x._ir, *(s._ir for s in stacked), *free], [x._ir.shape], attrs
        )
        ctx.save_for_backward(x, *stacked)
        ctx.meta = (body_name, free, layers_count, p, is_stacked)
        return wrap(Value(node))

    @staticmethod
    def backward(ctx, grad):
        x, *stacked = ctx.saved_tensors
        body_name, free, layers_count, p, is_stacked = ctx.meta
        attrs = {"body": body_name, "params": p, "layers": layers_count}
        operands = [x._ir, *(s._ir for s in stacked), *free, grad._ir]
        shapes = [x._ir.shape, *(s._ir.shape for s in stacked)]
        node = Generic("ir::scan_layers_grad", operands, shapes, attrs)
        gx = wrap(Value(node, 0))
        if is_stacked:
            return (None, None, None, None, gx, *(wrap(Value(node, 1 + j)) for j in range(p)))
        per_param = [wrap(Value(node, 1 + j)).unbind(0) for j in range(p)]
        # Back in the order forward took them: layer by layer, each layer's tensors in turn.
        grads = [per_param[j][i] for i in range(layers_count) for j in range(p)]
        return (None, None, None, None, gx, *grads)


def scan_layers(layers, x):
    """``for layer in layers: x = layer(x)``, compiled as one scan over the layers (module
    docstring): ``layers`` a list, ``ModuleList`` or ``Sequential`` of lazy modules of one
    structure; ``x`` the first layer's input. Returns the last layer's output."""
    layers = _check(layers)
    if not isinstance(x, LazyTensor):
        raise TypeError(f"scan_layers takes a lazy input tensor, got {type(x).__name__}")
    return _scan_layers(layers, x, peel=True)


def _scan_layers(layers, x, peel: bool):
    try:
        body, free = _trace_body(layers[0], x)
    except _OtherDtype as e:
        if len(layers) == 1 or not peel:
            raise ValueError(
                f"scan_layers: each layer must return one tensor like its input ({list(x.shape)} "
                f"{x.dtype}), so the next can take it; {type(layers[0]).__name__} returned "
                f"{e.dtype}"
            ) from None
        # Under autocast the first layer turns a float32 input into bfloat16, as every later
        # layer's input is: run it as it is, as eager would, and scan the rest.
        return _scan_layers(layers[1:], layers[0](x), peel=False)
    name = add_body(body)
    stacked = _stacked_run(layers)
    if stacked is not None:
        return _Scan.apply(name, free, len(layers), True, x, *stacked)
    if any(_stack.layer_of(layer) is not None for layer in layers):
        warnings.warn(
            "scan_layers: these layers are not one contiguous run of a stack_layers stack; "
            "their tensors are stacked for this call, as unstacked layers' are",
            _stack.StackWarning,
            stacklevel=3,
        )
    tensors = [t for layer in layers for _, t in _layer_tensors(layer)]
    return _Scan.apply(name, free, len(layers), False, x, *tensors)
