"""scan_layers: a stack of identical layers as one scan, against the same layers run one by one
in torch eager (values and gradients), sharded and inside compile_step; refusals."""

import copy

import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_runtime._frontend import inspect

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


class Block(torch.nn.Module):
    """A residual block with a norm, a buffer it reads and a Python constant."""

    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d, eps=1e-12)
        self.up, self.down = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d, bias=False)
        self.register_buffer("gain", torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)))) * self.gain * 0.5


def stack(layers=4, d=16, seed=0):
    torch.manual_seed(seed)
    return torch.nn.ModuleList(Block(d) for _ in range(layers))


def run_eager(model, x):
    x = x.clone().requires_grad_()
    h = x
    for layer in model:
        h = layer(h)
    h.square().mean().backward()
    return h.detach(), x.grad, [p.grad for p in model.parameters()]


def run_lazy(model, x):
    x = irt.to_lazy(x).requires_grad_()
    h = irt.scan_layers(model, x)
    h.square().mean().backward()
    grads = [p.grad for p in model.parameters()]
    irt.mark_step()
    return irt.to_torch(h), irt.to_torch(x.grad), [irt.to_torch(g) for g in grads]


def assert_same(got, want):
    (h, gx, gs), (eh, egx, egs) = got, want
    np.testing.assert_allclose(h.numpy(), eh.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx.numpy(), egx.numpy(), rtol=1e-5, atol=1e-7)
    for g, e in zip(gs, egs, strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("layers", [1, 3])
def test_values_and_gradients_equal_eager(layers):
    eager = stack(layers)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    assert_same(run_lazy(lazy, x), run_eager(eager, x))
    assert list(lazy.state_dict()) == list(eager.state_dict())  # per-layer parameters still


def test_sharded_parameters():
    eager = stack()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    for layer in lazy:
        irt.mark_sharding(layer.up.weight, MESH, ("model", None))
        irt.mark_sharding(layer.down.weight, MESH, (None, "model"))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    assert_same(run_lazy(lazy, x), run_eager(eager, x))
    assert inspect.annotation_of(lazy[2].up.weight) is not None


def test_one_layer_is_compiled_whatever_the_depth():
    """The program holds the body once: the same number of dots for 2 layers as for 8."""
    dots = []
    for layers in (2, 8):
        lazy = irt.to_lazy(stack(layers))
        run_lazy(lazy, torch.randn(8, 16))
        dots.append(inspect.last_executable().compiled.as_text().count(" dot("))
    assert dots[0] == dots[1] > 0, dots


def test_inside_compile_step_it_replays_and_trains_like_eager():
    eager = stack()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)

    def eager_step(x):
        h = x
        for layer in eager:
            h = layer(h)
        loss = h.square().mean()
        loss.backward()
        opt_e.step()
        opt_e.zero_grad()
        return loss

    @irt.compile_step
    def lazy_step(x):
        loss = irt.scan_layers(lazy, x).square().mean()
        loss.backward()
        opt_l.step()
        opt_l.zero_grad()
        return loss

    irt.reset_metrics()
    for k in range(5):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(k))
        np.testing.assert_allclose(
            irt.to_torch(lazy_step(irt.to_lazy(x))).item(), eager_step(x).item(), rtol=1e-5
        )
    assert lazy_step.replaying and irt.metrics()["counters"]["StepReplay"] == 2
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        np.testing.assert_allclose(irt.to_torch(p_l).numpy(), p_e.detach().numpy(), atol=1e-6)


def test_each_layer_draws_its_own_dropout_mask():
    class Drop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(x)

    x = irt.to_lazy(torch.ones(64, 64)).requires_grad_()
    out = irt.scan_layers([Drop(), Drop()], x)
    out.sum().backward()
    y = irt.to_torch(out)
    kept = float((y != 0).float().mean())
    assert 0.2 < kept < 0.3, kept  # both kept: 1/4 (the same mask twice would keep 1/2)
    assert set(np.unique(y.numpy())) <= {0.0, 4.0}
    # The backward redraws the same masks: d(sum)/dx is the product of both masks' scales.
    np.testing.assert_array_equal(irt.to_torch(x.grad).numpy(), y.numpy())


class Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)

    def forward(self, x):
        return self.fc(x)


OUTSIDE = irt.to_lazy(torch.ones(16))


class Reads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x) * OUTSIDE


class Pair(Block):
    def forward(self, x):
        return x, x


def bad_cases():
    return [
        (lambda: [Block(16), Block(8)], r"layer 1 has 'norm.weight' \[8\] float32 where layer 0"),
        (lambda: [Block(16), Wide()], r"layer 1 is a Wide, layer 0 a Block"),
        (lambda: [torch.nn.BatchNorm1d(16)] * 2, r"writes its 'running_mean' in place"),
        (lambda: [Wide(), Wide()], r"must return one tensor like its input \(\[4, 16\]"),
        (lambda: [Pair(16)], r"returned tuple"),
        (lambda: [Reads(), Reads()], r"reads a tensor float32\[16\] that is neither its input"),
    ]


@pytest.mark.parametrize(("make", "message"), bad_cases())
def test_bad_stacks_are_refused_by_name(make, message):
    layers = [irt.to_lazy(m) for m in make()]
    x = irt.to_lazy(torch.randn(4, 16))
    pending = sum(
        1 for t in inspect.live_tensors() if type(inspect.value_of(t).node).__name__ != "DeviceData"
    )
    with pytest.raises(ValueError, match=message):
        irt.scan_layers(layers, x)
    after = sum(
        1 for t in inspect.live_tensors() if type(inspect.value_of(t).node).__name__ != "DeviceData"
    )
    assert after == pending  # nothing left recorded
    np.testing.assert_array_equal(irt.to_torch(x).shape, (4, 16))


def test_a_single_module_or_host_layers_are_refused():
    with pytest.raises(TypeError, match=r"takes a sequence of modules"):
        irt.scan_layers(irt.to_lazy(Block(16)), irt.to_lazy(torch.randn(4, 16)))
    with pytest.raises(TypeError, match=r"on cpu \(ir_runtime.to_lazy the model first\)"):
        irt.scan_layers([Block(16)], irt.to_lazy(torch.randn(4, 16)))


def test_under_autocast_the_first_layer_runs_on_its_own_as_in_eager():
    """bfloat16 autocast turns the float32 input into bfloat16 in the first layer; eager runs
    every later layer on bfloat16. The scan runs the first as it is and scans the rest."""
    torch.manual_seed(0)
    eager = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.GELU())
        for _ in range(3)
    )
    lazy = irt.to_lazy(copy.deepcopy(eager))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    outs = []
    for model, dev, xs in ((eager, "cpu", x), (lazy, "lazy", irt.to_lazy(x))):
        with torch.autocast(dev, dtype=torch.bfloat16):
            if dev == "cpu":
                h = xs
                for layer in model:
                    h = layer(h)
            else:
                h = irt.scan_layers(model, xs)
        outs.append(h)
    assert outs[1].dtype == outs[0].dtype == torch.bfloat16
    np.testing.assert_allclose(
        irt.to_torch(outs[1]).float().numpy(),
        outs[0].detach().float().numpy(),
        rtol=3e-2,
        atol=3e-2,
    )


def test_a_layer_that_fails_or_writes_outside_leaves_every_later_step_whole():
    count = irt.to_lazy(torch.zeros(16))

    class Counts(Block):
        def forward(self, x):
            count.add_(1)  # a tensor from outside, written in place
            return super().forward(x)

    class Fails(Block):
        def forward(self, x):
            self.seen = super().forward(x)  # recorded on placeholders, kept past the trace
            raise RuntimeError("boom")

    x = irt.to_lazy(torch.randn(4, 16))
    with pytest.raises(ValueError, match=r"writes a tensor \[16\] float32 that is neither"):
        irt.scan_layers([irt.to_lazy(Counts(16)) for _ in range(2)], x)
    failing = [irt.to_lazy(Fails(16)) for _ in range(2)]
    with pytest.raises(RuntimeError, match="boom"):
        irt.scan_layers(failing, x)
    y = count + x.sum()
    irt.mark_step()  # neither the refused write nor the kept intermediate is run
    torch.testing.assert_close(irt.to_torch(y), torch.full((16,), irt.to_torch(x).sum().item()))
