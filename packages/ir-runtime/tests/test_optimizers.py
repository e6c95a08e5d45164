"""Every optimizer in torch.optim, on each path torch offers it (its default, foreach=True,
capturable=True where its constructor takes it), under mark_step and compile_step, with a
LambdaLR schedule that warms up from 0 and decays to 0, on a model whose embedding has rows no
step uses (their gradients exactly 0) and a Linear sharded over "model": the parameters eager
gives (within 1e-5), no NaN where eager has none, and under compile_step every call replayed
once two traced calls agree, the rate changing every call. fused=True, SparseAdam and LBFGS:
what torch and the lazy device do with them, said by name."""

import numpy as np
import pytest
import torch

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
optim = torch.optim
CONFIGS = {
    "sgd": (optim.SGD, {}),
    "sgd-nesterov": (optim.SGD, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    "adam": (optim.Adam, {}),
    "adamw": (optim.AdamW, {}),
    "adamw-amsgrad": (optim.AdamW, {"amsgrad": True}),
    "rmsprop-centered": (optim.RMSprop, {"centered": True, "momentum": 0.9}),
    "adagrad": (optim.Adagrad, {}),
    "adamax": (optim.Adamax, {}),
    "nadam": (optim.NAdam, {}),
    "radam": (optim.RAdam, {}),
    "adadelta": (optim.Adadelta, {}),
    "rprop": (optim.Rprop, {}),
    "asgd": (optim.ASGD, {}),
}
CAPTURABLE = {"sgd", "sgd-nesterov", "adagrad"}  # (their constructors take no capturable)
CASES = [
    (name, path)
    for name in CONFIGS
    for path in ("default", "foreach", "capturable")
    if not (path == "capturable" and name in CAPTURABLE)
]
RATES = [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]  # warm up from 0, decay to 0 (as transformers')
STATELESS = {"sgd"}  # (the others' first call makes their state: a program of its own)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, ids):
        return self.lin(self.emb(ids)).square().mean()


def optimizer(name, path, params, lazy):
    cls, kw = CONFIGS[name]
    kw = dict(kw, lr=0.01)
    if path == "foreach":
        kw["foreach"] = True
    if path == "capturable" and lazy:  # (eager on the CPU: its default path)
        kw["capturable"] = True
    return cls(params, **kw)


@pytest.mark.parametrize("mode", ["mark_step", "compile_step"])
@pytest.mark.parametrize(("name", "path"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_every_optimizer_on_every_path_gives_eagers_values_through_a_rate_of_0(name, path, mode):
    torch.manual_seed(0)
    eager = Net()
    lazy = irt.to_lazy(Net())
    lazy.load_state_dict(eager.state_dict())
    irt.mark_sharding(lazy.lin.weight, MESH, ("model", None))
    opts = [optimizer(name, path, m.parameters(), m is lazy) for m in (eager, lazy)]
    scheds = [optim.lr_scheduler.LambdaLR(o, RATES.__getitem__) for o in opts]
    ids = torch.tensor([[1, 2, 3], [3, 2, 1]])  # rows 0 and 4-9: never used

    def step(model, opt, sched, x):
        loss = model(x)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        return loss

    lazy_step = step if mode == "mark_step" else irt.compile_step(step)
    irt.reset_metrics()
    calls = len(RATES) - 1
    for _ in range(calls):
        step(eager, opts[0], scheds[0], ids)
        lazy_step(lazy, opts[1], scheds[1], irt.to_lazy(ids))
        irt.mark_step()
    assert_eagers(lazy, eager)
    if mode == "compile_step":  # the first call (its state), two that agree, then replays
        counters = irt.metrics()["counters"]
        traced = 2 if name in STATELESS else 3
        assert counters["StepReplay"] == calls - traced, lazy_step.reason
        assert counters.get("StepGuardFailed", 0) == 0, lazy_step.last_guard_failure


def assert_eagers(lazy, eager, tol=1e-5):
    for (k, pl), pe in zip(lazy.named_parameters(), eager.parameters(), strict=True):
        got = irt.to_torch(pl)
        assert not got.isnan().any(), f"{k} is NaN"
        np.testing.assert_allclose(got.numpy(), pe.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.1),
        lambda p: optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=0.01),
        lambda p: optim.RMSprop(p, lr=0.01, momentum=0.9),
    ],
    ids=["adamw-betas", "sgd-momentum", "rmsprop-momentum"],
)
def test_one_cycle_momentum_and_rate_are_read_afresh(make):
    """OneCycleLR changes the rate and the momentum (betas[0] for Adam) every step, and writes
    initial_lr, max_lr, min_lr, base_momentum and max_momentum: all read afresh at replays."""
    torch.manual_seed(0)
    eager = Net()
    lazy = irt.to_lazy(Net())
    lazy.load_state_dict(eager.state_dict())
    opts = [make(m.parameters()) for m in (eager, lazy)]
    scheds = [optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=10) for o in opts]
    ids = torch.tensor([[1, 2, 3], [3, 2, 1]])

    def step(model, opt, sched, x):
        loss = model(x)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        return loss

    compiled = irt.compile_step(step)
    irt.reset_metrics()
    momentum = []
    for _ in range(8):
        step(eager, opts[0], scheds[0], ids)
        compiled(lazy, opts[1], scheds[1], irt.to_lazy(ids))
        group = opts[1].param_groups[0]
        momentum.append(group["betas"][0] if "betas" in group else group["momentum"])
    assert len(set(momentum)) == 8  # (it did change every step)
    assert_eagers(lazy, eager)
    assert irt.metrics()["counters"]["StepReplay"] == 8 - 3, compiled.reason


@pytest.mark.parametrize("path", ["default", "foreach"])
def test_weight_decay_and_rate_set_by_the_user_every_call_are_read_afresh(path):
    """A user's own schedule, set between calls: AdamW's weight decay and rate (both numbers)
    change every call and replay with eager's values; a weight decay of 0 flips the branch
    torch's Python takes on it, which is traced again and named."""
    torch.manual_seed(0)
    eager = Net()
    lazy = irt.to_lazy(Net())
    lazy.load_state_dict(eager.state_dict())
    opts = [
        optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1, foreach=path == "foreach")
        for m in (eager, lazy)
    ]
    ids = torch.tensor([[1, 2, 3], [3, 2, 1]])

    def step(model, opt, x):
        loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    compiled = irt.compile_step(step)
    irt.reset_metrics()
    for k in range(8):
        for o in opts:
            o.param_groups[0]["weight_decay"] = 0.0 if k == 6 else 0.1 + 0.01 * k
            o.param_groups[0]["lr"] = 0.01 / (k + 1)
        step(eager, opts[0], ids)
        compiled(lazy, opts[1], irt.to_lazy(ids))
    assert_eagers(lazy, eager)
    counters = irt.metrics()["counters"]
    assert counters["StepGuardFailed"] == 1  # weight decay 0 (call 6); call 7 traced again
    assert counters["StepReplay"] == 8 - 3 - 2
    why = compiled.last_guard_failure
    assert why.startswith("optimizer AdamW's weight_decay is now 0.0: "), why
    assert why.endswith("took the branch where weight_decay != 0 is True"), why


@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW, optim.SGD, optim.Adagrad])
def test_fused_is_refused_by_torch_naming_the_lazy_device_and_nothing_changes(cls):
    lazy = irt.to_lazy(Net())
    before = {k: irt.to_torch(v) for k, v in lazy.state_dict().items()}
    opt = cls(lazy.parameters(), lr=0.1, fused=True)
    lazy(irt.to_lazy(torch.tensor([[1, 2]]))).backward()
    with pytest.raises(RuntimeError, match=r"fused=True.*supported devices.*lazy"):
        opt.step()
    for k, v in lazy.state_dict().items():
        assert torch.equal(irt.to_torch(v), before[k]), k


def test_sparse_adam_needs_sparse_gradients_which_the_lazy_device_names_as_unsupported():
    emb = irt.to_lazy(torch.nn.Embedding(10, 4, sparse=True))
    optim.SparseAdam(emb.parameters(), lr=0.1)
    with pytest.raises(irt.UnsupportedOpError, match=r"aten::_sparse_coo_tensor"):
        emb(irt.to_lazy(torch.tensor([1, 2]))).sum().backward()


def test_lbfgs_gives_eagers_values_and_a_compiled_step_says_it_reads_the_loss():
    """LBFGS's step runs its closure and reads the loss into Python each iteration: eager's
    values under mark_step; a compiled step is traced every call and says why."""
    torch.manual_seed(0)
    eager = torch.nn.Linear(4, 1)
    lazy = irt.to_lazy(torch.nn.Linear(4, 1))
    lazy.load_state_dict(eager.state_dict())
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    opts = [optim.LBFGS(m.parameters(), lr=0.5, max_iter=4) for m in (eager, lazy)]

    def closure(model, opt, x, y):
        def loss():
            opt.zero_grad()
            out = ((model(x) - y) ** 2).mean()
            out.backward()
            return out

        return loss

    xl, yl = irt.to_lazy(x), irt.to_lazy(y)
    for _ in range(2):
        opts[0].step(closure(eager, opts[0], x, y))
        opts[1].step(closure(lazy, opts[1], xl, yl))
        irt.mark_step()
    # (line searches over float32 dot products: XLA's sums in another order)
    assert_eagers(lazy, eager, tol=2e-4)
    step = irt.compile_step(lambda x, y: opts[1].step(closure(lazy, opts[1], x, y)))
    with pytest.warns(irt.CaptureWarning, match="reads a tensor's value into Python"):
        for _ in range(2):
            step(xl, yl)
    assert not step.replaying


class Scaled(torch.nn.Module):
    """A bf16 Linear and a 0-d float32 parameter (a logit scale)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4).to(torch.bfloat16)
        self.scale = torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return (self.lin(x).float() * self.scale).square().mean()


@pytest.mark.parametrize("name", ["sgd-nesterov", "adamw", "rmsprop-centered", "nadam"])
def test_lent_numbers_leave_eagers_dtypes_on_bf16_and_0_d_parameters(name):
    """A lent number is a float64 0-d tensor: beside a 0-d float32 parameter or a bf16 one,
    what torch computes from it keeps the dtypes eager gives (state included)."""
    torch.manual_seed(0)
    eager = Scaled()
    lazy = irt.to_lazy(Scaled())
    lazy.load_state_dict(eager.state_dict())
    cls, kw = CONFIGS[name]
    opts = [cls(m.parameters(), lr=0.01, foreach=True, **kw) for m in (eager, lazy)]
    x = torch.randn(4, 8).to(torch.bfloat16)

    def step(model, opt, x):
        loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    compiled = irt.compile_step(step)
    for _ in range(5):
        step(eager, opts[0], x)
        compiled(lazy, opts[1], irt.to_lazy(x))
    for (k, pl), pe in zip(lazy.named_parameters(), eager.parameters(), strict=True):
        assert pl.dtype == pe.dtype, k
        # (bf16 ulps apart: the bf16 Linear's, and through its output the scale's gradient)
        tol = 2e-2 if pe.dtype == torch.bfloat16 else 1e-3
        got = irt.to_torch(pl).float().numpy()
        np.testing.assert_allclose(got, pe.detach().float().numpy(), rtol=tol, atol=tol)
    for pl, pe in zip(lazy.parameters(), eager.parameters(), strict=True):
        le, ee = opts[1].state[pl], opts[0].state[pe]
        for key, v in ee.items():
            if isinstance(v, torch.Tensor) and key != "step":
                assert le[key].dtype == v.dtype, (key, le[key].dtype, v.dtype)


def _in_step_changes(change):
    """Eager's parameters, and the compiled step's, when ``change(opt, call)`` runs inside the
    step after the optimizer's step and scheduler (or as the optimizer's own hook)."""
    torch.manual_seed(0)
    eager = Net()
    lazy = irt.to_lazy(Net())
    lazy.load_state_dict(eager.state_dict())
    opts = [optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1) for m in (eager, lazy)]
    scheds = [optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in opts]
    ids = torch.tensor([[1, 2, 3], [3, 2, 1]])
    count = [0]

    def step(model, opt, sched, x):
        loss = model(x)
        loss.backward()
        opt.step()
        sched.step()
        change(opt, count)
        opt.zero_grad()
        return loss

    compiled = irt.compile_step(step)
    for _ in range(6):
        count[0] += 1
        step(eager, opts[0], scheds[0], ids)
        compiled(lazy, opts[1], scheds[1], irt.to_lazy(ids))
    assert_eagers(lazy, eager)
    return compiled


def test_a_hyperparameter_the_step_sets_beside_its_scheduler_is_not_replayed_stale():
    def change(opt, count):
        opt.param_groups[0]["weight_decay"] = 0.1 * count[0]

    compiled = _in_step_changes(change)
    assert not compiled.replaying and "weight_decay" in compiled.reason


def test_an_optimizers_own_hook_that_changes_its_numbers_is_followed():
    def change(opt, count):
        if not opt._optimizer_step_post_hooks:

            def halve(opt, args, kwargs):
                opt.param_groups[0]["weight_decay"] *= 0.5

            opt.register_step_post_hook(halve)

    compiled = _in_step_changes(change)  # (its numbers not lent: its step reads its step count)
    assert not compiled.replaying
