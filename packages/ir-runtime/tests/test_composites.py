"""weight_norm's backward and pack_padded_sequence (ops torch does not decompose, recorded as
what they are made of) against torch eager: values and the gradients of every parameter and
input, for both weight_norm APIs over the first, the last and every dimension, and packed
LSTM/GRU/RNN batches, batch-first or not, sorted or not, padded back to a total length."""

import pytest
import torch
from torch.nn.utils import parametrizations
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import ir_runtime as irt


def _close(got, want, what, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(
        irt.to_torch(got), want.detach(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}"
    )


def _twice(make):
    """The same module on the CPU and on the lazy device (made twice from one seed: a
    weight-normed module cannot be deep-copied)."""
    torch.manual_seed(0)
    eager = make()
    torch.manual_seed(0)
    return eager, irt.to_lazy(make())


def _grads_match(lazy, eager):
    for (name, p), q in zip(lazy.named_parameters(), eager.parameters(), strict=True):
        _close(p.grad, q.grad, f"grad of {name}")


def _old_weight_norm(module, dim):
    with pytest.warns(FutureWarning):
        return torch.nn.utils.weight_norm(module, dim=dim)


@pytest.mark.parametrize("api", ["utils", "parametrizations"])
@pytest.mark.parametrize(
    ("layer", "dim"),
    [("linear", 0), ("linear", 1), ("linear", None), ("conv1d", 0), ("conv1d", 2)],
)
def test_weight_norm_trains_like_eager(api, layer, dim):
    def make():
        m = torch.nn.Linear(5, 4) if layer == "linear" else torch.nn.Conv1d(3, 4, 3)
        if api == "utils":
            return _old_weight_norm(m, dim)
        return parametrizations.weight_norm(m, dim=dim)

    eager, lazy = _twice(make)
    x = torch.randn(6, 5) if layer == "linear" else torch.randn(2, 3, 9)
    cot = torch.randn(eager(x).shape)
    (eager(x) * cot).sum().backward()
    out = lazy(irt.to_lazy(x))
    _close(out, eager(x), "output")
    (out * irt.to_lazy(cot)).sum().backward()
    _grads_match(lazy, eager)


def test_weight_norm_interface_backward_matches_the_cpu_kernel():
    """The op itself, against torch's CPU kernel, for a norm over the first and the last
    dimension (the only two the interface takes), float64."""
    g = torch.Generator().manual_seed(3)
    v = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    grad_w = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    for dim in (0, 2):
        keep = [1 if d != dim else v.shape[d] for d in range(3)]
        gain = torch.rand(keep, generator=g, dtype=torch.float64) + 0.5
        _, norms = torch._weight_norm_interface(v, gain, dim)
        want = torch.ops.aten._weight_norm_interface_backward(grad_w, v, gain, norms, dim)
        lazy = [irt.to_lazy(t) for t in (grad_w, v, gain, norms)]
        got = torch.ops.aten._weight_norm_interface_backward(*lazy, dim)
        for k, (a, b) in enumerate(zip(got, want, strict=True)):
            _close(a, b, f"output {k}, dim {dim}", rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_packed_sequences_train_like_eager(cell, batch_first, enforce_sorted):
    eager, lazy = _twice(lambda: getattr(torch.nn, cell)(3, 4, num_layers=2, batch_first=True))
    eager.batch_first = lazy.batch_first = batch_first
    lengths = torch.tensor([5, 3, 2, 2] if enforce_sorted else [2, 5, 2, 3])
    shape = (4, 6, 3) if batch_first else (6, 4, 3)
    x = torch.randn(shape, requires_grad=True)
    xl = irt.to_lazy(x.detach()).requires_grad_()

    def run(model, inp):
        packed = pack_padded_sequence(inp, lengths, batch_first, enforce_sorted)
        out, state = model(packed)
        padded, sizes = pad_packed_sequence(out, batch_first, padding_value=-1.0, total_length=6)
        hidden = state[0] if cell == "LSTM" else state
        return padded, sizes, hidden

    padded_e, sizes_e, hidden_e = run(eager, x)
    padded_l, sizes_l, hidden_l = run(lazy, xl)
    assert torch.equal(sizes_l, sizes_e) and sizes_l.device.type == "cpu"
    _close(padded_l, padded_e, "padded output")
    _close(hidden_l, hidden_e, "final hidden state")
    cot = torch.randn(padded_e.shape)
    ((padded_e * cot).sum() + hidden_e.square().sum()).backward()
    ((padded_l * irt.to_lazy(cot)).sum() + hidden_l.square().sum()).backward()
    _close(xl.grad, x.grad, "input gradient")
    _grads_match(lazy, eager)


def test_packing_refuses_what_torch_refuses():
    x = irt.to_lazy(torch.randn(5, 3, 2))
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order"):
        pack_padded_sequence(x, torch.tensor([2, 5, 1]))
    with pytest.raises(RuntimeError, match="greater than 0"):
        pack_padded_sequence(x, torch.tensor([5, 2, 0]))
    packed = pack_padded_sequence(x, torch.tensor([5, 2, 1]))
    assert packed.batch_sizes.tolist() == [3, 2, 1, 1, 1]
    assert packed.data.shape == (8, 2)
