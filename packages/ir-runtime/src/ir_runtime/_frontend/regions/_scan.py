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

import torch
from torch.func import functional_call

from ir_core import DeviceData, Generic, Shape, Value
from ir_runtime._frontend.recording._convert import ir_dtype
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap
from ir_runtime._frontend.steps import _step
from ir_runtime._lowering.regions.scan import Body, add_body


def _tensors(layer) -> list:
    """The layer's parameters and buffers, by name, in a fixed order."""
    return [*layer.named_parameters(), *layer.named_buffers()]


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
    spec = [(n, tuple(t.shape), t.dtype) for n, t in _tensors(first)]
    for i, layer in enumerate(layers[1:], 1):
        if type(layer) is not type(first):
            raise ValueError(
                f"scan_layers needs layers of one structure: layer {i} is a "
                f"{type(layer).__name__}, layer 0 a {type(first).__name__}"
            )
        mine = [(n, tuple(t.shape), t.dtype) for n, t in _tensors(layer)]
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
    for name, t in _tensors(first):
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
    for name, t in _tensors(layer):
        names.append(name)
        placeholders.append(DeviceData(Shape(ir_dtype(t.dtype), tuple(t.shape))))
    # Isolated: nothing recorded on the placeholders is live (an error leaves no pending work
    # that no step could run), and a tensor from outside written in place keeps its value.
    kind = f"scan_layers: {type(layer).__name__}.forward"
    with _step.Isolated(kind) as isolated, _step.watch() as seen, torch.no_grad():
        inputs = {n: wrap(Value(p)) for n, p in zip(names, placeholders, strict=True)}
        before = {n: v._ir for n, v in inputs.items()}
        out = functional_call(layer, inputs, (wrap(Value(carry)),))
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
    def forward(ctx, body_name, free, layers_count, x, *tensors):
        p = len(tensors) // layers_count
        stacked = [torch.stack(tensors[j::p]) for j in range(p)]
        attrs = {"body": body_name, "params": p, "layers": layers_count}
        node = Generic(
            "ir::scan_layers", [x._ir, *(s._ir for s in stacked), *free], [x._ir.shape], attrs
        )
        ctx.save_for_backward(x, *stacked)
        ctx.meta = (body_name, free, layers_count, p)
        return wrap(Value(node))

    @staticmethod
    def backward(ctx, grad):
        x, *stacked = ctx.saved_tensors
        body_name, free, layers_count, p = ctx.meta
        attrs = {"body": body_name, "params": p, "layers": layers_count}
        operands = [x._ir, *(s._ir for s in stacked), *free, grad._ir]
        shapes = [x._ir.shape, *(s._ir.shape for s in stacked)]
        node = Generic("ir::scan_layers_grad", operands, shapes, attrs)
        gx = wrap(Value(node, 0))
        per_param = [wrap(Value(node, 1 + j)).unbind(0) for j in range(p)]
        # Back in the order forward took them: layer by layer, each layer's tensors in turn.
        grads = [per_param[j][i] for i in range(layers_count) for j in range(p)]
        return (None, None, None, gx, *grads)


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
    tensors = [t for layer in layers for _, t in _tensors(layer)]
    return _Scan.apply(name, free, len(layers), x, *tensors)
