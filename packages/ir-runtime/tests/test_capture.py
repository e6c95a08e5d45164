"""compile_step: traced calls, then replays, against torch eager; guards; refusals."""

import copy
import gc
import re
import warnings

import numpy as np
import pytest
import torch

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def pair(seed=0, dropout=0.0):
    """The same MLP twice: on CPU, and on the lazy device sharded Megatron-style."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)]
    if dropout:
        layers.insert(2, torch.nn.Dropout(dropout))
    eager = torch.nn.Sequential(*layers)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    irt.mark_sharding(lazy[0].weight, MESH, ("model", None))
    irt.mark_sharding(lazy[-1].weight, MESH, (None, "model"))
    return eager, lazy


def batches(n, batch=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g)) for _ in range(n)
    ]


def train_fn(model, opt, zero_first=True):
    def step(x, y):
        if zero_first:
            opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if not zero_first:
            opt.zero_grad()
        return loss

    return step


def counters():
    return irt.metrics()["counters"]


def close(lazy, eager, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(irt.to_torch(lazy).numpy(), eager.detach().numpy(), rtol, atol)


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p, lazy: torch.optim.SGD(p, lr=0.05),
        lambda p, lazy: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
        lambda p, lazy: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=False),
        # Its step counts on the lazy device (CPU torch refuses capturable).
        lambda p, lazy: torch.optim.AdamW(p, lr=0.01, capturable=lazy),
        # foreach: its bias corrections are _foreach_pow(beta, steps), a number to a list
        lambda p, lazy: torch.optim.Adam(p, lr=0.01, capturable=lazy, foreach=True),
    ],
    ids=["sgd", "sgd-nesterov", "sgd-momentum-single", "adamw-capturable", "adam-foreach"],
)
@pytest.mark.parametrize("zero_first", [True, False], ids=["zero-first", "zero-last"])
def test_replays_match_eager(make_opt, zero_first):
    eager, lazy = pair()
    opt_e, opt_l = make_opt(eager.parameters(), False), make_opt(lazy.parameters(), True)
    step_e = train_fn(eager, opt_e, zero_first)
    step = irt.compile_step(train_fn(lazy, opt_l, zero_first))
    irt.reset_metrics()
    for x, y in batches(12):
        loss = step(irt.to_lazy(x), irt.to_lazy(y))
        expected = step_e(x, y)
        close(loss, expected, rtol=2e-5)
        assert not loss.requires_grad
    assert step.replaying and step.reason is None
    c = counters()
    assert c["StepTraced"] <= 3 and c["StepReplay"] == 12 - c["StepTraced"]
    assert c["CompileCount"] <= 2  # the first step makes the optimizer's state
    for (name, p_l), p_e in zip(lazy.named_parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-4, atol=1e-5)
        if zero_first:
            close(p_l.grad, p_e.grad, rtol=1e-4, atol=1e-6)
        else:
            assert p_l.grad is None and p_e.grad is None, name


def test_a_replay_reads_the_state_it_rebinds_as_placed_without_comparing_shardings():
    """Weights and momentum the step rebinds come back from its own results, each array
    carrying its result's sharding object (equal to the parameter's, another object): the
    replay matches them by identity, so no pair of equal shardings is compared
    (``same_sharding``'s memo), and values still match eager."""
    from ir_runtime import _execute

    eager, lazy = pair()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.05, momentum=0.9)
    step_e, step = train_fn(eager, opt_e), irt.compile_step(train_fn(lazy, opt_l))
    data = batches(6)
    for x, y in data[:4]:
        step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y)
    assert step.replaying
    xs = [(irt.to_lazy(x), irt.to_lazy(y)) for x, y in data[4:]]  # (placed before: not read)
    _execute._SAME.clear()
    for (lx, ly), (x, y) in zip(xs, data[4:], strict=True):
        close(step(lx, ly), step_e(x, y), rtol=2e-5)
    compared = [pair for pair in _execute._SAME.values() if pair[2]]  # (x, y: placed anew)
    assert compared == []
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-4, atol=1e-5)


def test_adam_without_capturable_replays_its_step_count_kept_on_the_device():
    eager, lazy = pair()
    opt_e = torch.optim.Adam(eager.parameters(), lr=0.01)
    opt_l = torch.optim.Adam(lazy.parameters(), lr=0.01)  # torch's default: capturable=False
    step, step_e = irt.compile_step(train_fn(lazy, opt_l)), train_fn(eager, opt_e)
    irt.reset_metrics()
    for x, y in batches(6):
        close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y))
    assert step.replaying and step.reason is None
    # the first call makes the optimizer's state; the next two agree; the rest replay
    assert counters()["StepTraced"] == 3 and counters()["StepReplay"] == 3
    assert opt_l.param_groups[0]["capturable"] is False  # as the user made it
    assert all(isinstance(s["step"], irt.LazyTensor) for s in opt_l.state.values())
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("own", [True, False], ids=["torch-sgd", "subclass"])
def test_learning_rate_set_outside_the_step_is_read_afresh_by_torchs_optimizers(own):
    eager, lazy = pair()
    cls = torch.optim.SGD if own else type("MySGD", (torch.optim.SGD,), {})
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.5)
    opt_l = cls(lazy.parameters(), lr=0.1, momentum=0.5)
    sched_e = torch.optim.lr_scheduler.StepLR(opt_e, step_size=4, gamma=0.3)
    sched_l = torch.optim.lr_scheduler.StepLR(opt_l, step_size=4, gamma=0.3)
    step, step_e = irt.compile_step(train_fn(lazy, opt_l)), train_fn(eager, opt_e)
    irt.reset_metrics()
    for x, y in batches(16):
        close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y), rtol=1e-4)
        sched_e.step()
        sched_l.step()
    c = counters()
    if own:  # the rate is an input of the program: no guard on it
        assert c.get("StepGuardFailed", 0) == 0 and c["StepReplay"] == 16 - 3
    else:  # an optimizer not torch's own: its numbers are constants, guarded
        assert c["StepGuardFailed"] == 3  # lr changed after steps 4, 8 and 12
        assert c["StepReplay"] >= 16 - 3 - 3 * 2
        assert "MySGD's lr changed from 0.009 to 0.00269" in step.last_guard_failure
        assert "not one of torch's optimizers" in step.last_guard_failure
    close(lazy[0].weight, eager[0].weight, rtol=1e-4, atol=1e-6)


def test_train_eval_flag_is_guarded_and_dropout_draws_fresh_masks():
    eager, lazy = pair(dropout=0.5)

    @irt.compile_step
    def predict(x):
        return lazy(x)

    x = torch.randn(64, 16)
    lx = irt.to_lazy(x)
    with torch.no_grad():
        outs = [irt.to_torch(predict(lx)) for _ in range(8)]
        # Training mode: every call draws a new mask, replayed or not.
        assert predict.replaying
        for a in range(8):
            for b in range(a):
                assert not torch.equal(outs[a], outs[b])
        lazy.eval()
        eager.eval()
        for _ in range(4):
            close(predict(lx), eager(x))


def test_dropout_stream_is_reproducible_across_trace_and_replay():
    _, lazy = pair(dropout=0.3)

    @irt.compile_step
    def forward(x):
        return lazy(x)

    x = irt.to_lazy(torch.randn(32, 16))
    runs = []
    with torch.no_grad():
        for _ in range(2):
            torch.manual_seed(123)
            runs.append([irt.to_torch(forward(x)) for _ in range(6)])
    # The first run's first calls were traced, the second run's all replayed: the same numbers.
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_shapes_and_python_arguments_are_the_key():
    @irt.compile_step
    def scaled(x, scale, *, shift=0):
        return {"out": x * scale + shift, "tag": ("const", scale)}

    irt.reset_metrics()
    for batch in (4, 8, 4, 8, 4, 8, 4, 8):
        for scale in (2.0, 3.0):
            x = torch.randn(batch, 3)
            r = scaled(irt.to_lazy(x), scale, shift=1)
            assert r["tag"] == ("const", scale)
            close(r["out"], x * scale + 1)
    c = counters()
    assert c["StepReplay"] == 16 - c["StepTraced"] and c["StepTraced"] <= 8


def test_host_tensor_arguments_are_read_every_call():
    @irt.compile_step
    def f(a, b):
        return (a @ b).relu(), a.sum()

    for _ in range(6):
        a, b = torch.randn(5, 4), torch.randn(4, 3)
        out, s = f(a, b)
        close(out, (a @ b).relu())
        close(s, a.sum())
    assert f.replaying


def test_a_lazy_argument_written_in_place_is_rebound_in_replays():
    acc = irt.to_lazy(torch.zeros(3))

    @irt.compile_step
    def accumulate(total, x):
        total.add_(x)

    expected = torch.zeros(3)
    for _ in range(6):
        x = torch.randn(3)
        expected += x
        assert accumulate(acc, irt.to_lazy(x)) is None
    assert accumulate.replaying
    close(acc, expected)


def test_a_change_made_between_calls_is_seen():
    eager, lazy = pair()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    step = irt.compile_step(train_fn(lazy, torch.optim.SGD(lazy.parameters(), lr=0.05)))
    step_e = train_fn(eager, opt_e)
    for k, (x, y) in enumerate(batches(10)):
        if k in (5, 7):  # pending work on a parameter, outside the step
            with torch.no_grad():
                lazy[2].bias.mul_(0.5).add_(1.0)
                eager[2].bias.mul_(0.5).add_(1.0)
        close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y), rtol=1e-4)
    assert step.replaying
    close(lazy[2].bias, eager[2].bias, rtol=1e-4)


def test_reading_a_value_inside_is_refused_and_still_right():
    eager, lazy = pair()
    seen = []

    @irt.compile_step
    def step(x):
        out = lazy(x).sum()
        seen.append(out.item())  # data reaches Python
        return out

    x = torch.randn(4, 16)
    with pytest.warns(irt.CaptureWarning, match=r"\.item\(\)"):
        for _ in range(4):
            close(step(irt.to_lazy(x)), eager(x).sum(), rtol=1e-5)
    assert not step.replaying and len(seen) == 4


def test_a_tensor_kept_by_the_step_is_refused():
    kept = []

    @irt.compile_step
    def step(x):
        y = x * 2
        kept.append(y)
        return y + 1

    with pytest.warns(irt.CaptureWarning, match="outlives the call"):
        for _ in range(4):
            x = torch.randn(3)
            close(step(irt.to_lazy(x)), x * 2 + 1)
    assert not step.replaying
    close(kept[-1], x * 2)


def test_mark_step_inside_is_refused():
    @irt.compile_step
    def step(x):
        y = x + 1
        irt.mark_step()
        return y * 2

    with pytest.warns(irt.CaptureWarning, match="mark_step"):
        for _ in range(3):
            close(step(irt.to_lazy(torch.ones(2))), torch.full((2,), 4.0))


def test_errors_leave_nothing_behind():
    calls = []

    @irt.compile_step
    def step(x, fail):
        calls.append(fail)
        if fail:
            raise ValueError("boom")
        return x.exp()

    with pytest.raises(ValueError, match="boom"):
        step(irt.to_lazy(torch.zeros(2)), True)
    for _ in range(4):
        close(step(irt.to_lazy(torch.zeros(2)), False), torch.ones(2))
    assert step.replaying
    # The hooks a traced call installs are gone: modules run without them afterwards.
    assert not torch.nn.modules.module._global_forward_pre_hooks
    with pytest.raises(TypeError, match=r"bytearray.*neither a tensor nor hashable"):
        step(irt.to_lazy(torch.zeros(2)), bytearray(b"x"))
    with pytest.raises(TypeError, match="takes a function"):
        irt.compile_step(3)


def test_a_tensor_learning_rate_filled_in_place_is_guarded():
    eager, lazy = pair()
    opt_e = torch.optim.SGD(eager.parameters(), lr=torch.tensor(0.05))
    opt_l = torch.optim.SGD(lazy.parameters(), lr=torch.tensor(0.05))
    step, step_e = irt.compile_step(train_fn(lazy, opt_l)), train_fn(eager, opt_e)
    for k, (x, y) in enumerate(batches(10)):
        if k == 6:
            for opt in (opt_e, opt_l):
                opt.param_groups[0]["lr"].fill_(0.2)
        close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y), rtol=1e-4)
    assert step.replaying
    close(lazy[0].weight, eager[0].weight, rtol=1e-4, atol=1e-6)


def embedding_pair(seed=0):
    """An embedding (rows 6-9 never looked up: their gradients and second moments stay 0) and
    a sharded head, on CPU and on the lazy device."""
    torch.manual_seed(seed)
    eager = torch.nn.Sequential(torch.nn.Embedding(10, 16), torch.nn.Linear(16, 4))
    lazy = irt.to_lazy(copy.deepcopy(eager))
    irt.mark_sharding(lazy[1].weight, MESH, (None, "model"))
    return eager, lazy


SCHEDULES = {
    # warms up from 0, as transformers' schedules do: the first step's rate is 0
    "lambda-warmup": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda i: min(i / 3, 0.9**i)),
    "one-cycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(
        o, 0.05, total_steps=20, cycle_momentum=False
    ),
    "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 4),
}


@pytest.mark.parametrize("inside", [True, False], ids=["stepped-inside", "stepped-outside"])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=list(SCHEDULES))
@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p, lr, **kw: torch.optim.AdamW(p, lr=lr, **kw),
        lambda p, lr, **kw: torch.optim.Adam(p, lr=lr, weight_decay=0.1, amsgrad=True, **kw),
        lambda p, lr, **kw: torch.optim.NAdam(p, lr=lr, **kw),
    ],
    ids=["adamw", "adam-amsgrad-decay", "nadam"],
)
def test_a_scheduled_learning_rate_is_a_program_input(make_opt, schedule, inside):
    """The documented recipe: the rate in a tensor (the scheduler fills it in place) and
    capturable=True. Every call after the first few replays with eager's values, whether the
    scheduler steps inside the compiled step (a replay steps it again) or after it; no NaN
    where the rate is 0 and a parameter's second moment is 0 (embedding rows never used)."""
    eager, lazy = embedding_pair()
    opt_e = make_opt(eager.parameters(), 0.01)
    opt_l = make_opt(lazy.parameters(), torch.tensor(0.01), capturable=True)
    sched_e, sched_l = SCHEDULES[schedule](opt_e), SCHEDULES[schedule](opt_l)

    def train(model, opt, sched, stepped_inside):
        def step(ids, y):
            loss = torch.nn.functional.mse_loss(model(ids).sum(1), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if stepped_inside:
                sched.step()
            return loss

        return step

    step = irt.compile_step(train(lazy, opt_l, sched_l, inside))
    step_e = train(eager, opt_e, sched_e, True)
    irt.reset_metrics()
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        ids, y = torch.randint(0, 6, (8, 3), generator=g), torch.randn(8, 4, generator=g)
        close(step(ids, y), step_e(ids, y), rtol=1e-5)
        if not inside:
            sched_l.step()
        assert float(opt_l.param_groups[0]["lr"]) == pytest.approx(sched_e.get_last_lr()[0])
    assert step.replaying and step.reason is None
    c = counters()
    assert c["StepTraced"] <= 3 and c["StepReplay"] == 10 - c["StepTraced"]
    assert c["CompileCount"] <= 2  # the first step makes the optimizer's state
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        assert not irt.to_torch(p_l).isnan().any()
        close(p_l, p_e, rtol=1e-5, atol=1e-5)


def test_a_tensor_rate_passed_as_a_number_is_read_afresh():
    """RMSprop passes its rate to torch as a number (value=-lr): on the lazy device that call
    is the same arithmetic on the tensor, so a changed rate replays, with eager's values."""
    eager, lazy = embedding_pair()
    opt_e = torch.optim.RMSprop(eager.parameters(), lr=0.01, momentum=0.5)
    opt_l = torch.optim.RMSprop(
        lazy.parameters(), lr=torch.tensor(0.01), momentum=0.5, capturable=True
    )
    step, step_e = irt.compile_step(train_fn(lazy, opt_l)), train_fn(eager, opt_e)
    irt.reset_metrics()
    g = torch.Generator().manual_seed(1)
    for k in range(10):
        if k == 6:
            opt_e.param_groups[0]["lr"] = 0.02
            opt_l.param_groups[0]["lr"].fill_(0.02)
        ids, y = torch.randint(0, 6, (8, 3), generator=g), torch.randn(8, 3, 4, generator=g)
        close(step(ids, y), step_e(ids, y), rtol=1e-5)
    assert step.replaying and counters()["StepReplay"] == 10 - 3
    assert step.last_guard_failure is None
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-5, atol=1e-5)


class _PythonRateSGD(torch.optim.Optimizer):
    """Not torch's own: a capturable group whose step reads its rate into Python."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr, "capturable": True})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            rate = float(group["lr"])
            for p in group["params"]:
                p.add_(p.grad, alpha=-rate)


def test_an_optimizer_reading_its_tensor_rate_into_python_keeps_it_on_the_host():
    """Its rate stays a host tensor, compared by value: a constant rate replays and a changed
    one is traced again, with eager's values throughout."""
    eager, lazy = embedding_pair()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.01)
    opt_l = _PythonRateSGD(lazy.parameters(), lr=torch.tensor(0.01))
    step, step_e = irt.compile_step(train_fn(lazy, opt_l)), train_fn(eager, opt_e)
    irt.reset_metrics()
    g = torch.Generator().manual_seed(1)
    for k in range(10):
        if k == 6:
            opt_e.param_groups[0]["lr"] = 0.02
            opt_l.param_groups[0]["lr"].fill_(0.02)
        ids, y = torch.randint(0, 6, (8, 3), generator=g), torch.randn(8, 3, 4, generator=g)
        close(step(ids, y), step_e(ids, y), rtol=1e-5)
    assert step.replaying and counters()["StepReplay"] >= 4
    assert "changed from 0.01 to 0.02" in step.last_guard_failure
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-5, atol=1e-5)


def test_adam_with_a_learning_rate_of_0_gives_no_nan():
    """torch's single-tensor capturable Adam divides by the step size: a rate of 0 made every
    parameter whose second moment is 0 NaN. The lazy device takes the form CUDA takes."""
    for make in (torch.optim.Adam, torch.optim.AdamW):
        eager, lazy = embedding_pair()
        opt_e = make(eager.parameters(), lr=0.0, foreach=False)
        opt_l = make(lazy.parameters(), lr=0.0, foreach=False, capturable=True)
        for k in range(3):
            ids = torch.tensor([[1, 2]])
            for model, opt, x in ((eager, opt_e, ids), (lazy, opt_l, irt.to_lazy(ids))):
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                opt.param_groups[0]["lr"] = 0.01 * k
            irt.mark_step()
        close(lazy[0].weight, eager[0].weight, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("own", [True, False], ids=["torch-adamw", "subclass"])
def test_a_scheduled_rate_in_a_python_number(own):
    """torch's own AdamW replays a LambdaLR schedule held in a Python number, with eager's
    values; an optimizer that is not torch's is traced every call, and the warning says how to
    hold its rate instead."""
    eager, lazy = embedding_pair()
    cls = torch.optim.AdamW if own else type("MyAdamW", (torch.optim.AdamW,), {})
    opt_e = torch.optim.AdamW(eager.parameters(), lr=0.01)
    opt_l = cls(lazy.parameters(), lr=0.01, capturable=True)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda i: 1 / (i + 1)) for o in (opt_e, opt_l)]
    step, step_e = irt.compile_step(train_fn(lazy, opt_l)), train_fn(eager, opt_e)
    irt.reset_metrics()
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(6):
            ids, y = torch.randint(0, 6, (8, 3), generator=g), torch.randn(8, 3, 4, generator=g)
            close(step(ids, y), step_e(ids, y), rtol=1e-5)
            for s in scheds:
                s.step()
    captured = [str(w.message) for w in seen if w.category is irt.CaptureWarning]
    if own:
        assert step.replaying and counters()["StepReplay"] == 6 - 3 and not captured
    else:
        assert not step.replaying and "lr=torch.tensor(" in step.reason
        assert any("lr=torch.tensor(" in m and "capturable=True" in m for m in captured)
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-5, atol=1e-5)


def test_a_scheduler_stepped_before_its_optimizer_is_traced_and_says_why():
    _, lazy = embedding_pair()
    opt = torch.optim.AdamW(lazy.parameters(), lr=torch.tensor(0.01), capturable=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 4)

    @irt.compile_step
    def step(ids, y):
        sched.step()  # before the optimizer reads the rate: its replay could not be the call
        loss = torch.nn.functional.mse_loss(lazy(ids), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    irt.reset_metrics()
    with pytest.warns(irt.CaptureWarning, match="before its optimizer reads"):
        for _ in range(4):
            step(torch.randint(0, 6, (8, 3)), torch.randn(8, 3, 4))
    assert not step.replaying and "StepReplay" not in counters()


def test_freezing_or_replacing_a_layer_is_guarded():
    eager, lazy = pair()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.05)
    step, step_e = irt.compile_step(train_fn(lazy, opt_l)), train_fn(eager, opt_e)
    irt.reset_metrics()
    for k, (x, y) in enumerate(batches(14)):
        if k == 5:  # freeze the first layer
            for m in (eager, lazy):
                m[0].weight.requires_grad_(False)
        if k == 9:  # a new last layer, in the optimizer too
            torch.manual_seed(k)
            eager[2] = torch.nn.Linear(32, 4)
            lazy[2] = irt.to_lazy(copy.deepcopy(eager[2]))
            opt_e.add_param_group({"params": eager[2].parameters()})
            opt_l.add_param_group({"params": lazy[2].parameters()})
        close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y), rtol=1e-4)
    assert counters()["StepGuardFailed"] == 2 and step.replaying
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-4, atol=1e-6)


def test_a_python_number_that_changes_every_call_is_named():
    @irt.compile_step
    def scale(x, factor):
        return x * factor

    x = torch.randn(3)
    with pytest.warns(irt.CaptureWarning, match="pass numbers that change as tensors"):
        for k in range(40):
            close(scale(irt.to_lazy(x), 1.5 + k), x * (1.5 + k))
    assert len(scale._last) == 32  # bounded


def test_arguments_that_share_data_are_never_merged():
    @irt.compile_step
    def f(a, b):
        return a * 2 + b

    x = irt.to_lazy(torch.ones(4))
    for _ in range(3):
        close(f(x, x), torch.full((4,), 3.0))
    close(f(x, irt.to_lazy(torch.full((4,), 10.0))), torch.full((4,), 12.0))
    bias = irt.to_lazy(torch.full((4,), 2.0))

    @irt.compile_step
    def g(a):
        return (3 * a - bias).sum()

    for _ in range(3):
        close(g(bias.clone()), torch.tensor(16.0))  # a clone shares the bias's data
    close(g(irt.to_lazy(torch.ones(4))), torch.tensor(4.0))


def test_gradients_of_lazy_arguments_reach_the_callers_tensors():
    w = irt.to_lazy(torch.ones(4))

    @irt.compile_step
    def g(x):
        (x * w).sum().backward()

    xs = [irt.to_lazy(torch.randn(4)).requires_grad_() for _ in range(2)]
    for _ in range(4):
        g(xs[0])
    g(xs[1])
    close(xs[0].grad, torch.full((4,), 4.0))
    close(xs[1].grad, torch.ones(4))


def test_loading_optimizer_state_is_guarded_even_with_the_old_state_kept():
    eager, lazy = pair()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)
    step, step_e = irt.compile_step(train_fn(lazy, opt_l)), train_fn(eager, opt_e)
    kept = {}
    for k, (x, y) in enumerate(batches(11)):
        if k == 3:  # a checkpoint
            kept["e"], kept["l"] = copy.deepcopy(opt_e.state_dict()), opt_l.state_dict()
            kept["l"] = {"state": {}, "param_groups": kept["l"]["param_groups"]} | {
                "state": {
                    i: {"momentum_buffer": irt.to_lazy(irt.to_torch(s["momentum_buffer"]))}
                    for i, s in kept["l"]["state"].items()
                }
            }
        if k == 7:
            live_state = opt_l.state_dict()  # noqa: F841  (the old buffers stay alive)
            opt_e.load_state_dict(kept["e"])
            opt_l.load_state_dict(kept["l"])
        close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y), rtol=1e-4)
    assert step.replaying
    close(lazy[0].weight, eager[0].weight, rtol=1e-4, atol=1e-6)


def test_freezing_a_parameter_of_a_module_it_does_not_call_is_guarded():
    torch.manual_seed(0)
    eager = torch.nn.Module()
    eager.body, eager.head = torch.nn.Linear(16, 8), torch.nn.Parameter(torch.randn(8, 4))
    lazy = irt.to_lazy(copy.deepcopy(eager))

    def train(m, opt):
        def step(x, y):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m.body(x) @ m.head, y).backward()
            opt.step()

        return step

    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    step = irt.compile_step(train(lazy, torch.optim.SGD(lazy.parameters(), lr=0.1)))
    step_e = train(eager, opt_e)
    for k, (x, y) in enumerate(batches(9)):
        if k == 5:
            eager.head.requires_grad_(False)
            lazy.head.requires_grad_(False)
        step(irt.to_lazy(x), irt.to_lazy(y))
        step_e(x, y)
    close(lazy.head, eager.head)
    close(lazy.body.weight, eager.body.weight, rtol=1e-4, atol=1e-6)
    assert step.replaying


@pytest.mark.parametrize("read", [lambda cw: cw[:2], lambda cw: cw[0]], ids=["slice", "0-d"])
def test_host_tensors_read_through_a_view_are_guarded(read):
    cw = torch.tensor([2.0, 3.0, 4.0])

    @irt.compile_step
    def f(x):
        return x * read(cw)

    x = torch.randn(2)
    for k in range(8):
        if k == 5:
            cw.mul_(-2.0)
        close(f(irt.to_lazy(x)), x * read(cw))
    assert f.replaying


def test_a_forward_returning_its_autograd_graph_is_replayed():
    eager, lazy = pair()

    @irt.compile_step
    def forward(x):
        return lazy(x)  # grad enabled: the result comes back detached

    for x, _ in batches(5):
        close(forward(irt.to_lazy(x)), eager(x))
    assert forward.replaying


# ---------------------------------------------------------------------------------------------
# Each guard kind, failing: the call is traced again, and last_guard_failure names the guard.


def fail_guard(step, call, change):
    """Replay ``step``, make ``change``, call it once more: that call's (StepGuardFailed,
    StepTraced) counts and the step's ``last_guard_failure``; then it replays again."""
    for _ in range(3):
        call()
    assert step.replaying and step.last_guard_failure is None
    before = dict(counters())
    change()
    call()
    after = counters()
    counts = tuple(after.get(k, 0) - before.get(k, 0) for k in ("StepGuardFailed", "StepTraced"))
    why = step.last_guard_failure
    for _ in range(2):
        call()
    assert step.replaying and step.last_guard_failure == why  # the last failure, kept
    return counts, why


def set_nesterov(lazy, opt):
    opt.param_groups[0]["nesterov"] = True


def set_momentum(lazy, opt):  # (a rate or a momentum that changes is read afresh: no guard)
    opt.param_groups[0]["momentum"] = 0.0  # but SGD's Python branches on momentum != 0


def load_state(lazy, opt):
    opt.load_state_dict(opt.state_dict())


def add_group(lazy, opt):
    opt.add_param_group({"params": [irt.to_lazy(torch.zeros(3)).requires_grad_()]})


def to_eval(lazy, opt):
    lazy[0].eval()


def freeze(lazy, opt):
    lazy[0].weight.requires_grad_(False)


def add_key(lazy, opt):
    opt.param_groups[0]["warmup"] = 10


def replace_layer(lazy, opt):
    lazy[2] = irt.to_lazy(torch.nn.Linear(32, 4))  # (not optimized: the module guard names it)


def drop_grad(lazy, opt):
    lazy[0].weight.grad = None


LINEAR = r"module Linear\(in_features=16, out_features=32, bias=True\)"
GUARD_FAILURES = [  # (a change between calls, the failure it names)
    (set_nesterov, r"^optimizer SGD's nesterov changed from False to True$"),
    (
        set_momentum,
        r"^optimizer SGD's momentum is now 0\.0: its step's Python took the branch where "
        r"momentum != 0 is True$",
    ),
    (load_state, r"^optimizer SGD's state table was replaced \(load_state_dict\)$"),
    (add_group, r"^optimizer SGD has 2 parameter groups, not 1$"),
    (add_key, r"^optimizer SGD's parameter group 0 gained warmup$"),
    (to_eval, rf"^{LINEAR} switched to eval\(\)$"),
    (freeze, rf"^{LINEAR}'s parameter 'weight' no longer requires grad$"),
    (replace_layer, r"^module Sequential's submodule '2' was replaced$"),
    (drop_grad, r"^p\.grad of tensor \[32, 16\] float32 was set when traced and is None now$"),
]


@pytest.mark.parametrize(
    ("change", "why"), GUARD_FAILURES, ids=[c.__name__ for c, _ in GUARD_FAILURES]
)
def test_a_failing_guard_traces_again_and_is_named(change, why):
    _, lazy = pair()
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)
    step = irt.compile_step(train_fn(lazy, opt))
    x, y = batches(1)[0]
    x, y = irt.to_lazy(x), irt.to_lazy(y)
    counts, failure = fail_guard(step, lambda: step(x, y), lambda: change(lazy, opt))
    assert counts == (1, 1)
    assert re.search(why, failure), failure


def test_a_host_tensor_changed_in_place_is_read_again_and_named():
    """Changed in place between replays, a host tensor the step reads is read again (every call
    below checks the values), by one new trace that names the change."""
    scale = torch.tensor([2.0, 3.0])

    @irt.compile_step
    def f(x):
        return x * scale

    x = torch.randn(4, 2)
    call = lambda: close(f(irt.to_lazy(x)), x * scale)  # noqa: E731
    counts, why = fail_guard(f, call, lambda: scale.fill_(-1))
    assert counts == (1, 1)
    assert why == "host tensor [2] float32 that the step reads changed from [2., 3.] to [-1., -1.]"


def test_a_placement_changed_between_replays_is_traced_again_not_undone():
    """mark_sharding between replays, of a parameter or of the argument as passed: a program's
    input placements are part of it, and placing the data back would silently undo the new
    placement. The call is traced again at the new placement, which the tensor keeps, the
    guard is named, and the values stay eager's."""
    eager, lazy = pair()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, lazy)]
    step = irt.compile_step(train_fn(lazy, opts[1]))
    x, y = batches(1)[0]
    lx, ly = irt.to_lazy(x), irt.to_lazy(y)
    irt.mark_sharding(lx, MESH, ("data", None))
    counts, why = fail_guard(
        step,
        lambda: step(lx, ly),
        lambda: irt.mark_sharding(lazy[0].weight, MESH, (None, "model")),
    )
    assert counts == (1, 1)
    assert why.startswith("tensor [32, 16] float32 is placed (None, 'model') {"), why
    assert "traced as ('model', None) {" in why, why
    assert why.endswith("traced again for its new placement"), why
    spec = lazy[0].weight._ir.node.sharding
    assert spec is not None and spec.partition_spec == (None, "model"), spec
    step = irt.compile_step(train_fn(lazy, opts[1]))  # (a fresh one: no failure yet)
    counts, why = fail_guard(
        step, lambda: step(lx, ly), lambda: irt.mark_sharding(lx, MESH, (("data", "model"), None))
    )
    assert counts == (1, 1)
    assert why.startswith("argument 0 is placed (('data', 'model'), None) {"), why
    step_e = train_fn(eager, opts[0])
    for _ in range(12):  # the calls fail_guard made
        step_e(x, y)
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-4, atol=1e-5)


def test_requires_grad_of_a_tensor_read_changing_is_named():
    w = irt.to_lazy(torch.full((4,), 2.0)).requires_grad_()

    @irt.compile_step
    def f(x):
        return x * w  # w belongs to no module: its own guard sees it frozen

    x = torch.randn(4)
    counts, why = fail_guard(
        f, lambda: close(f(irt.to_lazy(x)), x * 2), lambda: w.requires_grad_(False)
    )
    assert counts == (1, 1)
    assert why == "tensor [4] float32 that the step reads no longer requires grad"


def test_a_gradient_read_is_whichever_tensor_p_grad_is():
    """A program that reads and accumulates into ``w.grad`` reads ``w.grad`` as it is at each
    call: replaced between calls (by the user, or by a backward after ``zero_grad()``), the
    replay reads and writes the new one, as eager does; set to None, the call is traced."""
    w = irt.to_lazy(torch.ones(4)).requires_grad_()
    x = torch.randn(4)

    @irt.compile_step
    def accumulate(x):
        (x * w).sum().backward()  # no zero_grad: the program reads w.grad and adds to it

    for _ in range(3):
        accumulate(irt.to_lazy(x))
    assert accumulate.replaying
    before = dict(counters())
    w.grad = mine = irt.to_lazy(torch.full((4,), 5.0))
    for _ in range(2):
        accumulate(irt.to_lazy(x))
    after = counters()
    assert after["StepTraced"] == before["StepTraced"]  # replayed, into the new tensor
    assert after["StepReplay"] - before.get("StepReplay", 0) == 2
    assert w.grad is mine  # written in place, as eager's accumulation
    close(w.grad, 5 + 2 * x)
    w.grad = None
    accumulate(irt.to_lazy(x))  # makes w.grad: another plan, traced
    assert accumulate.last_guard_failure == "p.grad of tensor [4] float32 was set to None"
    close(w.grad, x)


def test_a_gradient_set_between_calls_of_a_step_ending_in_zero_grad_is_used():
    """A step that ends in ``zero_grad()`` starts and ends with every ``.grad`` None; a
    ``.grad`` the user sets between two calls is accumulated into by eager, so a replay (whose
    program reads no gradient) must give way to a trace."""
    torch.manual_seed(0)
    eager = torch.nn.Linear(3, 2)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    xs = [torch.randn(5, 3) for _ in range(6)]
    opts = {m: torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, lazy)}

    def train(model, x):
        model(x).square().sum().backward()
        opts[model].step()
        opts[model].zero_grad()

    step = irt.compile_step(train)
    calls = iter(xs)

    def call():
        x = next(calls)
        train(eager, x)
        step(lazy, irt.to_lazy(x))

    def set_grad():
        eager.weight.grad = torch.ones(2, 3)
        lazy.weight.grad = irt.to_lazy(torch.ones(2, 3))

    counts, why = fail_guard(step, call, set_grad)
    assert counts == (1, 1)
    assert why == "p.grad of tensor [2, 3] float32 was None when traced and is set now"
    close(lazy.weight, eager.weight.detach())
    close(lazy.bias, eager.bias.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_replay_reads_a_host_argument_as_it_was_at_the_call(dtype):
    """A replay places a host argument from a copy of its memory: writing the buffer right
    after the call (while the program may still run) changes nothing it computes."""
    w = irt.to_lazy(torch.ones(4, dtype=dtype))

    @irt.compile_step
    def scale(x):
        return x * w * 2

    buf = torch.zeros(4, dtype=dtype)
    outs = []
    for i in range(5):
        buf.fill_(i)
        outs.append(scale(buf))
        buf.fill_(100)  # reused at once, as a data loader's pinned buffer would be
    assert scale.replaying
    for i, out in enumerate(outs):
        assert torch.equal(irt.to_torch(out), torch.full((4,), 2.0 * i, dtype=dtype))


def test_a_step_that_builds_a_loss_module_per_call_replays():
    """Hugging Face's BERT and T5 build ``CrossEntropyLoss()`` inside ``forward``: a module the
    call creates and drops, owning nothing, is not a guard, so the step replays."""
    torch.manual_seed(0)
    eager = torch.nn.Linear(4, 3)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    opts = {m: torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, lazy)}

    def train(model, x, y):
        loss = torch.nn.CrossEntropyLoss()(model(x), y)  # a new module every call
        loss.backward()
        opts[model].step()
        opts[model].zero_grad()
        return loss.detach()

    step = irt.compile_step(train)
    before = dict(counters())
    with warnings.catch_warnings():
        warnings.simplefilter("error", irt.CaptureWarning)
        for k in range(6):
            x, y = torch.randn(5, 4), torch.tensor([0, 2, 1, 1, k % 3])
            want = train(eager, x, y)
            got = step(lazy, irt.to_lazy(x), irt.to_lazy(y))
            close(got, want)
    after = counters()
    assert step.replaying and step.last_guard_failure is None
    assert after.get("StepReplay", 0) - before.get("StepReplay", 0) == 4
    assert after.get("StepGuardFailed", 0) == before.get("StepGuardFailed", 0)
    close(lazy.weight, eager.weight.detach())


def test_a_keyword_argument_named_step_or_self_is_the_step_functions():
    lin = irt.to_lazy(torch.nn.Linear(4, 2))

    @irt.compile_step
    def scaled(x, step=0, self=1.0):
        return lin(x).sum() * (step + self)

    x = irt.to_lazy(torch.ones(3, 4))
    expected = float(irt.to_torch(lin(x).sum()))
    for k in range(4):
        assert float(scaled(x, step=k, self=2.0)) == pytest.approx(expected * (k + 2))
        assert float(scaled(x, k)) == pytest.approx(expected * (k + 1))


def test_a_guard_failing_call_after_call_is_named_and_replaying_says_so():
    """A value the guards compare that changes on every call (here a counter kept in the
    optimizer's param group, which the program never reads) fails a guard on every replay: the
    step says so once, in a CaptureWarning naming the guard, and ``replaying`` reads False."""
    w = irt.to_lazy(torch.ones(3)).requires_grad_()
    opt = torch.optim.SGD([w], lr=0.5)

    @irt.compile_step
    def train(x):
        (w * x).sum().backward()
        opt.step()
        opt.zero_grad()

    with pytest.warns(
        irt.CaptureWarning, match=r"a guard fails call after call .*calls changed"
    ) as caught:
        for k in range(8):
            opt.param_groups[0]["calls"] = k
            train(irt.to_lazy(torch.ones(3)))
    # it names the caller's line (the replay, and its miss, were taken in C)
    assert [w.filename for w in caught.list] == [__file__], [str(w) for w in caught.list]
    assert not train.replaying
    assert train.last_guard_failure.startswith("optimizer SGD's calls changed")
    close(w, torch.full((3,), 1.0 - 8 * 0.5))
    opt.param_groups[0]["calls"] = "done"  # steady again: replays again
    for _ in range(3):
        train(irt.to_lazy(torch.ones(3)))
    assert train.replaying


def test_an_equal_hyperparameter_set_again_still_replays():
    """A scheduler that writes the same learning rate back (a new float object, equal) changes
    nothing the program reads: the guard compares values, not identities."""
    _, lazy = pair()
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)
    step = irt.compile_step(train_fn(lazy, opt))
    x, y = batches(1)[0]
    x, y = irt.to_lazy(x), irt.to_lazy(y)
    counts, failure = fail_guard(
        step, lambda: step(x, y), lambda: opt.param_groups[0].update(lr=float("0.1"), nesterov=0)
    )
    assert counts == (0, 0) and failure is None


def test_a_new_argument_signature_is_named_in_last_guard_failure():
    lin = irt.to_lazy(torch.nn.Linear(4, 2))

    @irt.compile_step
    def step(x, scale):
        return lin(x).sum() * scale

    for _ in range(3):
        step(irt.to_lazy(torch.ones(8, 4)), 2)
    assert step.replaying and step.last_guard_failure is None
    step(irt.to_lazy(torch.ones(16, 4)), 2)
    assert step.last_guard_failure == (
        "argument 0 was a lazy float32[8,4], now a lazy float32[16,4]: a new argument "
        "signature, traced (and replayed once two of its calls agree)"
    )
    step(irt.to_lazy(torch.ones(16, 4)), 3)
    assert step.last_guard_failure.startswith("argument 1 was 2, now 3: ")
    step(torch.ones(16, 4), 3)
    assert step.last_guard_failure.startswith(
        "argument 0 was a lazy float32[16,4], now a host float32[16, 4]: "
    )


def test_every_read_of_the_metrics_counts_each_replay_and_reset_clears_them():
    """A replay's counts (executions, their time, donated buffers, replays) are kept in C and
    folded in when the metrics are read: each read sees every replay before it, and
    ``reset_metrics`` clears them with the rest."""
    from ir_runtime._frontend.inspect import last_executable

    _, lazy = pair()
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)
    step = irt.compile_step(train_fn(lazy, opt))
    data = [(irt.to_lazy(x), irt.to_lazy(y)) for x, y in batches(9)]
    for x, y in data[:3]:
        step(x, y)
    assert step.replaying
    donated = len(last_executable().donate)
    assert donated > 0  # (weights, momenta: their buffers are the results')
    irt.reset_metrics()
    for n, (x, y) in enumerate(data[3:7], start=1):
        step(x, y)
        m = irt.metrics()
        c, t = m["counters"], m["timers"]
        assert c["StepReplay"] == c["ExecuteCount"] == t["ExecuteTime"]["count"] == n
        assert c["DonatedBuffers"] == n * donated
        assert t["InputOutputAliasCount"]["count"] == n
        assert t["InputOutputAliasCount"]["total"] == n * donated
        assert t["InputOutputAliasCount"]["max"] == t["InputOutputAliasCount"]["last"] == donated
        assert type(t["InputOutputAliasCount"]["last"]) is int  # (buffers, as recorded before)
        assert 0 < t["ExecuteTime"]["last"] <= t["ExecuteTime"]["max"] <= t["ExecuteTime"]["total"]
    step(*data[7])  # counted, then cleared unread
    irt.reset_metrics()
    assert "StepReplay" not in counters() and counters()["ExecuteCount"] == 0
    assert "ExecuteTime" not in irt.metrics()["timers"]
    step(*data[8])
    assert counters()["StepReplay"] == counters()["ExecuteCount"] == 1
    irt.reset_metrics(counters=False)  # timers alone: the counts stay
    assert counters()["StepReplay"] == 1 and "ExecuteTime" not in irt.metrics()["timers"]


def test_calls_the_c_path_leaves_to_python_replay_alike():
    """Keyword and nested arguments, and calls while a profile is recorded, take the Python
    path of a replay: the same plans, the same values as eager."""
    eager, lazy = pair()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.05, momentum=0.9)
    step_e = train_fn(eager, opt_e)
    fn = train_fn(lazy, opt_l)
    step = irt.compile_step(lambda batch, scale=1.0: fn(*batch) * scale)
    irt.reset_metrics()
    for k, (x, y) in enumerate(batches(9)):
        batch = (irt.to_lazy(x), irt.to_lazy(y))
        loss = step(batch, scale=2.0) if k % 2 else step(list(batch))
        close(loss, step_e(x, y) * (2.0 if k % 2 else 1.0), rtol=2e-5)
    c = counters()
    assert c["StepReplay"] == 9 - c["StepTraced"] and c["StepReplay"] >= 4
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-4, atol=1e-5)


def test_a_lent_number_is_placed_again_only_when_it_changes():
    """A learning rate in a Python number, lent to the step, is read at every replay and placed
    again only when it changed, its sign included (-0.0 is not 0.0): the program reads each new
    value, as eager does."""
    eager, lazy = pair()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1)
    step, step_e = irt.compile_step(train_fn(lazy, opt_l)), train_fn(eager, opt_e)
    data = batches(10)
    for x, y in data[:3]:
        close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y))
    assert step.replaying
    placed = []
    for (x, y), lr in zip(data[3:], [0.1, 0.1, 0.05, 0.05, -0.0, 0.0, 0.0], strict=True):
        for opt in (opt_e, opt_l):
            opt.param_groups[0]["lr"] = lr
        lx, ly = irt.to_lazy(x), irt.to_lazy(y)
        before = counters()["TransferToDevice"]
        close(step(lx, ly), step_e(x, y))
        placed.append(counters()["TransferToDevice"] - before)
    assert placed == [0, 0, 1, 0, 1, 1, 0] and step.replaying
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        close(p_l, p_e, rtol=1e-5, atol=1e-6)


def test_timers_and_counters_appear_in_the_order_first_recorded():
    """An execution's timers and a replay's counter take their place when first recorded, not
    when read: ExecuteTime comes before MarkStepTime, as the step recorded them."""
    x = irt.to_lazy(torch.arange(6.0))
    irt.reset_metrics()
    y = (x * 3).sum()
    irt.mark_step()
    timers = list(irt.metrics()["timers"])
    assert timers.index("ExecuteTime") < timers.index("MarkStepTime")
    assert y.item() == 45
    _, lazy = pair()
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1)
    step = irt.compile_step(train_fn(lazy, opt))
    data = [(irt.to_lazy(x), irt.to_lazy(y)) for x, y in batches(4)]
    step(*data[0])
    for x, y in data[1:]:
        step(x, y)
    irt.metrics_report()  # (a read between replays)
    counters_now = list(counters())
    assert counters_now.index("StepTraced") < counters_now.index("StepReplay")


def test_a_replay_launches_through_its_executables_run():
    """A replay runs its program through ``Executable.run``, as a traced call does: a wrapper
    set on the executable sees every launch."""
    from ir_runtime._frontend.inspect import last_executable

    _, lazy = pair()
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1)
    step = irt.compile_step(train_fn(lazy, opt))
    data = [(irt.to_lazy(x), irt.to_lazy(y)) for x, y in batches(6)]
    for x, y in data[:3]:
        step(x, y)
    assert step.replaying
    exe, ran = last_executable(), []
    run = exe.run
    exe.run = lambda arrays: ran.append(len(arrays)) or run(arrays)
    try:
        for x, y in data[3:]:
            step(x, y)
    finally:
        del exe.run
    assert ran == [len(exe.in_shardings)] * 3


def test_a_result_is_placed_on_its_own_mesh_when_another_mesh_places_alike():
    """Two meshes over the same devices whose placements coincide (("dp", "tp") over 4x2 and
    "x" over 8): each tensor a replay writes stays on its own mesh, with its own axis names,
    as after a traced call."""
    from ir_runtime._frontend.inspect import value_of

    mesh_a = irt.Mesh(np.arange(8), (4, 2), ("dp", "tp"))
    mesh_b = irt.Mesh(np.arange(8), (8,), ("x",))
    w, v = irt.to_lazy(torch.ones(8, 4)), irt.to_lazy(torch.full((8, 4), 2.0))
    irt.mark_sharding(w, mesh_a, (("dp", "tp"), None))
    irt.mark_sharding(v, mesh_b, ("x", None))

    @irt.compile_step
    def step(s):
        w.mul_(s)
        v.add_(s)
        return (w * v).sum()

    s = irt.to_lazy(torch.tensor(2.0))
    losses = [step(s).item() for _ in range(5)]
    assert step.replaying and counters()["StepReplay"] >= 2
    assert losses == [32 * 2**k * (2 + 2 * k) for k in range(1, 6)]
    for t, mesh, spec in ((w, mesh_a, (("dp", "tp"), None)), (v, mesh_b, ("x", None))):
        placed = value_of(t).node.sharding
        assert placed.mesh == mesh and placed.partition_spec == spec


def test_a_replays_returned_tensors_are_new_each_call_as_eager_makes_them():
    """A replay's returned tensors are made ahead, in batches (``_fast.held``): each call still
    returns a new tensor holding its own value, made as torch would make it then (an inference
    tensor under ``torch.inference_mode()``, not otherwise); and spares are kept for a bounded
    number of shapes."""
    from ir_runtime._frontend.recording import _fast

    lin = irt.to_lazy(torch.nn.Linear(4, 2))
    w = irt.to_torch(lin.weight).detach().numpy()
    b = irt.to_torch(lin.bias).detach().numpy()

    @irt.compile_step
    def forward(x):
        return lin(x).sum(0)

    def want(k):
        return (np.full((3, 4), float(k)) @ w.T + b).sum(0)

    outs = [forward(irt.to_lazy(torch.full((3, 4), float(k)))) for k in range(8)]
    assert forward.replaying and len({id(o) for o in outs}) == 8
    for k, o in enumerate(outs):
        np.testing.assert_allclose(irt.to_torch(o).numpy(), want(k), rtol=1e-6)
        assert not o.requires_grad and not o.is_inference()
    with torch.inference_mode():
        inside = [forward(irt.to_lazy(torch.full((3, 4), float(k)))) for k in range(6)]
    assert all(o.is_inference() for o in inside) and forward.replaying
    np.testing.assert_allclose(irt.to_torch(inside[-1]).numpy(), want(5), rtol=1e-6)
    after = forward(irt.to_lazy(torch.ones(3, 4)))
    assert not after.is_inference()
    # Spares hold no value yet: out of the collector's sight until handed out.
    spare = [t for batch in _fast.spares().values() for t in batch]
    assert spare and not any(gc.is_tracked(t) for t in spare)
    assert all(gc.is_tracked(o) for o in [*outs, *inside, after])

    @irt.compile_step
    def sized(x):
        return x * 2

    with warnings.catch_warnings():  # (more argument signatures than a step keeps plans for)
        warnings.simplefilter("ignore", irt.CaptureWarning)
        for n in range(1, 80):  # 79 shapes, each replayed: spares for at most 64
            for _ in range(3):
                got = sized(irt.to_lazy(torch.full((n,), 1.5)))
            assert got.shape == (n,) and irt.to_torch(got).sum().item() == 3 * n
    assert len(_fast.spares()) <= 64
