"""stack_layers: a stack's tensors stored stacked. Training against the same layers run one by
one in torch eager (values after AdamW steps with weight decay, every state_dict entry), the
program's size against depth, state_dict both ways, views, sharding and fully_shard, the
optimizer guard, and the fallbacks. CheckpointManager's side is in the integration suite
(orbax is an optional dependency)."""

import copy
import re
import warnings

import numpy as np
import pytest
import torch
from test_scan import MESH, Block, stack

import ir_runtime as irt
from ir_runtime._frontend import inspect


def data(k=0, n=8, d=16):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(k))


def eager_step(model, opt, x):
    h = x
    for layer in model:
        h = layer(h)
    loss = h.square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def lazy_step(model, opt, x):
    loss = irt.scan_layers(model, irt.to_lazy(x)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    irt.mark_step()
    return irt.to_torch(loss)


def assert_state_equal(lazy, eager, exact=False):
    """Every entry of the state dicts, keys in the same order; after Adam steps to float
    rounding (Adam's normalization scales a gradient's last bits up where its square is small)."""
    got, want = lazy.state_dict(), eager.state_dict()
    assert list(got) == list(want)
    tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-4, "atol": 1e-5}
    for k, v in want.items():
        np.testing.assert_allclose(irt.to_torch(got[k]).numpy(), v.numpy(), err_msg=k, **tol)


def stacked_pair(layers=4, seed=0):
    eager = stack(layers, seed=seed)
    lazy = irt.stack_layers(irt.to_lazy(copy.deepcopy(eager)))
    return eager, lazy


def test_training_equals_eager_and_the_state_dict_keeps_per_layer_keys():
    eager, lazy = stacked_pair()
    names = [n for n, _ in lazy.named_parameters()]
    assert names == ["norm__weight", "norm__bias", "up__weight", "up__bias", "down__weight"]
    assert lazy.up__weight.shape == (4, 32, 16) and lazy.gain.shape == (4, 16)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.9))
    opt_l = torch.optim.AdamW(lazy.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.9))
    for k in range(4):
        x = data(k)
        np.testing.assert_allclose(
            lazy_step(lazy, opt_l, x).item(), eager_step(eager, opt_e, x).item(), rtol=1e-5
        )
    assert_state_equal(lazy, eager)
    assert len(opt_l.state) == 5  # one state per stacked name
    assert opt_l.state[lazy.up__weight]["exp_avg"].shape == (4, 32, 16)


def _program_size(layers, stacked):
    torch.manual_seed(0)
    model = irt.to_lazy(stack(layers))
    if stacked:
        irt.stack_layers(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    lazy_step(model, opt, data())
    lazy_step(model, opt, data(1))  # (the step with the optimizer's state)
    text = inspect.last_executable().compiled.as_text()
    entry = text[text.index("ENTRY") :]
    return len(re.findall(r" = ", entry)), entry.count("parameter(")


def test_the_step_program_does_not_grow_with_depth():
    """The step's entry computation (its instructions and its arguments) is the same for 2
    stacked layers as for 8; per-layer storage grows with the depth (the control)."""
    assert _program_size(2, True) == _program_size(8, True)
    per_layer = _program_size(2, False), _program_size(8, False)
    assert per_layer[1][1] > per_layer[0][1] and per_layer[1][0] > per_layer[0][0]


def test_inside_compile_step_it_replays_and_trains_like_eager():
    eager, lazy = stacked_pair()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)

    @irt.compile_step
    def step(x):
        loss = irt.scan_layers(lazy, x).square().mean()
        loss.backward()
        opt_l.step()
        opt_l.zero_grad()
        return loss

    irt.reset_metrics()
    for k in range(5):
        x = data(k)
        np.testing.assert_allclose(
            irt.to_torch(step(irt.to_lazy(x))).item(),
            eager_step(eager, opt_e, x).item(),
            rtol=1e-5,
        )
    assert step.replaying and irt.metrics()["counters"]["StepReplay"] == 2
    assert_state_equal(lazy, eager)


def test_views_read_and_write_their_row():
    eager, lazy = stacked_pair()
    np.testing.assert_array_equal(
        irt.to_torch(lazy[2].up.weight).numpy(), eager[2].up.weight.detach().numpy()
    )
    with torch.no_grad():
        lazy[1].up.weight.mul_(2.0)
        lazy[3].down.reset_parameters()  # (kaiming init, in place, through the view)
    want = eager.state_dict()
    got = lazy.state_dict()
    np.testing.assert_allclose(
        irt.to_torch(got["1.up.weight"]).numpy(), 2 * want["1.up.weight"].numpy(), rtol=1e-6
    )
    np.testing.assert_array_equal(irt.to_torch(got["0.up.weight"]), want["0.up.weight"])
    assert not np.allclose(irt.to_torch(got["3.down.weight"]), want["3.down.weight"])
    with pytest.raises(AttributeError, match=r"up\.weight of layer 1 is a view of the stacked"):
        lazy[1].up.weight = torch.nn.Parameter(torch.zeros(32, 16))
    np.testing.assert_allclose(
        irt.to_torch(lazy.up__weight[1]).numpy(), 2 * want["1.up.weight"].numpy(), rtol=1e-6
    )


def test_an_unrolled_loop_and_a_slice_of_the_stack_train_as_eager():
    """The layers called one by one (each reads its view) and ``scan_layers`` over
    ``layers[1:]`` (a slice of each stacked tensor): values and gradients as eager's."""
    eager, lazy = stacked_pair()
    x = data()
    h = eager[0](x)
    for layer in eager[1:]:
        h = layer(h)
    h.square().mean().backward()
    lh = lazy[0](irt.to_lazy(x))
    lh = irt.scan_layers(lazy[1:], lh)
    lh.square().mean().backward()
    grads = {n: p.grad for n, p in lazy.named_parameters()}
    irt.mark_step()
    np.testing.assert_allclose(irt.to_torch(lh).numpy(), h.detach().numpy(), rtol=1e-5, atol=1e-6)
    for i, layer in enumerate(eager):
        for name, p in layer.named_parameters():
            got = irt.to_torch(grads[name.replace(".", "__")])[i]
            np.testing.assert_allclose(got.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-7)


def test_load_state_dict_takes_the_unstacked_models_and_names_what_does_not_fit():
    eager, lazy = stacked_pair()
    other = stack(seed=5)
    lazy.load_state_dict(other.state_dict())
    assert_state_equal(lazy, other, exact=True)
    partial = {k: v for k, v in eager.state_dict().items() if not k.startswith("2.")}
    result = lazy.load_state_dict(partial, strict=False)
    assert sorted(result.missing_keys) == sorted(k for k in eager.state_dict() if k[:2] == "2.")
    got = lazy.state_dict()
    np.testing.assert_array_equal(irt.to_torch(got["1.up.weight"]), eager[1].up.weight.detach())
    np.testing.assert_array_equal(irt.to_torch(got["2.up.weight"]), other[2].up.weight.detach())
    bad = dict(eager.state_dict())
    bad["3.up.weight"] = torch.zeros(5, 16)
    before = irt.to_torch(lazy.up__weight)
    with pytest.raises(RuntimeError, match=r"size mismatch for 3\.up\.weight"):
        lazy.load_state_dict(bad)
    np.testing.assert_array_equal(irt.to_torch(lazy.up__weight), before)


def test_an_optimizer_made_before_stacking_is_refused_by_name():
    torch.manual_seed(0)
    lazy = irt.to_lazy(stack())
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1)
    irt.stack_layers(lazy)
    lazy_loss = irt.scan_layers(lazy, irt.to_lazy(data())).square().mean()
    lazy_loss.backward()
    with pytest.raises(ValueError, match=r"holds the parameter 0\.norm\.weight that stack_layers"):
        opt.step()


def test_an_optimizer_not_known_to_be_elementwise_is_refused_then_allowed():
    _, lazy = stacked_pair()
    opt = torch.optim.Adafactor(lazy.parameters(), lr=1e-2)
    irt.scan_layers(lazy, irt.to_lazy(data())).square().mean().backward()
    with pytest.raises(ValueError, match=r"Adafactor updates the stacked parameter norm__weight"):
        opt.step()

    class Plain(torch.optim.SGD):
        pass

    opt = Plain(lazy.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="Plain updates the stacked"):
        opt.step()
    irt.STACK_SAFE_OPTIMIZERS.add(Plain)
    try:
        opt.step()
    finally:
        irt.STACK_SAFE_OPTIMIZERS.discard(Plain)


@pytest.mark.parametrize(
    "spoil, why",
    [
        (lambda m: m[2].up.weight.requires_grad_(False), r"up\.weight requires grad in layer 0"),
        (lambda m: setattr(m[1], "down", m[0].down), r"down\.weight of layer 1 is the same"),
        (
            lambda m: irt.mark_sharding(m[3].up.weight, MESH, ("model", None)),
            r"up\.weight is annotated differently in layer 3",
        ),
    ],
)
def test_layers_that_cannot_be_stacked_stay_as_they_were_with_one_warning(spoil, why):
    torch.manual_seed(0)
    lazy = irt.to_lazy(stack())
    spoil(lazy)
    before = [(n, p) for n, p in lazy.named_parameters()]
    with pytest.warns(irt.StackWarning, match=why):
        assert irt.stack_layers(lazy) is lazy
    assert [(n, p) for n, p in lazy.named_parameters()] == before


def test_scan_over_layers_not_one_run_of_the_stack_stacks_their_views_with_one_warning():
    eager, lazy = stacked_pair()
    x = data()
    h = x
    for layer in [eager[0], eager[2]]:
        h = layer(h)
    with pytest.warns(irt.StackWarning, match="not one contiguous run"):
        out = irt.scan_layers([lazy[0], lazy[2]], irt.to_lazy(x))
    np.testing.assert_allclose(irt.to_torch(out).numpy(), h.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_sharding_carries_over_and_fully_shard_splits_each_layers_dim_0():
    eager, lazy = stack(), None
    lazy = irt.to_lazy(copy.deepcopy(eager))
    for layer in lazy:
        irt.mark_sharding(layer.up.weight, MESH, ("model", None))
    irt.stack_layers(lazy)
    assert inspect.annotation_of(lazy.up__weight).partition_spec == (None, "model", None)
    from torch.distributed.fsdp import fully_shard

    mesh = irt.device_mesh((4, 2), ("dp", "tp"))

    class Net(torch.nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = layers

        def forward(self, x):
            return irt.scan_layers(self.layers, x)

    net = Net(lazy)
    fully_shard(net, mesh=mesh["dp"])
    spec = inspect.annotation_of(lazy.down__weight).partition_spec
    assert spec[0] is None and spec[1] == "dp", spec
    assert inspect.annotation_of(lazy.up__weight).partition_spec[:2] == (None, "dp")
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_l = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for k in range(3):
        x = data(k)
        loss = net(irt.to_lazy(x)).square().mean()
        loss.backward()
        opt_l.step()
        opt_l.zero_grad()
        irt.mark_step()
        np.testing.assert_allclose(
            irt.to_torch(loss).item(), eager_step(eager, opt_e, x).item(), rtol=1e-5
        )
    assert_state_equal(lazy, eager)


def test_unstack_layers_gives_each_layer_its_own_tensors_back():
    eager, lazy = stacked_pair()
    with torch.no_grad():
        lazy[1].up.weight.add_(1.0)
        eager[1].up.weight.add_(1.0)
    assert irt.unstack_layers(lazy) is lazy
    assert [n for n, _ in lazy.named_parameters()] == [n for n, _ in eager.named_parameters()]
    assert type(lazy[0].up) is torch.nn.Linear
    assert_state_equal(lazy, eager, exact=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        irt.stack_layers(lazy)  # and stacked again
    assert_state_equal(lazy, eager, exact=True)


def test_bad_containers_are_refused_by_name():
    with pytest.raises(TypeError, match="stack_layers takes the ModuleList or Sequential"):
        irt.stack_layers(list(irt.to_lazy(stack())))
    with pytest.raises(ValueError, match="layer 1 is a Linear, layer 0 a Block"):
        irt.stack_layers(irt.to_lazy(torch.nn.ModuleList([Block(16), torch.nn.Linear(16, 16)])))


def test_a_replaced_submodule_keeps_its_own_tensors_and_the_scan_refuses_the_changed_stack():
    eager, lazy = stacked_pair()
    new = torch.nn.Linear(16, 32)
    eager[2].up = copy.deepcopy(new)
    lazy[2].up = irt.to_lazy(new)
    assert_state_equal(lazy, eager, exact=True)  # layer 2's up: its own tensors, in order
    other = stack(seed=9)
    lazy.load_state_dict(other.state_dict())
    assert_state_equal(lazy, other, exact=True)  # its keys loaded into it, not into the stack
    with pytest.raises(ValueError, match="deleted, moved or replaced"):
        irt.scan_layers(lazy, irt.to_lazy(data()))
    h = irt.to_lazy(data())
    for layer in lazy:  # (the layers one by one read what they hold)
        h = layer(h)
    want = data()
    for layer in other:
        want = layer(want)
    np.testing.assert_allclose(irt.to_torch(h).numpy(), want.detach().numpy(), rtol=1e-5)


def test_a_deleted_layer_gives_its_row_to_no_other():
    eager, lazy = stacked_pair()
    del eager[0]
    del lazy[0]
    assert_state_equal(lazy, eager, exact=True)  # "0.up.weight" is the old layer 1's
    irt.unstack_layers(lazy)
    assert_state_equal(lazy, eager, exact=True)
    assert [n for n, _ in lazy.named_parameters()] == [n for n, _ in eager.named_parameters()]


def test_after_unstack_layers_an_optimizer_of_the_stack_refuses_to_step():
    _, lazy = stacked_pair()
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1)
    irt.unstack_layers(lazy)
    with pytest.raises(
        ValueError, match=r"holds the parameter norm__weight that unstack_layers replaced"
    ):
        opt.step()


def test_a_deep_copy_is_a_stack_too():
    _, lazy = stacked_pair()
    twin = copy.deepcopy(lazy)
    assert twin.up__weight is not lazy.up__weight
    irt.scan_layers(twin, irt.to_lazy(data())).square().mean().backward()
    opt = torch.optim.Adafactor(twin.parameters())
    with pytest.raises(ValueError, match="Adafactor updates the stacked"):
        opt.step()
    with torch.no_grad():
        twin[1].up.weight.zero_()
    assert irt.to_torch(lazy[1].up.weight).abs().sum() > 0  # the copy's own storage
    assert irt.to_torch(twin.up__weight[1]).abs().sum() == 0


def test_stacks_do_not_nest():
    torch.manual_seed(0)
    outer = irt.to_lazy(torch.nn.ModuleList(torch.nn.ModuleList([Block(16), Block(16)])
                                            for _ in range(2)))  # fmt: skip
    irt.stack_layers(outer[0])
    irt.stack_layers(outer[1])
    with pytest.raises(ValueError, match="stacks do not nest"):
        irt.stack_layers(outer)


def test_views_held_across_donating_steps_read_the_updated_rows():
    """A view taken before training (and a state_dict entry) reads its row as the steps left it,
    though each step donates the stacked buffers it replaces."""
    eager, lazy = stacked_pair()
    held = lazy[1].up.weight
    entry = lazy.state_dict()["3.down.weight"]
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_l = torch.optim.AdamW(lazy.parameters(), lr=1e-2)
    irt.reset_metrics()
    for k in range(3):
        lazy_step(lazy, opt_l, data(k))
        eager_step(eager, opt_e, data(k))
    assert irt.metrics()["counters"]["DonatedBuffers"] > 0
    tol = {"rtol": 1e-4, "atol": 1e-5}
    np.testing.assert_allclose(irt.to_torch(held).numpy(), eager[1].up.weight.detach(), **tol)
    np.testing.assert_allclose(irt.to_torch(entry).numpy(), eager[3].down.weight.detach(), **tol)
