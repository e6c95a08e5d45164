"""torch's samplers on the lazy device: in-place ones (``uniform_``, ``normal_``, ...), the
``*_like`` factories, ``multinomial``, ``bernoulli``, randomized leaky ReLU; each drawn from the
step's key (``_rng``)."""

from __future__ import annotations

import torch

from ir_core import Shape
from ir_runtime._frontend.recording._convert import ir_dtype
from ir_runtime._frontend.recording._dispatch import special
from ir_runtime._frontend.recording._record import bound, record
from ir_runtime._frontend.recording._rng import random
from ir_runtime._frontend.recording._tensor import as_value
from ir_runtime._frontend.recording._views import rebind, write_through
from ir_runtime._frontend.steps._step import to_torch

aten = torch.ops.aten


def _like(t, dtype=None) -> Shape:
    return Shape(ir_dtype(dtype or t.dtype), tuple(t.shape))


def _integer_range(dtype, low, high):
    """``random_``'s bounds: [low, high), high None meaning the largest integer the dtype
    holds exactly (2**mantissa for floats, as torch does)."""
    if high is None:
        if dtype.is_floating_point:
            high = 2 ** (torch.finfo(dtype).nmant + 1) + 1
        elif dtype == torch.bool:
            high = 2
        else:
            high = torch.iinfo(dtype).max + (1 if low == 0 else 0)
    return int(low), int(high)


def draw_in_place(func, t, b: dict):
    """The value an in-place sampler (``uniform_``, ``exponential_``, ``random_``, ...) writes
    into ``t``, as a new lazy value."""
    name = func._schema.name
    shape = _like(t)
    if name == "aten::uniform_":
        return random("ir::random_uniform", shape, low=float(b["from"]), high=float(b["to"]))
    if name == "aten::normal_":
        return random("ir::random_normal", shape, mean=float(b["mean"]), std=float(b["std"]))
    if name == "aten::log_normal_":
        return random("ir::random_log_normal", shape, mean=float(b["mean"]), std=float(b["std"]))
    if name == "aten::exponential_":
        return random("ir::random_exponential", shape, lambd=float(b["lambd"]))
    if name == "aten::cauchy_":
        return random(
            "ir::random_cauchy", shape, median=float(b["median"]), sigma=float(b["sigma"])
        )
    if name == "aten::geometric_":
        return random("ir::random_geometric", shape, p=float(b["p"]))
    if name == "aten::random_":
        if "to" in b and "from" not in b:  # random_.to
            low, high = _integer_range(t.dtype, 0, b["to"])
        else:
            low, high = _integer_range(t.dtype, b.get("from", 0), b.get("to"))
        return random("ir::random_randint", shape, low=low, high=high)
    if name == "aten::bernoulli_":
        p = b["p"]
        if isinstance(p, torch.Tensor):
            return random("ir::random_bernoulli_tensor", shape, as_value(p))
        return random("ir::random_bernoulli", shape, p=float(p))
    raise AssertionError(f"no sampler for {name}")


def _in_place(func, args, kwargs):
    t = args[0]
    rebind(t, draw_in_place(func, t, bound(func, args, kwargs))._ir)
    write_through(t)
    return t


def _rand_like(func, args, kwargs):
    b = bound(func, args, kwargs)
    shape = _like(b["self"], b.get("dtype"))
    if func is aten.randn_like.default:
        return random("ir::random_normal", shape, mean=0.0, std=1.0)
    return random("ir::random_uniform", shape, low=0.0, high=1.0)


def _randint_like(func, args, kwargs):
    b = bound(func, args, kwargs)
    high = b["high"]
    if isinstance(high, torch.Tensor):
        high = to_torch(high).item()  # the range decides the program: read it
    shape = _like(b["self"], b.get("dtype"))
    return random("ir::random_randint", shape, low=int(b.get("low", 0)), high=int(high))


def _multinomial(func, args, kwargs):
    b = bound(func, args, kwargs)
    probs = b["self"]
    shape = Shape("int64", (*probs.shape[:-1], int(b["num_samples"])))
    return random(
        "ir::random_multinomial",
        shape,
        as_value(probs),
        replacement=bool(b["replacement"]),
    )


def _bernoulli(func, args, kwargs):
    b = bound(func, args, kwargs)
    x = b["self"]
    if "p" in b:  # bernoulli.p: a probability for every element
        return random("ir::random_bernoulli", _like(x), p=float(b["p"]))
    return random("ir::random_bernoulli_tensor", _like(x), as_value(x))


def _randperm(func, args, kwargs):
    """``torch.randperm(n, device="lazy")`` as torch's composite kernel records it before the
    front end's own kernel is registered (``randperm.generator_out`` into an empty tensor)."""
    b = bound(func, args, kwargs)
    if b.get("generator") is not None:
        raise NotImplementedError(
            "torch.randperm(generator=...) on the lazy device: it draws from the lazy stream "
            "(torch.manual_seed), not from a torch.Generator; leave generator out"
        )
    dtype = b.get("dtype") or torch.int64
    return random("ir::random_permutation", Shape(ir_dtype(dtype), (int(b["n"]),)))


def _rrelu_with_noise(func, args, kwargs):
    """Randomized leaky ReLU: in training, each negative element's slope is drawn from
    U(lower, upper) and written into ``noise`` (1 for the others), which its backward reads."""
    b = bound(func, args, kwargs)
    x, noise, lower, upper = b["self"], b["noise"], float(b["lower"]), float(b["upper"])
    if not b["training"]:
        return record(aten.leaky_relu.default, (x, (lower + upper) / 2), {})
    slopes = random("ir::random_uniform", _like(x), low=lower, high=upper)
    negative = record(aten.le.Scalar, (x, 0), {})
    new_noise = record(aten.where.ScalarOther, (negative, slopes, 1.0), {})
    rebind(noise, new_noise._ir)
    write_through(noise)
    return record(aten.mul.Tensor, (x, new_noise), {})


special(
    aten.uniform_.default,
    aten.normal_.default,
    aten.log_normal_.default,
    aten.exponential_.default,
    aten.cauchy_.default,
    aten.geometric_.default,
    aten.random_.default,
    getattr(aten.random_, "from"),
    aten.random_.to,
    aten.bernoulli_.float,
    aten.bernoulli_.Tensor,
)(_in_place)
special(aten.rand_like.default, aten.randn_like.default)(_rand_like)
special(aten.randint_like.default, aten.randint_like.low_dtype)(_randint_like)
special(aten.randint_like.Tensor)(_randint_like)
special(aten.multinomial.default)(_multinomial)
special(aten.bernoulli.default, aten.bernoulli.p)(_bernoulli)
special(aten.rrelu_with_noise.default)(_rrelu_with_noise)
special(aten.randperm.generator)(_randperm)
