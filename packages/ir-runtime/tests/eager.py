"""Compare a torch function eagerly and on the lazy device: every output (indices exactly) and
the gradients of its floating tensor arguments (the family tests' shared oracle)."""

import torch

import ir_runtime as irt


def lazy(t):
    if not isinstance(t, torch.Tensor):
        return t
    out = irt.to_lazy(t.detach())
    return out.requires_grad_(True) if t.requires_grad else out


def _tensors(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def same(got, want, rtol, atol, what):
    got = irt.to_torch(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.shape, want.shape)
    if want.is_floating_point():
        torch.testing.assert_close(
            got, want.detach(), rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}"
        )
    else:
        assert torch.equal(got, want), f"{what}: {got} != {want}"


def compare(fn, *args, grad=True, rtol=1e-5, atol=1e-5, grad_tol=None, **kwargs):
    """``fn(*args, **kwargs)`` eagerly and on the lazy device: every tensor output and, with
    ``grad``, the gradient of every floating tensor argument for one random cotangent per
    differentiable output."""
    leaves = [
        a.detach().clone().requires_grad_(grad and a.is_floating_point())
        if isinstance(a, torch.Tensor)
        else a
        for a in args
    ]
    want = _tensors(fn(*leaves, **kwargs))
    lazy_args = [lazy(a) for a in leaves]
    lazy_kwargs = {k: lazy(v) for k, v in kwargs.items()}
    got = _tensors(fn(*lazy_args, **lazy_kwargs))
    assert len(got) == len(want)
    inputs_e = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    gl = ge = None
    recording = None
    if grad and inputs_e:
        # The gradients are recorded before anything runs: one program computes the outputs
        # and the gradients (read one by one, each output and gradient would be a program).
        pairs = [(g, w) for g, w in zip(got, want, strict=True) if w.requires_grad]
        gen = torch.Generator().manual_seed(7)
        cots = [torch.randn(w.shape, generator=gen, dtype=w.dtype) for _, w in pairs]
        ge = torch.autograd.grad([w for _, w in pairs], inputs_e, cots, allow_unused=True)
        inputs_l = [a for a in lazy_args if isinstance(a, torch.Tensor) and a.requires_grad]
        try:
            gl = torch.autograd.grad(
                [g for g, _ in pairs], inputs_l, [irt.to_lazy(c) for c in cots], allow_unused=True
            )
        except Exception as e:  # (raised once the outputs are compared: they come first)
            recording = e
    try:
        irt.mark_step()
    except Exception as e:  # (a program that cannot run: each value read runs its own)
        recording = recording or e
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if isinstance(w, torch.Tensor):
            same(g, w, rtol, atol, f"output {k}")
    if recording is not None:
        raise recording
    if ge is None:
        return want
    g_rtol, g_atol = grad_tol or (rtol * 10, atol * 10)
    for k, (a, b) in enumerate(zip(gl, ge, strict=True)):
        assert (a is None) == (b is None), f"gradient {k}: {a} against {b}"
        if b is not None:
            same(a, b, g_rtol, g_atol, f"gradient {k}")
    return want
