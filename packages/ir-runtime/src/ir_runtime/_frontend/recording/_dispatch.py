"""Routing: what the lazy tensor does with each ATen call that reaches it.

An op with a lowering rule is recorded (in C once seen, ``_fast``); an op with a front-end
handler (registered with ``@special(op)``: ops that mutate, read the host, draw random numbers
or have data-dependent shapes) runs the handler; an in-place op records its functional form and
rebinds the tensor; ``out=`` and ``_foreach_`` forms become their plain ops; a composite op is
decomposed with torch's own decompositions; anything else is a clear error naming the op.
"""

from __future__ import annotations

import os
import sysconfig
import warnings

import jax
import torch
from torch._decomp import core_aten_decompositions, decomposition_table

import ir_core
import ir_runtime
import ir_sharding
from ir_runtime import _metrics
from ir_runtime._bounded import Bounded
from ir_runtime._errors import DeviceMismatchError, UnsupportedOpError
from ir_runtime._frontend.recording import _convert, _device_orders, _fast
from ir_runtime._frontend.recording._meta import MEMO, infer
from ir_runtime._frontend.recording._record import (
    LEAVES,
    attr_value,
    default_float,
    float_dtype,
    make_leaf,
    plan_of,
    record,
)
from ir_runtime._frontend.recording._tensor import _PLAIN_DISPATCH, DATA, LazyTensor, as_value
from ir_runtime._frontend.recording._views import rebind, write_through
from ir_runtime._lowering import RULES, _registry
from ir_runtime._placement import ON_SECOND_ORDER, ORDERS

aten = torch.ops.aten
# torch's core ATen decompositions first, then its wider table (mse_loss and friends).
_DECOMPOSITIONS = {**decomposition_table, **core_aten_decompositions()}
# The cast torch's reference decompositions compute a half-precision op in float32 with
# (renorm's): a copy in the other dtype.
_DECOMPOSITIONS[torch.ops.prims.convert_element_type.default] = lambda x, dtype: (
    aten._to_copy.default(x, dtype=dtype)
)


_FUNCTIONAL: dict = {}  # OpOverload -> its functional overload (finite: ATen's ops)


def functional_of(func):
    """The out-of-place overload of an in-place op (``add_.Tensor`` -> ``add.Tensor``): the
    overload of the op without ``_`` that takes the same arguments, by name and type (overload
    names do not always match: ``pow_.Scalar`` is ``pow.Tensor_Scalar``). Found once per op."""
    if func not in _FUNCTIONAL:
        _FUNCTIONAL[func] = _find_functional(func)
    return _FUNCTIONAL[func]


def _find_functional(func):
    name = func._schema.name.split("::")[1]
    packet = getattr(aten, name.rstrip("_"), None) if name.endswith("_") else None
    if packet is None:
        return None
    candidates = [getattr(packet, o) for o in packet.overloads()]
    candidates = [c for c in candidates if not c._schema.is_mutable]
    for named in (True, False):  # the same names and types; else (dropout_'s self is
        wanted = _signature_of(func, named)  # dropout's input) the only one of the same types
        found = [c for c in candidates if _signature_of(c, named) == wanted]
        if len(found) == 1 or (found and named):
            return found[0]
    return None


def _signature_of(func, named: bool):
    return tuple((a.name if named else "", str(a.type)) for a in func._schema.arguments)


_OUT_FORMS = {"arange.start_out": "start_step", "arange.out": "default"}


def _same_arguments(func, packet):
    """The overload of ``packet`` taking exactly the arguments of the out overload ``func``
    but its outputs, by name and type; None when there is not one."""
    wanted = tuple((a.name, str(a.type)) for a in func._schema.arguments if not a.is_out)
    for overload in packet.overloads():
        schema = getattr(packet, overload)._schema
        if not schema.is_mutable and wanted == tuple(
            (a.name, str(a.type)) for a in schema.arguments
        ):
            return overload
    return None


def _out_variant(func, args, kwargs):
    """``op.out(..., out=t)``: the functional overload, then ``t`` rebound to its result."""
    kwargs = dict(kwargs)
    out = kwargs.pop("out")
    name = func._schema.name.split("::")[1]
    packet = getattr(aten, name)
    overload = func._overloadname
    candidates = [
        _OUT_FORMS.get(f"{name}.{overload}"),
        _same_arguments(func, packet),  # div.out -> div.Tensor, add.out -> add.Tensor
        overload.replace("_out", ""),
        "default",
    ]
    given = {a.name for a in func._schema.arguments[: len(args)]} | set(kwargs)
    for candidate in candidates:
        functional = getattr(packet, candidate, None) if candidate else None
        if functional is None or functional._schema.is_mutable:
            continue
        names = {a.name for a in functional._schema.arguments}
        if given <= names:
            if "dtype" in names:
                kwargs.setdefault("dtype", out.dtype)
            result = dispatch(functional, args, kwargs)
            if out.shape != result.shape:  # torch resizes out (an empty one, as factories
                if out.numel():  # make it; a full one with a warning)
                    warnings.warn(
                        f"An output with one or more elements was resized since it had shape "
                        f"{list(out.shape)}, which does not match the required output shape "
                        f"{list(result.shape)}",
                        UserWarning,
                        stacklevel=4,
                    )
                out.data = result
                return out
            rebind(out, result._ir)
            write_through(out)
            return out
    raise UnsupportedOpError(f"{func} has no functional form the lazy device can record")


_INPLACE_CHECKED = Bounded(4096)  # in-place call signatures torch's checks passed


def _signature(x):
    """What an in-place op's validity depends on: tensors by shape and dtype, numbers by
    type, anything else by value."""
    if type(x) is LazyTensor:
        return x._ir.shape
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype)
    if type(x) in (float, int, bool):
        return type(x)
    if isinstance(x, (list, tuple)):
        return tuple(map(_signature, x))
    return x


def _inplace(func, args, kwargs):
    if "out" in kwargs:
        return _out_variant(func, args, kwargs)
    functional = functional_of(func)
    if functional is None or not isinstance(args[0], LazyTensor):
        raise UnsupportedOpError(
            f"in-place op {func} has no out-of-place form the lazy device can record; "
            f"report it with the model that needs it, or write the op out of place"
        )
    # torch's own checks of the in-place op on meta tensors (a dtype cannot widen in place,
    # shapes must broadcast into self): the error a CPU user would get. Once per signature.
    key = (id(func), *map(_signature, args), *((k, _signature(v)) for k, v in kwargs.items()))
    if key not in _INPLACE_CHECKED:
        infer(func, ("in-place", key), args, kwargs)
        _INPLACE_CHECKED[key] = True
    self = args[0]
    result = dispatch(functional, args, kwargs)
    if func._schema.name in _RESHAPE_IN_PLACE:
        # squeeze_, t_, ...: the tensor's own shape changes (torch's matmul of a 1-D operand
        # squeezes its product in place). ``.data``'s setter swaps in the result's metadata.
        DATA.__set__(self, result)
        self._set(result._ir)
        return self
    rebind(self, result._ir)
    write_through(self)
    return self


# In-place ops that change the tensor's shape rather than its values.
_RESHAPE_IN_PLACE = frozenset(
    f"aten::{name}_"
    for name in (
        "squeeze",
        "unsqueeze",
        "transpose",
        "t",
        "swapdims",
        "swapaxes",
        "as_strided",
        "resize",
        "resize_as",
    )
)


def _foreach(func, args, kwargs):
    """``_foreach_op[_].X`` as one ``op[_]`` per element, through torch's own Python API (which
    picks the overload)."""
    name = func._schema.name.split("::")[1][len("_foreach_") :]
    bound = dict(zip([a.name for a in func._schema.arguments], args, strict=False))
    bound.update(kwargs)
    # (the lists' length: ``self`` is a number in ``_foreach_pow.ScalarAndTensor``, the bias
    # corrections of Adam(foreach=True, capturable=True))
    n = next(len(v) for v in bound.values() if isinstance(v, (list, tuple)))
    results = []
    for i in range(n):
        positional, keywords = [], {}
        for arg, v in bound.items():
            item = v[i] if isinstance(v, (list, tuple)) else v
            if arg in ("alpha", "value") or (arg in ("scalars", "scalar") and "addc" in name):
                keywords["value" if arg.startswith("scalar") else arg] = item
            elif arg in ("ord", "dtype") and name == "norm":
                keywords[arg] = item
            elif item is not None or arg == "self":
                positional.append(item)
        if name == "norm":
            results.append(torch.linalg.vector_norm(*positional, **keywords))
        elif name.endswith("_"):
            method = getattr(torch.Tensor, name, None)
            if method is None:  # no in-place method (maximum_, minimum_): computed, copied in
                positional[0].copy_(_foreach_one(name[:-1], positional, keywords))
            else:
                method(*positional, **keywords)
        else:
            results.append(_foreach_one(name, positional, keywords))
    return None if name.endswith("_") else results


def _foreach_one(name: str, positional: list, keywords: dict):
    """One element of ``_foreach_<name>``: torch's function of that name, but for a maximum or
    minimum with a number, which torch spells as a clamp (the same NaN propagation)."""
    if name in ("maximum", "minimum") and not isinstance(positional[1], torch.Tensor):
        bound = "min" if name == "maximum" else "max"
        return torch.clamp(positional[0], **{bound: positional[1]})
    return getattr(torch, name)(*positional, **keywords)


SPECIAL: dict = {}  # OpOverload -> handler(func, args, kwargs)


def special(*funcs):
    """Register the decorated ``handler(func, args, kwargs)`` for the ATen overloads ``funcs``:
    the front end calls it instead of recording the op (ops that mutate, read the host, draw
    random numbers or have data-dependent shapes)."""

    def add(handler):
        for func in funcs:
            if func in SPECIAL:
                raise ValueError(f"{func} already has a front-end handler")
            SPECIAL[func] = handler
        forget_routes()
        return handler

    return add


# By id: OpOverload hashes in Python, and ids of its (cached, immortal) overloads are stable.
# Unbounded and needing no bound: one entry per ATen overload the program ever calls.
_ROUTES: dict = {}
_NO_KWARGS: dict = {}


def forget_routes() -> None:
    """Route every op afresh (after a lowering rule or a handler was registered)."""
    _ROUTES.clear()
    _fast.forget()


_registry.ON_CHANGE.append(forget_routes)


def _route(func):
    handler = SPECIAL.get(func)
    plan = plan_of(func)
    recordable = plan if handler is None and plan.op in RULES else None
    route = _ROUTES[id(func)] = (handler, recordable, plan)
    if recordable is not None:
        _fast.register(func, plan.positional)
    return route


class AutocastWarning(UserWarning):
    """``torch.autocast("cpu")`` is on around an op on the lazy device, where it does nothing."""


# How many torch.autocast("cpu") regions are open (counted by regions/_autocast: inside
# __torch_dispatch__ torch's own autocast state reads off), and whether that was said.
CPU_AUTOCAST = [0]
_CPU_AUTOCAST_WARNED = [False]


def _warn_cpu_autocast(func) -> None:
    _CPU_AUTOCAST_WARNED[0] = True
    warnings.warn(
        f"torch.autocast('cpu') is on around {func} on the lazy device, where it changes "
        f"nothing (torch's autocast is per device): use torch.autocast('lazy', "
        f"dtype=torch.bfloat16) for lazy tensors. Said once.",
        AutocastWarning,
        stacklevel=3,
    )


def _dispatch(cls, func, types, args=(), kwargs=None):
    """What the C dispatch leaves: keyword arguments, first sightings, several outputs, views,
    in-place and special ops. (Every step has some, so a CPU autocast left on around lazy ops is
    noticed here, at the cost of one flag read.)"""
    if CPU_AUTOCAST[0] and not _CPU_AUTOCAST_WARNED[0]:
        _warn_cpu_autocast(func)
    route = _ROUTES.get(id(func))
    if route is not None:
        plan = route[1]
        if plan is not None:
            if kwargs:
                return record(func, args, kwargs, plan)
            return record(func, args, _NO_KWARGS, plan)
    return dispatch(func, args, kwargs or _NO_KWARGS)


def dispatch(func, args, kwargs):
    route = _ROUTES.get(id(func)) or _route(func)
    handler, recordable, plan = route
    if handler is not None:
        return handler(func, args, kwargs)
    if recordable is not None:
        return record(func, args, kwargs, recordable)
    name = plan.name
    if name.startswith("aten::_foreach_"):
        return _foreach(func, args, kwargs)
    if func._schema.is_mutable:
        return _inplace(func, args, kwargs)
    decomposition = _DECOMPOSITIONS.get(func)
    if decomposition is not None:
        out = decomposition(*args, **kwargs)
        if out is not NotImplemented:
            _metrics.count(f"Decomposed::{plan.op}")  # slow on the hot path: worth a rule?
            return out
    # A composite op (aten.to.dtype, ...) reached here from inside a decomposition.
    out = func.decompose(*args, **kwargs)
    if out is not NotImplemented:
        return out
    explicit = torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), "CompositeExplicitAutograd"
    )
    if explicit and not plan.op.startswith(_NOT_KERNELS):
        # Another library's op (torch.library.custom_op, torch_xla's xla::aot_mark_sharding)
        # with one kernel for every device: it runs on the lazy tensors, its ops recorded.
        return func.redispatch(_EXPLICIT, *args, **kwargs)
    _metrics.count(f"Unsupported::{plan.op}")
    raise UnsupportedOpError(
        f"ATen op {plan.op} has no lowering rule and no decomposition on the lazy device. "
        f"Report it (with the model that needs it); meanwhile compute it on CPU "
        f"(t.cpu()) or register a rule with ir_runtime.register_lowering({plan.op!r})"
    )


# (An alias key is no member of a keyset: redispatching on this empty one reaches the op's
# CompositeExplicitAutograd kernel through the dispatcher's fallback slot.)
_EXPLICIT = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
# Namespaces whose device-wide kernels must not run on lazy tensors: ATen's and prims' (lowered
# or decomposed), and torch's collectives, symmetric memory, inductor and RNG primitives, whose
# kernels talk to a process group or a real device (refused by name instead).
_NOT_KERNELS = (
    "aten::",
    "prims::",
    "_c10d_functional",
    "c10d::",
    "_dtensor::",
    "symm_mem::",
    "inductor::",
    "rngprims::",
)


def _operand(x):
    """A recorded op's tensor argument as its IR value (``as_value``). A host tensor is a
    program input, a constant (a mask, a table); one that autograd will give a gradient to is
    refused here, at the op, where eager refuses a CPU tensor beside a CUDA one (eager takes a
    0-d one, and returns its gradient to it: not here, see the message). Its gradient
    would be a lazy tensor, which torch's autograd hands a CPU leaf unchecked (its check of a
    gradient's device passes over tensor subclasses), for the optimizer to fail on later."""
    if type(x) is LazyTensor:  # the common case first, at as_value's cost
        return x._ir
    if not isinstance(x, LazyTensor) and type(x).__torch_dispatch__ is not _PLAIN_DISPATCH:
        raise _fast.ForeignTensor(type(x).__name__)  # (its own dispatch is asked next)
    if (
        isinstance(x, torch.Tensor)
        and x.requires_grad
        and torch.is_grad_enabled()
        and not isinstance(x, LazyTensor)
    ):
        raise _host_tensor_with_gradient(x)
    return as_value(x)


def _host_tensor_with_gradient(x) -> DeviceMismatchError:
    shape = list(x.shape)
    if isinstance(x, torch.nn.Parameter):
        what = f"a {x.device} parameter of shape {shape}"
    else:
        what = f"a {x.device} tensor of shape {shape} that requires grad"
    if x.dim() == 0:  # eager takes a 0-d host tensor beside a device one; this cannot
        what += (
            " (eager would take a 0-d one and return its gradient to the host; the lazy device "
            "cannot, since torch's autograd would hand it a lazy gradient: irt.to_lazy it)"
        )
    origin = _fast.origin()
    at = f" at {origin}" if origin is not None else ""
    return DeviceMismatchError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{_convert.DEVICE} and {x.device}: an op on the lazy device{at} takes {what}. A "
        f"host tensor can be a lazy op's input only as a constant: this one's gradient would "
        f"be a lazy tensor, which it cannot hold (nor its optimizer apply). Move the model to "
        f"the lazy device before building its optimizer: model = irt.to_lazy(model), then "
        f"torch.optim.SGD(model.parameters(), ...); pass a constant .detach()ed"
    )


# -- the C hot path (_fast), configured here and only here ------------------------------------

_fast.configure(
    lazy=LazyTensor,
    meta=MEMO,
    leaves=LEAVES,
    make_leaf_=make_leaf,
    default_float_=default_float,
    float_dtype_=float_dtype,
    attr_value_=attr_value,
    as_value_=_operand,
    dispatch=_dispatch,
    record_=record,
)


def _check_device_orders() -> None:
    _fast.check_devices(_device_orders.check)


# Ops are checked for tensors over two device orders once a second order exists (or now, when
# one already does).
ON_SECOND_ORDER.append(_check_device_orders)
if len(ORDERS) > 1:
    _check_device_orders()


def configure_origins() -> None:
    """Source lines on unless ``IR_RUNTIME_SOURCE_LINES=0``; the frames walked past to find the
    user's: torch's, jax's, ir-core's, ir-sharding's, this package's and the standard library's
    (not the site-packages inside it: a model's source, transformers' included, is the user's)."""

    def folder(module):
        return os.path.dirname(os.path.abspath(module.__file__)) + os.sep

    paths = sysconfig.get_paths()
    library = [folder(m) for m in (torch, jax, ir_core, ir_sharding, ir_runtime)]
    stdlib = [paths["stdlib"] + os.sep, paths["platstdlib"] + os.sep]
    user = [paths["purelib"] + os.sep, paths["platlib"] + os.sep]
    on = os.environ.get("IR_RUNTIME_SOURCE_LINES", "1") != "0"
    _fast.set_origins(on, library, stdlib, user)
