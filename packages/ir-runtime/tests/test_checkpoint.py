"""Activation checkpointing: torch.utils.checkpoint on lazy tensors, against eager, with the
recompute kept in the program (XLA's memory analysis says so)."""

import copy

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as checkpoint

import ir_runtime as irt
from ir_runtime._frontend import inspect


def mlp(layers=4, d=32, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Dropout(dropout))
        for _ in range(layers)
    )


def batch(d=32, n=16):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(1))


def forward(model, x, how):
    h = x
    for layer in model:
        if how is None:
            h = layer(h)
        else:
            h = checkpoint.checkpoint(layer, h, use_reentrant=how)
    return h.pow(2).mean()


def grads_of(model, x, how):
    """The loss, the input's gradient and every parameter's, as host arrays."""
    loss = forward(model, x, how)
    loss.backward()
    out = [loss, x.grad, *(p.grad for p in model.parameters())]
    if isinstance(x, irt.LazyTensor):
        irt.mark_step()
        out = [irt.to_torch(t) for t in out]
    return [t.detach().numpy() for t in out]


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_gradients_equal_eager(reentrant):
    eager = mlp()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    x = batch()
    want = grads_of(eager, x.clone().requires_grad_(), reentrant)
    got = grads_of(lazy, irt.to_lazy(x).requires_grad_(), reentrant)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def test_keyword_arguments_and_an_input_without_grad():
    """The non-reentrant form: keyword tensors, and parameters' gradients when no input
    requires grad."""
    torch.manual_seed(0)
    eager = torch.nn.Linear(32, 32)
    lazy = irt.to_lazy(copy.deepcopy(eager))

    def fn(module, x, *, scale):
        return torch.tanh(module(x)) * scale

    x, s = batch(), torch.full((32,), 0.5)
    for m, xs, ss in ((eager, x, s), (lazy, irt.to_lazy(x), irt.to_lazy(s))):
        checkpoint.checkpoint(fn, m, xs, scale=ss, use_reentrant=False).sum().backward()
    irt.mark_step()
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        np.testing.assert_allclose(
            irt.to_torch(p_l.grad).numpy(), p_e.grad.numpy(), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_dropout_draws_the_forward_mask_again(reentrant):
    """The lazy stream differs from CPU torch's, so the oracle is the same lazy model without
    checkpointing: the recompute must draw the very masks the forward drew."""
    model = mlp(dropout=0.5)
    x = batch()
    results = []
    for how in (None, reentrant):
        torch.manual_seed(7)
        results.append(
            grads_of(irt.to_lazy(copy.deepcopy(model)), irt.to_lazy(x).requires_grad_(), how)
        )
    for g, w in zip(*results, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
    undropped = grads_of(irt.to_lazy(mlp()), irt.to_lazy(x).requires_grad_(), None)
    assert not np.isclose(undropped[0], results[0][0])  # dropout did drop


def test_checkpoint_sequential_equals_eager():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(6)))
    lazy = irt.to_lazy(copy.deepcopy(eager))
    x = batch()
    outs = []
    for m, xs in ((eager, x.clone().requires_grad_()), (lazy, irt.to_lazy(x).requires_grad_())):
        checkpoint.checkpoint_sequential(m, 3, xs, use_reentrant=False).square().sum().backward()
        outs.append([p.grad for p in m.parameters()])
    irt.mark_step()
    for g_e, g_l in zip(*outs, strict=True):
        np.testing.assert_allclose(irt.to_torch(g_l).numpy(), g_e.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_the_recompute_stays_in_the_program(reentrant):
    """XLA's memory analysis of the step: recomputed activations, not kept ones. Folded back
    into the forward (no barrier), the temporaries would be those of the plain step."""
    model, x = mlp(layers=16, d=256), batch(256, 64)
    temps = []
    for how in (None, reentrant):
        lazy = irt.to_lazy(copy.deepcopy(model))
        grads_of(lazy, irt.to_lazy(x).requires_grad_(), how)
        temps.append(inspect.last_executable().memory()["temporaries"])
    plain, checkpointed = temps
    assert checkpointed <= 0.5 * plain, temps
    lazy = irt.to_lazy(copy.deepcopy(model))
    forward(lazy, irt.to_lazy(x).requires_grad_(), reentrant).backward()
    grads = [p.grad for p in lazy.parameters()]
    assert "optimization_barrier" in irt.dump(grads[:2], "stablehlo")
    irt.mark_step()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_host_read_inside_is_refused_and_nothing_is_lost(reentrant):
    torch.manual_seed(0)
    lazy = irt.to_lazy(torch.nn.Linear(32, 32))
    before = irt.to_torch(lazy.weight).clone()

    def reads(x):
        h = lazy(x)
        if h.sum() > 0:  # a Python if on a lazy tensor: a host read
            h = h * 2
        return h

    x = irt.to_lazy(batch()).requires_grad_()
    with pytest.raises(irt.CheckpointError, match=r"reads a lazy tensor's value to the host"):
        checkpoint.checkpoint(reads, x, use_reentrant=reentrant)
    with pytest.raises(irt.RecomputeError, match=r"checkpointed function .*reads") as e:
        checkpoint.checkpoint(reads, x, use_reentrant=reentrant)
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, irt.RuntimeIRError)
    np.testing.assert_array_equal(irt.to_torch(lazy.weight).numpy(), before.numpy())
    lazy(x).sum().backward()  # the model still trains
    irt.mark_step()
    assert lazy.weight.grad is not None


def test_a_recompute_error_is_still_caught_as_the_checkpoint_error_it_was():
    """Old ``except CheckpointError`` clauses around activation recompute keep working; the
    CheckpointManager errors are not recompute errors."""
    lazy = irt.to_lazy(torch.nn.Linear(32, 32))
    x = irt.to_lazy(batch()).requires_grad_()

    def reads(x):
        h = lazy(x)
        h.sum().item()  # a host read
        return h

    caught = None
    try:
        checkpoint.checkpoint(reads, x, use_reentrant=False)
    except irt.CheckpointError as e:
        caught = e
    assert type(caught) is irt.RecomputeError
    assert issubclass(irt.RecomputeError, irt.CheckpointError)
    assert not issubclass(irt.CheckpointKeyError, irt.RecomputeError)
    assert not issubclass(irt.CheckpointMismatchError, RuntimeError)
    irt.mark_step()
