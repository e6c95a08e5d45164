"""Hyperparameters lent to an optimizer's step while a compiled step is traced, so that a
schedule's rate is an input of the step's program, not a constant of it.

As a traced call steps one of torch's own optimizers on lazy parameters (``lend``), each number
among its hyperparameters (``lr``, ``momentum``, ``betas``, ``eps``, a scheduler's
``initial_lr``) is lent to the step as a lazy 0-d tensor, and each host tensor among them (a
rate a scheduler fills in place) as the lazy tensor that reads it. The program reads them as
parameters: a replay places each group's number as it is then (``HYPER``), so a rate that
changes every call is replayed, not traced again. The optimizer's groups get their own values
back once its step returns (``give_back``).

torch computes with its hyperparameters in three ways, and each is kept exact:

- tensor arithmetic (``exp_avg.lerp_(grad, 1 - beta1)``, ``param.mul_(1 - lr * wd)``): recorded
  as it is, reading the lent tensor;
- a number argument (``param.add_(grad, alpha=-lr)``, ``addcdiv_(..., value=-step_size)``, their
  ``_foreach_`` forms): eager reads the tensor's value into that number; here the call becomes
  the same arithmetic on the tensor (``param.add_(grad * -lr)``, in the op's own precision),
  which eager's kernels compute too (``_Scalars``);
- a branch on the value (``if weight_decay != 0``) or a value read into Python (``.item()``):
  answered from the value lent, which Python already has: a comparison becomes a condition a
  replay checks (``conditions``), a read makes that hyperparameter one compared by value
  (``by_value``), as it would be had it not been lent.

torch's optimizers that offer ``capturable`` take that form for the traced step (their step
counts on the parameters' device, as a program can update them), and those that keep a step
count on the host without it (Adagrad) have it moved to the lazy device once: so torch's
default, ``capturable=False``, replays too. Optimizers other than torch's own (a subclass, a
library's) get only their host tensor hyperparameters lent, in a capturable group, as before;
their numbers stay numbers, compared by value.
"""

from __future__ import annotations

import operator
import weakref

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ir_core import DeviceData, post_order
from ir_runtime._data import fetch
from ir_runtime._execute import run_graph
from ir_runtime._frontend.recording._api import to_lazy
from ir_runtime._frontend.recording._record import LEAVES, make_leaf
from ir_runtime._frontend.recording._tensor import LazyTensor, as_value, wrap
from ir_runtime._frontend.steps import _step

_ref = weakref.ref
# torch's own optimizers, whose steps are known to compute with tensor hyperparameters
# (tests/test_optimizers.py runs each on every path). Not LBFGS (its step reads the loss into
# Python) nor SparseAdam (sparse gradients).
TORCH_OPTIMIZERS = frozenset(
    getattr(torch.optim, name)
    for name in (
        *("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam"),
        *("Adadelta", "Rprop", "ASGD"),
    )
)
# The lending in force while an optimizer steps (what the patched ``_get_value`` asks).
ACTIVE: list = [None]


class Lending:
    """What one traced call lent to the optimizers it stepped, and what their steps did with it.

    ``nodes``: id of a lent data node -> ``(weak reference to the optimizer, group index, key,
    index in a tuple or None, dtype)``, where a replay reads its value; ``host``: ids of the
    lent host tensors' data nodes (read afresh as before, ``HOSTREAD``); ``by_value``: ``(id of
    the optimizer, group index, key)`` whose value Python read; ``conditions``: ``(optimizer
    reference, group index, key, index, comparison, other, result)`` a branch relied on."""

    def __init__(self):
        self.nodes: dict = {}
        self.values: dict = {}  # id of a lent data node -> the number lent
        self.host: set = set()
        self.by_value: set = set()
        self.conditions: list = []
        self.keep: list = []  # the lent data nodes, held: their ids stay theirs
        self._back: list = []  # (group, key, its value, the value lent) to give back
        self._mode = None

    # -- lending and giving back ---------------------------------------------------------

    def lend(self, opt, host: bool = True) -> None:
        """Lend ``opt``'s hyperparameters to its step (``host``: its host tensor ones too)."""
        # (an optimizer's own step hooks run while the values are lent: they would see, and
        # could replace, tensors where eager has numbers; such a step keeps its numbers)
        own = type(opt) in TORCH_OPTIMIZERS and not (
            opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks
        )
        ref = _ref(opt)
        for gi, group in enumerate(opt.param_groups):
            params = group["params"]
            if not params or not all(type(p) is LazyTensor for p in params):
                continue
            if own:
                if group.get("capturable") is False:
                    self._back.append((group, "capturable", False, True))
                    group["capturable"] = True
                _steps_to_device(opt, params)
            capturable = bool(group.get("capturable"))
            dtype = "float64"  # (what torch computes from a number, Python computes in double)
            for k, v in list(group.items()):
                if k == "params":
                    continue
                if type(v) is torch.Tensor and host and (own or capturable):
                    t = wrap(as_value(v))  # (noted among the call's host reads)
                    self.host.add(id(t._ir.node))
                elif own and type(v) is float:
                    t = self._scalar(v, (ref, gi, k, None, dtype))
                elif own and type(v) is tuple and v and all(type(x) is float for x in v):
                    t = tuple(self._scalar(x, (ref, gi, k, j, dtype)) for j, x in enumerate(v))
                else:
                    continue
                self._back.append((group, k, v, t))
                group[k] = t
        if self._back and self._mode is None:
            self._mode = _Scalars(self)
            self._mode.__enter__()
            ACTIVE[0] = _step.LENT[0] = self

    def _scalar(self, v: float, where) -> LazyTensor:
        t = wrap(make_leaf(v, where[4]))
        self.nodes[id(t._ir.node)] = where
        self.values[id(t._ir.node)] = v
        self.keep.append(t._ir.node)
        return t

    def numbers(self, opt) -> frozenset:
        """``(group index, key)`` of ``opt``'s numbers lent as inputs: a replay reads them as
        they are then, and Python never read them."""
        lent = {(gi, k) for ref, gi, k, _, _ in self.nodes.values() if ref() is opt}
        return frozenset(x for x in lent if (id(opt), *x) not in self.by_value)

    def give_back(self) -> None:
        """The optimizers' own values, as the step found them."""
        try:
            while self._back:
                group, k, v, lent = self._back.pop()
                if group.get(k) is lent:  # (a value set since, by a scheduler, stays)
                    group[k] = v
        finally:
            if self._mode is not None:
                ACTIVE[0] = _step.LENT[0] = None
                mode, self._mode = self._mode, None
                mode.__exit__(None, None, None)

    # -- what the step did with a lent value ---------------------------------------------

    def leaf(self, x):
        """The lent number ``x`` holds (a lent tensor itself), or None."""
        if type(x) is LazyTensor:
            nid = id(x._ir.node)
            if nid in self.values:
                return nid
        return None

    def read(self, nid: int):
        """The number lent as ``nid``, now compared by value."""
        ref, gi, k, _, _ = self.nodes[nid]
        self.by_value.add((id(ref()), gi, k))
        return self.values[nid]

    def free(self, t: LazyTensor):
        """``t``'s value, when only lent numbers (and numbers in the code) make it: computed
        apart, binding nothing (a program of those alone), each lent one it reads now compared
        by value. None for any other tensor: its read is Python reading the step's data."""
        node = t._ir.node
        if type(node) is DeviceData and id(node) in self.values:
            return np.asarray(self.read(id(node)))
        lent, leaves = [], None
        for n in post_order([t._ir]):
            if type(n) is not DeviceData:
                continue
            nid = id(n)
            if nid in self.values:
                lent.append(nid)
                continue
            if leaves is None:  # the lifted scalars (numbers the code passed to ops)
                leaves = {id(v.node) for v in LEAVES.values()}
            if nid not in leaves:
                return None
        if not lent:
            return None
        for nid in lent:
            self.read(nid)
        data = run_graph([t._ir], donate=(), out_shardings=[None])[0][0]
        return np.asarray(fetch(data.handle))


def numbers_of(opt) -> frozenset:
    """``(group index, key)`` of each number a step of ``opt`` would be lent."""
    if type(opt) not in TORCH_OPTIMIZERS:
        return frozenset()
    return frozenset(
        (gi, k)
        for gi, group in enumerate(opt.param_groups)
        for k, v in group.items()
        if type(v) is float or (type(v) is tuple and v and all(type(x) is float for x in v))
    )


def _steps_to_device(opt, params) -> None:
    """Host step counts of ``params``' state placed on the lazy device, where a capturable
    step keeps them (the program counts them)."""
    for p in params:
        state = opt.state.get(p)
        step = state.get("step") if state else None
        if type(step) is torch.Tensor:
            state["step"] = to_lazy(step)


# ---------------------------------------------------------------------------------------------
# Number arguments given as lazy 0-d tensors: the same arithmetic, on the tensor.

_T = torch.Tensor
_LOW = (torch.float16, torch.bfloat16)
_COMPARE = {}
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _COMPARE[getattr(_T, _name)] = _COMPARE[getattr(_T, f"__{_name}__")] = getattr(operator, _name)
_READS = frozenset((_T.item, _T.__float__, _T.__bool__, _T.__int__, _T.__index__, _T.tolist))


def _scalar_tensor(x) -> bool:
    return type(x) is LazyTensor and x.dim() == 0 and x.dtype.is_floating_point


def _op(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the precision eager's kernels compute it in (float32 for 16-bit floats)."""
    return x.float() if x.dtype in _LOW else x


def _cast(a, t: torch.Tensor):
    """A number (a 0-d tensor) as eager's kernel takes it beside ``t``: in ``t``'s compute
    precision (a float64 number beside float32 data is float32 arithmetic, as in eager)."""
    want = _op(t).dtype
    return a if type(a) is not LazyTensor or a.dtype == want else a.to(want)


def _floating(*xs) -> bool:
    return all(isinstance(x, torch.Tensor) and x.dtype.is_floating_point for x in xs)


def _as(out, want: torch.dtype):
    """A result in the dtype eager's op gives it (a 0-d float64 number beside a 0-d float32
    tensor promotes it; eager's number would not)."""
    return out if out.dtype == want else out.to(want)


def _inplace(func) -> bool:
    return func.__name__.endswith("_")


def _add(func, args, kwargs):
    """``x.add_(y, alpha=a)`` (``sub``, ``torch.add``) as ``x.add_(a * y)``: eager's
    ``x + a * y``, in the kernel's precision, rounded once."""
    if len(args) + len(kwargs) != 3 or set(kwargs) - {"alpha", "other"}:
        return NotImplemented
    x, y = args[0], args[1] if len(args) > 1 else kwargs["other"]
    if not _floating(x, y):
        return NotImplemented
    out = func(x, _cast(kwargs["alpha"], y) * _op(y))
    return out if _inplace(func) else _as(out, torch.result_type(x, y))


def _addc(div: bool):
    def rewrite(func, args, kwargs):
        """``x.addcdiv_(t1, t2, value=a)`` (``addcmul``) as ``x.add_(a * (t1 / t2))``."""
        if len(args) != 3 or set(kwargs) != {"value"} or not _floating(*args):
            return NotImplemented
        x, t1, t2 = args
        p = _cast(kwargs["value"], t1) * (_op(t1) / _op(t2) if div else _op(t1) * _op(t2))
        if _inplace(func):
            return x.add_(p)
        want = torch.promote_types(torch.result_type(x, t1), torch.result_type(x, t2))
        return _as(x.add(p), want)

    return rewrite


def _foreach_add(func, args, kwargs):
    """``_foreach_add_(xs, ys, alpha=a)`` (``sub``) as ``_foreach_add_(xs, a * ys)``."""
    if set(kwargs) != {"alpha"} or len(args) != 2 or not isinstance(args[1], (list, tuple)):
        return NotImplemented
    xs, ys = args
    if not _floating(*xs, *ys):
        return NotImplemented
    out = func(xs, [_cast(kwargs["alpha"], y) * _op(y) for y in ys])
    if _inplace(func):
        return out
    return [_as(o, torch.result_type(x, y)) for o, x, y in zip(out, xs, ys, strict=True)]


def _foreach_addc(div: bool):
    def rewrite(func, args, kwargs):
        """``_foreach_addcdiv_(xs, t1s, t2s, a)`` (a number, a list of them, as tensors) as
        ``_foreach_add_(xs, a * (t1s / t2s))``."""
        if len(args) < 3 or len(args) + len(kwargs) != 4:
            return NotImplemented
        xs, t1s, t2s = args[:3]
        a = args[3] if len(args) > 3 else kwargs.get("value", kwargs.get("scalars"))
        if not _floating(*xs, *t1s, *t2s):
            return NotImplemented
        scalars = list(a) if isinstance(a, (list, tuple)) else [a] * len(xs)
        if not all(_scalar_tensor(s) or type(s) in (int, float) for s in scalars):
            return NotImplemented
        ps = [
            _cast(s, t1) * (_op(t1) / _op(t2) if div else _op(t1) * _op(t2))
            for s, t1, t2 in zip(scalars, t1s, t2s, strict=True)
        ]
        if _inplace(func):
            return torch._foreach_add_(xs, ps)
        out = torch._foreach_add(xs, ps)
        return [_as(o, x.dtype) for o, x in zip(out, xs, strict=True)]

    return rewrite


def _foreach_scalar(func, args, kwargs):
    """``_foreach_add_(xs, a)`` (``mul``, ``lerp``'s weight, ...) as the same op with the
    tensor beside each element: ``_foreach_add_(xs, [a, a, ...])``."""
    if kwargs or not 2 <= len(args) <= 3 or not _scalar_tensor(args[-1]):
        return NotImplemented
    xs = args[0]
    if not _floating(*xs):
        return NotImplemented
    out = func(*args[:-1], [_cast(args[-1], x) for x in xs])
    return out if _inplace(func) else [_as(o, x.dtype) for o, x in zip(out, xs, strict=True)]


def _foreach_pow(func, args, kwargs):
    """``_foreach_pow(a, exponents)`` (a number to each exponent: Adam's bias corrections) as
    ``a ** e`` per exponent."""
    a, es = args[0], args[1] if len(args) > 1 else kwargs.get("exponent")
    if len(args) + len(kwargs) != 2 or not _scalar_tensor(a) or not _floating(*es):
        return NotImplemented
    return [torch.pow(_cast(a, e), e) for e in es]


_REWRITES: dict = {}  # torch function -> (the argument to rewrite for, the rewrite)
_ALPHA: dict = {}  # _foreach_add's alpha= form, besides its scalar form in _REWRITES
for _name in ("add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max"):
    for _f in (getattr(torch, f"_foreach_{_name}"), getattr(torch, f"_foreach_{_name}_")):
        _REWRITES[_f] = (1, _foreach_scalar)
for _f in (torch._foreach_lerp, torch._foreach_lerp_):
    _REWRITES[_f] = (2, _foreach_scalar)
_REWRITES[torch._foreach_pow] = (0, _foreach_pow)
for _f in (_T.add, _T.add_, _T.sub, _T.sub_, torch.add, torch.sub):
    _REWRITES[_f] = ("alpha", _add)
for _f, _div in ((_T.addcmul, False), (_T.addcmul_, False), (torch.addcmul, False)):
    _REWRITES[_f] = ("value", _addc(_div))
for _f in (_T.addcdiv, _T.addcdiv_, torch.addcdiv):
    _REWRITES[_f] = ("value", _addc(True))
for _f in (torch._foreach_add, torch._foreach_add_, torch._foreach_sub, torch._foreach_sub_):
    _ALPHA[_f] = _foreach_add
for _f, _div in (
    (torch._foreach_addcmul, False),
    (torch._foreach_addcmul_, False),
    (torch._foreach_addcdiv, True),
    (torch._foreach_addcdiv_, True),
):
    _REWRITES[_f] = (3, _foreach_addc(_div))


def _given(where, args, kwargs):
    """The argument a rewrite is for: a keyword's, or a position's (or its keyword)."""
    if type(where) is str:
        return kwargs.get(where)
    if len(args) > where:
        return args[where]
    return kwargs.get("value", kwargs.get("scalars"))


class _Scalars(TorchFunctionMode):
    """While an optimizer with lent hyperparameters steps: number arguments given as lazy 0-d
    tensors become tensor arithmetic (``_REWRITES``), and Python's questions about a lent value
    (a comparison with a number, ``.item()``) are answered from the number lent."""

    def __init__(self, lending: Lending):
        super().__init__()
        self.lending = lending

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rewrite = _REWRITES.get(func)
        if func in _ALPHA and "alpha" in kwargs:
            rewrite = ("alpha", _ALPHA[func])
        if rewrite is not None:
            a = _given(rewrite[0], args, kwargs)
            if _scalar_tensor(a) or (
                isinstance(a, (list, tuple)) and a and all(map(_scalar_tensor, a))
            ):
                out = rewrite[1](func, args, kwargs)
                if out is not NotImplemented:
                    return out
        lending = self.lending
        compare = _COMPARE.get(func)
        if compare is not None and len(args) == 2 and type(args[1]) in (int, float):
            nid = lending.leaf(args[0])
            if nid is not None:
                result = compare(lending.values[nid], args[1])
                ref, gi, k, j, _ = lending.nodes[nid]
                condition = (ref, gi, k, j, compare, args[1], result)
                if condition not in lending.conditions:
                    lending.conditions.append(condition)
                return result
        if func in _READS and args:
            nid = lending.leaf(args[0])
            if nid is not None:
                v = lending.read(nid)
                if func is _T.__bool__:
                    return bool(v)
                if func is _T.__int__ or func is _T.__index__:
                    return int(v)
                return float(v)
        return func(*args, **kwargs)


def get_value(original):
    """torch's ``_get_value`` (a step count or rate as a Python number), but a lazy tensor
    while hyperparameters are lent: Adagrad's step count stays in the program."""

    def _get_value(x):
        if ACTIVE[0] is not None and type(x) is LazyTensor:
            return x
        return original(x)

    _get_value._lending = True
    return _get_value
