"""torch's OpInfo samples through the lazy device, against torch eager on CPU.

One op is checked by running its first samples (float32, or the dtype ``check`` is given: op_db
makes its samples in it) eagerly and on the lazy device, and comparing every output; where the
op supports autograd, the input gradients too (one cotangent per differentiable output, the same
on both sides). Ops whose results are random or uninitialized (``empty``, ``rand_like``,
``dropout``, ...) are compared by shape and dtype: two eager runs with different seeds tell
which those are.

``check(op, samples)`` returns an ``Outcome``: ``"pass"``, ``"raise"`` (the lazy device refused:
an exception, with its message) or ``"wrong"`` (a result differs from eager: the worst kind).

Eager is not always the better answer. In half precision (``LOW_PRECISION``) some of its CPU
kernels round intermediates (``cross`` rounds each product, ``addbmm`` the sum after each batch;
the grid sampler's error is ten times a single rounding's) where the lazy device rounds once; in
float32 an iterative kernel's error depends on the CPU it runs on (``matrix_exp``). In those
dtypes (``WIDENED``) a result that differs from eager's beyond the tolerance still passes if,
element by element, it is no farther from the exact result (the op in float64 on the same
values) than eager's element is; ``Outcome.nearer`` names the parts that passed so (torch's
reference tests compare a reference with the precise result in the same way).

Used by ``test_opinfo.py`` and by ``bench/opinfo_coverage.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

import ir_runtime as irt

DTYPE = torch.float32  # the default
# Values: XLA's CPU kernels (transcendentals, reductions in another order) are not torch's
# bit for bit; a wrong result is far outside these.
RTOL, ATOL = 1e-4, 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-4
# Per op: (rtol, atol) where XLA's algorithm differs from LAPACK's or torch's.
TOLERANCES = {
    "linalg.matrix_power": (1e-3, 1e-4),
    "linalg.pinv": (1e-3, 1e-4),
    "linalg.lstsq": (1e-3, 1e-4),
    "matrix_exp": (1e-3, 1e-4),
    "linalg.matrix_exp": (1e-3, 1e-4),
    "linalg.cond": (1e-3, 1e-4),
    "cov": (1e-3, 1e-5),
    "polygamma": (1e-3, 1e-5),
    "special.polygamma": (1e-3, 1e-5),
    "mvlgamma": (1e-3, 1e-5),
    # Outputs near 0 that are weighted sums of values up to ~9 (the later samples' is_causal and
    # attn_mask forms): eager and XLA are each ~1e-5 off float64 there, in different elements.
    "nn.functional.scaled_dot_product_attention": (1e-4, 3e-5),
}


# Half precision: one rounding of a bfloat16 result is up to 2**-8 of it (torch's own rtol for
# the dtype is 1.6e-2); atol 1e-2 for results near 0 (a difference of values rounded apart).
# Eager computes each op in float32 and rounds once, as the lazy device does; they still differ
# where the float32 computations do (an ulp of float32 that tips a rounding of bfloat16). The
# gradients are held to the same tolerance. float16's (11 significant bits) is provisional: no
# suite runs op_db in float16 (``bench/opinfo_coverage.py --dtype float16`` does).
LOW_PRECISION = {
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
}
# Per op, in half precision: (rtol, atol), each with why.
LOW_PRECISION_TOLERANCES: dict = {}
# Where a value is outside the tolerance of eager's, float64 on the same values settles it: an
# element no farther from float64's than eager's is not wrong (eager's own error differs by CPU:
# matrix_exp's float32 kernel is 3.5e-4 off float64 in an element where XLA is 1.2e-4 off).
WIDENED = frozenset((torch.float32, *LOW_PRECISION))


def tolerances(op, dtype) -> tuple:
    """``((rtol, atol), (rtol, atol))`` for the values and the gradients of ``op`` in ``dtype``."""
    if dtype in LOW_PRECISION:
        tolerance = LOW_PRECISION_TOLERANCES.get(op.name, LOW_PRECISION[dtype])
        return tolerance, tolerance
    rtol, atol = TOLERANCES.get(op.name, (RTOL, ATOL))
    return (rtol, atol), (max(rtol * 10, GRAD_RTOL), max(atol * 10, GRAD_ATOL))


# Ops that address their input's storage: a lazy tensor, like a tensor moved to any other
# device, is its own contiguous storage, so eager runs on contiguous copies of the inputs.
STORAGE_OPS = frozenset(("as_strided", "as_strided_copy", "as_strided_scatter"))


# Ops whose other tensor arguments torch requires on the CPU (a host-side list of indices).
HOST_ARGUMENTS = frozenset(("tensor_split",))


def population(dtype=DTYPE):
    """The ops checked: torch's op_db less jiterator and sparse entries, those taking ``dtype``
    on the CPU."""
    return [
        op
        for op in op_db
        if not op.name.startswith("jiterator")
        and "sparse" not in op.name
        and dtype in op.supported_dtypes("cpu")
    ]


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@dataclasses.dataclass
class Outcome:
    values: str  # "pass" | "raise" | "wrong"
    grads: str | None  # the same, or None where the op has no gradient
    detail: str = ""
    # Half precision: "values" and/or "gradients" that differ from eager's beyond the tolerance
    # and pass by being no farther from float64's than eager's (the module's docstring).
    nearer: tuple = ()


def _lazy(x):
    if isinstance(x, torch.Tensor):
        out = irt.to_lazy(x.detach())
        if x.requires_grad:
            out.requires_grad_(True)
        return out
    return x


def _host(x):
    return irt.to_torch(x) if isinstance(x, torch.Tensor) else x


def _call(op, sample, convert):
    if op.name in HOST_ARGUMENTS:
        args, kwargs = (convert(sample.input), *sample.args), sample.kwargs
        return op(*args, **kwargs), args, kwargs
    args = tree_map(convert, (sample.input, *sample.args))
    kwargs = tree_map(convert, sample.kwargs)
    return op(*args, **kwargs), args, kwargs


def _eager(op, sample, seed):
    """Eager's result, copied (an in-place op returns its input, which the next run rewrites)."""
    torch.manual_seed(seed)
    out = op(sample.input, *sample.args, **sample.kwargs)
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


def _same(got, want, rtol, atol, what):
    """None when ``got`` (host values) equals ``want``, else a description."""
    g, _ = tree_flatten(got)
    w, _ = tree_flatten(want)
    if len(g) != len(w):
        return f"{what}: {len(g)} outputs, eager gives {len(w)}"
    for k, (a, b) in enumerate(zip(g, w, strict=True)):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"{what} {k}: {type(a).__name__}, eager gives a tensor"
            if a.shape != b.shape or a.dtype != b.dtype:
                return f"{what} {k}: {a.dtype}{list(a.shape)}, eager {b.dtype}{list(b.shape)}"
            try:
                torch.testing.assert_close(
                    a, b.detach(), rtol=rtol, atol=atol, equal_nan=True, check_device=False
                )
            except AssertionError as e:
                return f"{what} {k}: {str(e).splitlines()[0:4]}"
        elif a != b and not (a != a and b != b):  # NaN equals NaN here
            return f"{what} {k}: {a!r}, eager gives {b!r}"
    return None


def _distance(x, exact):
    """``|x - exact|`` elementwise, 0 where they are equal (infinities), inf where NaN."""
    return torch.where(x == exact, 0.0, (x - exact).abs().nan_to_num(nan=float("inf")))


def _nearer(got, want, precise, rtol, atol, what):
    """None when every element of ``got`` (host values) is within the tolerance of ``want``'s
    (eager's) or no farther than it from ``precise``'s (float64's), else a description."""
    g, w, p = (tree_flatten(x)[0] for x in (got, want, precise))
    if not len(g) == len(w) == len(p):
        return f"{what}: {len(g)} outputs, eager gives {len(w)}, float64 {len(p)}"
    for k, (a, b, c) in enumerate(zip(g, w, p, strict=True)):
        problem = _same([a], [b], rtol, atol, what)
        if problem is None:
            continue
        comparable = (
            isinstance(b, torch.Tensor)
            and b.is_floating_point()
            and isinstance(a, torch.Tensor)
            and isinstance(c, torch.Tensor)
            and a.shape == b.shape == c.shape
            and a.dtype == b.dtype
        )
        if not comparable:
            return problem.replace(f"{what} 0", f"{what} {k}", 1)
        a, b, c = a.double(), b.detach().double(), c.detach().double()
        close = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        exact_nan = c.isnan()
        ok = close | (exact_nan & a.isnan()) | (~exact_nan & (_distance(a, c) <= _distance(b, c)))
        if not ok.all():
            i = tuple((~ok).nonzero()[0].tolist())
            return (
                f"{what} {k}: {int((~ok).sum())} / {ok.numel()} elements are farther from "
                f"float64's than eager's and outside the tolerance; at {i}: "
                f"{a[i].item()}, eager {b[i].item()}, float64 {c[i].item()}"
            )
    return None


def _in_float64(sample, dtype):
    """The sample's arguments with its ``dtype`` tensors as float64 leaves (the same values)."""

    def wide(t):
        if isinstance(t, torch.Tensor) and t.dtype == dtype:
            return t.detach().double().requires_grad_(t.requires_grad)
        return t

    return tree_map(wide, (sample.input, *sample.args)), tree_map(wide, sample.kwargs)


def _same_layout(got, want, what):
    g, _ = tree_flatten(got)
    w, _ = tree_flatten(want)
    if len(g) != len(w):
        return f"{what}: {len(g)} outputs, eager gives {len(w)}"
    for k, (a, b) in enumerate(zip(g, w, strict=True)):
        if isinstance(b, torch.Tensor) and (a.shape != b.shape or a.dtype != b.dtype):
            return f"{what} {k}: {a.dtype}{list(a.shape)}, eager {b.dtype}{list(b.shape)}"
    return None


@contextlib.contextmanager
def unseeded(op):
    """Within: ``op`` called without OpInfo's ``wrapper_set_seed`` (seed 42 inside), which
    some random ops are wrapped in."""
    fn = getattr(op.op, "__wrapped__", op.op)
    scope = getattr(fn, "__globals__", {})
    seeded = "wrapper_set_seed" in getattr(getattr(fn, "__code__", None), "co_names", ())
    saved = scope.get("wrapper_set_seed")
    if seeded:
        scope["wrapper_set_seed"] = lambda f, *args, **kwargs: f(*args, **kwargs)
    try:
        yield
    finally:
        if seeded:
            scope["wrapper_set_seed"] = saved


def _random(op, sample) -> bool:
    """Whether eager's result depends on the seed (or is uninitialized memory), asked without
    OpInfo's reseeding (``unseeded``)."""
    if "empty" in op.name or op.name in ("new_empty_strided",):
        return True
    with unseeded(op):
        first = _eager(op, sample, 0)
        return any(_same(_eager(op, sample, s), first, 0, 0, "x") for s in (1, 2, 3))


def _differentiable(outs):
    return [
        o
        for o in tree_flatten(outs)[0]
        if isinstance(o, torch.Tensor) and o.requires_grad and o.grad_fn is not None
    ]


def _grad_inputs(args, kwargs):
    return [
        t
        for t in tree_flatten((args, kwargs))[0]
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]


def _contiguous(sample):
    def copy(t):
        if not isinstance(t, torch.Tensor):
            return t
        fresh = t.detach().clone(memory_format=torch.contiguous_format)
        return fresh.requires_grad_(t.requires_grad)

    return sample.transform(copy)


@dataclasses.dataclass
class _Run:
    """One sample recorded on the lazy device beside eager's result: the lazy result and, where
    the op has them, its input gradients, both pending until a step computes them."""

    want: object  # eager's result
    random: bool  # whether eager's result depends on the seed
    got: object = None  # the lazy result
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    cots: list | None = None  # the cotangents, one per differentiable output (eager's)
    grads: list | None = None  # the lazy input gradients (pending)
    grads_error: BaseException | None = None  # recording the gradients raised


def _record(op, sample, with_grad: bool) -> _Run:
    """Eager's result, and the lazy result (and gradients, where ``with_grad`` and eager has
    them) recorded, not yet computed."""
    random = _random(op, sample)
    # What torch's own tests compare: outputs made unique where the op's are not (an
    # eigenvector's sign, a singular vector's phase: LAPACK builds may pick either).
    unique = sample.output_process_fn_grad
    torch.manual_seed(0)
    want = unique(op(sample.input, *sample.args, **sample.kwargs))
    torch.manual_seed(0)
    got, args, kwargs = _call(op, sample, _lazy)
    run = _Run(want, random, unique(got), args, kwargs)
    if with_grad and not random:
        try:
            _record_grads(sample, run)
        except Exception as e:
            run.grads_error = e
    return run


def _record_grads(sample, run: _Run) -> None:
    outs_e = _differentiable(run.want)
    ins_e = _grad_inputs((sample.input, *sample.args), sample.kwargs)
    if not outs_e or not ins_e:
        return
    gen = torch.Generator().manual_seed(1234)
    run.cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs_e]
    outs_l = _differentiable(run.got)
    ins_l = _grad_inputs(run.args, run.kwargs)
    if len(outs_l) != len(outs_e) or len(ins_l) != len(ins_e):
        raise RuntimeError("the lazy result's autograd graph differs from eager's")
    cots = [irt.to_lazy(c) for c in run.cots]
    run.grads = list(torch.autograd.grad(outs_l, ins_l, cots, allow_unused=True))


def _values(op, sample, rtol, atol, dtype, run: _Run | None = None):
    """(problem or None, nearer?, lazy result, its lazy arguments, eager result, random?);
    nearer: the values differ from eager's and pass by being nearer float64's. ``run``: the
    sample recorded and computed already (else recorded and computed here)."""
    if run is None:
        run = _record(op, sample, False)
        irt.mark_step()  # every output in one program (read one by one, each would be its own)
    got, args, kwargs, want = run.got, run.args, run.kwargs, run.want
    host = tree_map(_host, got)
    if run.random:
        return _same_layout(host, want, "output"), False, got, args, kwargs, want, True
    problem = _same(host, want, rtol, atol, "output")
    if problem is None or dtype not in WIDENED:
        return problem, False, got, args, kwargs, want, False
    wide_args, wide_kwargs = _in_float64(sample, dtype)
    try:
        torch.manual_seed(0)
        precise = sample.output_process_fn_grad(op(*wide_args, **wide_kwargs))
    except Exception:  # no float64 kernel: eager is the only oracle
        return problem, False, got, args, kwargs, want, False
    problem = _nearer(host, want, precise, rtol, atol, "output")
    return problem, problem is None, got, args, kwargs, want, False


def _grads(op, sample, got, args, kwargs, want, rtol, atol, dtype, run: _Run | None = None):
    """(None when the input gradients equal eager's, else a description; nearer?), nearer as
    ``_values``'s. ``run``: the gradients recorded and computed already (else here)."""
    if run is None:
        run = _Run(want, False, got, args, kwargs)
        _record_grads(sample, run)
        irt.mark_step()  # (one program for every gradient)
    if run.grads_error is not None:
        raise run.grads_error
    if run.cots is None:
        return None, False
    outs_e = _differentiable(want)
    ins_e = _grad_inputs((sample.input, *sample.args), sample.kwargs)
    grads_e = torch.autograd.grad(outs_e, ins_e, run.cots, allow_unused=True)
    grads_l = [None if g is None else irt.to_torch(g) for g in run.grads]
    for k, (a, b) in enumerate(zip(grads_l, grads_e, strict=True)):
        if (a is None) != (b is None):
            return f"gradient {k}: {'None' if a is None else 'a tensor'} against eager", False
    pairs = [(a, b) for a, b in zip(grads_l, grads_e, strict=True) if b is not None]
    got_g, want_g = [a for a, _ in pairs], [b for _, b in pairs]
    problem = _same(got_g, want_g, rtol, atol, "gradient")
    if problem is None or dtype not in WIDENED:
        return problem, False
    wide_args, wide_kwargs = _in_float64(sample, dtype)
    try:
        outs_p = _differentiable(sample.output_process_fn_grad(op(*wide_args, **wide_kwargs)))
        ins_p = _grad_inputs(wide_args, wide_kwargs)
        cots_p = [c.to(o.dtype) for c, o in zip(run.cots, outs_p, strict=True)]
        grads_p = torch.autograd.grad(outs_p, ins_p, cots_p, allow_unused=True)
    except Exception:  # no float64 kernel: eager is the only oracle
        return problem, False
    precise = [c for c, b in zip(grads_p, grads_e, strict=True) if b is not None]
    problem = _nearer(got_g, want_g, precise, rtol, atol, "gradient")
    return problem, problem is None


def _failure(e) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def samples_of(op, n: int | None, requires_grad: bool, dtype=DTYPE):
    """The first ``n`` samples in ``dtype``, or all of them where ``n`` is None."""
    torch.manual_seed(0)
    it = op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
    out = []
    for s in it:
        out.append(s)
        if len(out) == n:
            break
    return out


def judge(name: str, outcome: Outcome, known, listed_in: str) -> None:
    """Assert what a suite's run of one op must show: no wrong value ever; a pass, unless the op
    is a known failure ``known`` (``(part, reason)`` from the list ``listed_in``), which must
    still fail, its values passing where only its gradients are listed."""
    assert "wrong" not in (outcome.values, outcome.grads), f"{name}: {outcome.detail}"
    passed = outcome.values == "pass" and outcome.grads in ("pass", None)
    if known is None:
        assert passed, f"{name} ({outcome.values}, gradients {outcome.grads}): {outcome.detail}"
        return
    part, reason = known
    assert not passed, f"{name} passes now: remove it from {listed_in} ({reason})"
    if part == "gradients":
        assert outcome.values == "pass", f"{name}'s values fail too: {outcome.detail}"


def _record_all(op, todo) -> list | None:
    """Every ``(sample, with gradients?)`` recorded (values, and gradients where asked), then
    computed by one step: one program per op, where a program per sample and per part would
    each compile. None when a sample cannot be recorded or the step fails: each sample is then
    recorded and computed on its own, its values before its gradients, which tells what
    failed."""
    runs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for sample, with_grad in todo:
                runs.append(_record(op, sample, with_grad))
            irt.mark_step()
        except Exception:
            return None
    return runs


def check(op, n_samples: int | None = 3, dtype=DTYPE) -> Outcome:
    """Values (and gradients, where the op has them in ``dtype``) of the first ``n_samples``
    samples in ``dtype`` (all of them where ``n_samples`` is None)."""
    with_grad = op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")
    (rtol, atol), grad_tol = tolerances(op, dtype)
    values, grads, detail = "pass", "pass" if with_grad else None, ""
    nearer = set()
    try:
        samples = samples_of(op, n_samples, with_grad, dtype)
    except Exception as e:  # the oracle cannot make samples: not ours to judge
        return Outcome("raise", "raise" if with_grad else None, f"samples: {e!r}"[:300])
    if op.name in STORAGE_OPS:
        samples = [_contiguous(sample) for sample in samples]
    runs = _record_all(op, [(sample, with_grad) for sample in samples])
    for k, sample in enumerate(samples):
        run = runs[k] if runs is not None else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                v, near, got, args, kwargs, want, random = _values(
                    op, sample, rtol, atol, dtype, run
                )
            except Exception as e:
                if values == "pass":
                    values, detail = "raise", _failure(e)
                continue
            if v is not None:
                values, detail = "wrong", v
                continue
            if near:
                nearer.add("values")
            if not with_grad or random or grads != "pass":
                continue
            try:
                g, near = _grads(op, sample, got, args, kwargs, want, *grad_tol, dtype, run)
            except Exception as e:
                grads, detail = "raise", "gradient: " + _failure(e)
                continue
            if g is not None:
                grads, detail = "wrong", g
            elif near:
                nearer.add("gradients")
    if with_grad and values != "pass":
        grads = values if grads == "pass" else grads
    return Outcome(values, grads, detail, tuple(sorted(nearer, reverse=True)))
