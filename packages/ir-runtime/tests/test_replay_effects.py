"""compile_step: a replay is the call it replaces. Each effect a traced call can have is either
redone by every replay, or the call is not replayed and a ``CaptureWarning`` names the effect;
values are compared with torch eager (the random stream: with the same calls under
``mark_step``) after every call, traced or replayed."""

import copy
import warnings

import numpy as np
import pytest
import torch
from torch.optim.swa_utils import AveragedModel

import ir_runtime as irt


def models(seed=0, dropout=0.0):
    """The same small MLP twice: on CPU, and on the lazy device."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)]
    if dropout:
        layers.insert(2, torch.nn.Dropout(dropout))
    eager = torch.nn.Sequential(*layers)
    return eager, irt.to_lazy(copy.deepcopy(eager))


def batches(n, batch=8):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(batch, 6, generator=g), torch.randn(batch, 3, generator=g)) for _ in range(n)
    ]


def train(model, opt):
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def close(lazy, eager, rtol=1e-5, atol=1e-6):
    if isinstance(lazy, torch.Tensor):
        lazy = irt.to_torch(lazy)
    np.testing.assert_allclose(np.asarray(lazy), eager.detach().numpy(), rtol, atol)


def same_model(lazy, eager):
    for a, b in zip(lazy.state_dict().values(), eager.state_dict().values(), strict=True):
        close(a, b, rtol=2e-5, atol=1e-6)


def replays():
    return irt.metrics()["counters"].get("StepReplay", 0)


@pytest.fixture
def no_capture_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", irt.CaptureWarning)
        yield


# ---------------------------------------------------------------------------------------------
# Host tensors.


def test_a_host_counter_is_counted_on_every_call():
    """``seen.add_(n)`` on a CPU tensor is Python work its program does not hold: refused."""
    eager, lazy = models()

    def make(model, seen):
        step = train(model, torch.optim.SGD(model.parameters(), lr=0.1))

        def counted(x, y):
            seen.add_(x.shape[0])
            return step(x, y)

        return counted

    seen_e, seen = torch.zeros(()), torch.zeros(())
    step, step_e = irt.compile_step(make(lazy, seen)), make(eager, seen_e)
    with pytest.warns(irt.CaptureWarning, match=r"host tensor seen \(tensor \[\] float32\)"):
        for x, y in batches(6):
            close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y))
            assert seen.item() == seen_e.item()
    assert seen.item() == 48
    assert not step.replaying and "seen" in step.reason
    same_model(lazy, eager)


def test_an_averaged_model_counts_every_call():
    """``AveragedModel`` keeps ``n_averaged`` on the CPU unless moved: refused, named."""
    eager, lazy = models()
    swa_e, swa = AveragedModel(eager), AveragedModel(lazy)
    assert swa.n_averaged.device.type == "cpu"

    def make(model, swa):
        step = train(model, torch.optim.SGD(model.parameters(), lr=0.1))

        def averaged(x, y):
            loss = step(x, y)
            swa.update_parameters(model)
            return loss

        return averaged

    step, step_e = irt.compile_step(make(lazy, swa)), make(eager, swa_e)
    with pytest.warns(irt.CaptureWarning, match=r"swa\.n_averaged"):
        for x, y in batches(6):
            close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y))
            assert swa.n_averaged.item() == swa_e.n_averaged.item()
            same_model(swa.module, swa_e.module)
    assert swa.n_averaged.item() == 6
    assert not step.replaying and "swa.n_averaged" in step.reason


def test_a_host_argument_written_in_place_is_written_back(no_capture_warning):
    """The step's lazy ops write a host argument: a program result, copied back into the
    caller's tensor on every call, traced or replayed; a view argument writes its base."""
    eager, lazy = models()

    def make(model):
        def step(x, acc):
            with torch.no_grad():  # a running sum, kept on the host
                acc.add_(model(x).sum(0))
            return acc.sum()

        return step

    step, step_e = irt.compile_step(make(lazy)), make(eager)
    acc_e, acc = torch.zeros(3), torch.zeros(3)
    rows_e, rows = torch.zeros(2, 3), torch.zeros(2, 3)
    irt.reset_metrics()
    for i, (x, _) in enumerate(batches(6)):
        close(step(irt.to_lazy(x), acc), step_e(x, acc_e))
        close(acc, acc_e)
        step(irt.to_lazy(x), rows[i % 2])  # a view: its base changes, as in eager
        step_e(x, rows_e[i % 2])
        close(rows, rows_e)
    assert step.replaying and replays() == 2 * 6 - 2  # (the view's signature is the same)


def test_a_host_tensor_written_through_a_view_is_refused():
    eager, lazy = models()

    def make(model, buf):
        def step(x):
            buf[1:3].add_(1.0)
            return model(x).sum()

        return step

    buf_e, buf = torch.zeros(4), torch.zeros(4)
    step, step_e = irt.compile_step(make(lazy, buf)), make(eager, buf_e)
    with pytest.warns(irt.CaptureWarning, match=r"view \(tensor \[2\] float32\) of tensor buf"):
        for x, _ in batches(5):
            close(step(irt.to_lazy(x)), step_e(x))
            close(buf, buf_e)
    assert buf.tolist() == [0.0, 5.0, 5.0, 0.0]


# ---------------------------------------------------------------------------------------------
# Python attributes, optimizer state, requires_grad, module tables.


class Counted(torch.nn.Linear):
    def __init__(self, *args):
        super().__init__(*args)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


class CountingSGD(torch.optim.SGD):
    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.steps = 0

    def step(self, closure=None):
        self.steps += 1
        return super().step(closure)


class Trainer:
    def __init__(self, model, opt):
        self.model, self.opt, self.count = model, opt, 0

    def step(self, x, y):
        self.count += 1
        return train(self.model, self.opt)(x, y)


def _counted_module(model, lazy):
    torch.manual_seed(1)
    counted = Counted(3, 3)
    if lazy:
        counted = irt.to_lazy(counted)
    model.append(counted)
    return train(model, torch.optim.SGD(model.parameters(), lr=0.1)), lambda: counted.calls


def _counting_optimizer(model, lazy):
    opt = CountingSGD(model.parameters(), lr=0.1)
    return train(model, opt), lambda: opt.steps


def _trainer(model, lazy):
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return trainer.step, lambda: trainer.count


@pytest.mark.parametrize(
    "make, named",
    [
        (_counted_module, r"attribute .*\.calls"),
        (_counting_optimizer, r"attribute .*\.steps"),
        (_trainer, r"attribute self\.count"),
    ],
    ids=["module", "optimizer", "bound-method"],
)
def test_a_python_attribute_set_in_the_step_is_refused(make, named):
    eager, lazy = models()
    (step_e, count_e), (fn, count) = make(eager, False), make(lazy, True)
    step = irt.compile_step(fn)
    with pytest.warns(irt.CaptureWarning, match=named):
        for x, y in batches(5):
            close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y))
            assert count() == count_e()
    assert count() == 5 and not step.replaying
    same_model(lazy, eager)


def test_an_optimizers_first_state_is_made_by_a_traced_call(no_capture_warning):
    """AdamW's first step makes its state: that call is not the one replayed (no warning: a
    one-time setup), and the replays after match eager."""
    eager, lazy = models()
    opt_e = torch.optim.AdamW(eager.parameters(), lr=0.01)
    opt = torch.optim.AdamW(lazy.parameters(), lr=0.01, capturable=True)
    step, step_e = irt.compile_step(train(lazy, opt)), train(eager, opt_e)
    irt.reset_metrics()
    for x, y in batches(6):
        close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y), rtol=2e-5)
        same_model(lazy, eager)
    assert step.replaying and replays() == 6 - 3  # made state, then two equal traces
    assert len(opt.state) == len(opt_e.state)


def test_optimizer_state_set_in_python_is_refused():
    class Counting(torch.optim.SGD):
        def step(self, closure=None):
            for p in self.param_groups[0]["params"]:
                self.state[p]["n"] = self.state[p].get("n", 0) + 1
            return super().step(closure)

    eager, lazy = models()
    opt_e, opt = Counting(eager.parameters(), lr=0.1), Counting(lazy.parameters(), lr=0.1)
    step, step_e = irt.compile_step(train(lazy, opt)), train(eager, opt_e)
    with pytest.warns(irt.CaptureWarning, match=r"state entry 'n'"):
        for x, y in batches(5):
            close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y))
            ns = [s["n"] for s in opt.state.values()]
            assert ns == [s["n"] for s in opt_e.state.values()]
    assert ns == [5] * 4


def test_requires_grad_changed_in_the_step_is_refused():
    """A step that freezes and unfreezes a parameter every call."""
    eager, lazy = models()

    def make(model):
        step = train(model, torch.optim.SGD(model.parameters(), lr=0.1))

        def toggling(x, y):
            loss = step(x, y)
            bias = model[0].bias
            bias.requires_grad_(not bias.requires_grad)
            return loss

        return toggling

    step, step_e = irt.compile_step(make(lazy)), make(eager)
    with pytest.warns(irt.CaptureWarning, match=r"requires_grad_"):
        for x, y in batches(6):
            close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y))
            assert lazy[0].bias.requires_grad is eager[0].bias.requires_grad
            same_model(lazy, eager)


def test_requires_grad_set_once_then_replayed(no_capture_warning):
    eager, lazy = models()

    def make(model):
        step = train(model, torch.optim.SGD(model.parameters(), lr=0.1))

        def frozen(x, y):
            model[0].weight.requires_grad_(False)
            return step(x, y)

        return frozen

    step, step_e = irt.compile_step(make(lazy)), make(eager)
    irt.reset_metrics()
    for x, y in batches(6):
        close(step(irt.to_lazy(x), irt.to_lazy(y)), step_e(x, y))
        same_model(lazy, eager)
    assert step.replaying and replays() == 6 - 3


def test_a_buffer_registered_in_the_step_is_refused():
    class Remembers(torch.nn.Linear):
        def forward(self, x):
            self.register_buffer(f"seen{len(self._buffers)}", torch.zeros(()))
            return super().forward(x)

    torch.manual_seed(0)
    eager = Remembers(6, 3)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    with pytest.warns(irt.CaptureWarning, match=r"has a new buffer 'seen"):
        step = irt.compile_step(lambda x: lazy(x).sum())
        for x, _ in batches(5):
            close(step(irt.to_lazy(x)), eager(x).sum())
            assert list(lazy._buffers) == list(eager._buffers)
    assert len(lazy._buffers) == 5


def test_a_buffer_registered_once_is_replayed(no_capture_warning):
    class Masked(torch.nn.Linear):
        def forward(self, x):
            if "mask" not in self._buffers:
                self.register_buffer("mask", torch.tensor([1.0, 0.0, 1.0]))
            return super().forward(x) * self.mask

    torch.manual_seed(0)
    eager = Masked(6, 3)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    step = irt.compile_step(lambda x: lazy(x).sum())
    irt.reset_metrics()
    for x, _ in batches(6):
        close(step(irt.to_lazy(x)), eager(x).sum())
    assert step.replaying and replays() == 6 - 3


# ---------------------------------------------------------------------------------------------
# The random stream: a replay draws what the traced call (and mark_step) would.


def _dropout_model():
    torch.manual_seed(0)
    return irt.to_lazy(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5)))


def _run(fn, calls, compiled: bool):
    """Each call's result and CPU torch's next numbers after it, from ``calls``: a list of
    (seed to set before the call or None, the call's arguments)."""
    step = irt.compile_step(fn) if compiled else fn
    torch.manual_seed(123)
    got = []
    for seed, args in calls:
        if seed is not None:
            torch.manual_seed(seed)
        out = step(*args)
        if not compiled:
            irt.mark_step()
        got.append((irt.to_torch(out), torch.rand(2)))
    return got


def _same_stream(a, b):
    for (out_a, cpu_a), (out_b, cpu_b) in zip(a, b, strict=True):
        np.testing.assert_array_equal(out_a.numpy() == 0, out_b.numpy() == 0)  # the masks
        np.testing.assert_allclose(out_a.numpy(), out_b.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(cpu_a.numpy(), cpu_b.numpy())


def test_a_reseed_inside_the_step_is_replayed(no_capture_warning):
    model = _dropout_model()

    def fn(x):
        torch.manual_seed(7)
        return model(x)

    x = irt.to_lazy(torch.randn(4, 16))
    calls = [(None, (x,))] * 6
    expected = _run(fn, calls, compiled=False)
    irt.reset_metrics()
    got = _run(fn, calls, compiled=True)
    assert replays() == 6 - 2
    _same_stream(got, expected)
    for out, _ in got[1:]:  # reseeded alike: the same mask every call
        np.testing.assert_array_equal(out.numpy(), got[0][0].numpy())


def test_a_seed_passed_to_the_step_is_replayed(no_capture_warning):
    model = _dropout_model()

    def fn(x, seed):
        torch.manual_seed(seed)
        return model(x)

    x = irt.to_lazy(torch.randn(4, 16))
    calls = [(None, (x, 1 + i % 2)) for i in range(8)]
    expected = _run(fn, calls, compiled=False)
    irt.reset_metrics()
    got = _run(fn, calls, compiled=True)
    assert replays() == 8 - 4
    _same_stream(got, expected)
    assert not np.array_equal(got[0][0].numpy(), got[1][0].numpy())


def test_a_seed_set_between_calls_is_honoured(no_capture_warning):
    model = _dropout_model()
    x = irt.to_lazy(torch.randn(4, 16))
    calls = [(i if i % 3 == 0 else None, (x,)) for i in range(9)]
    expected = _run(model, calls, compiled=False)
    irt.reset_metrics()
    got = _run(model, calls, compiled=True)
    assert replays() >= 5
    _same_stream(got, expected)
    assert not np.array_equal(got[1][0].numpy(), got[2][0].numpy())  # the stream moves on


def test_a_draw_from_cpu_torchs_generator_is_refused():
    """A host draw the program never sees still moves CPU torch's stream, as eager's does."""
    eager, lazy = models()

    def make(model):
        def step(x):
            torch.rand(3)  # (a sampler's draw, say)
            return model(x).sum()

        return step

    def run(step, lazy):
        torch.manual_seed(5)
        return [(step(irt.to_lazy(x) if lazy else x), torch.rand(2)) for x, _ in batches(5)]

    expected = run(make(eager), False)
    with pytest.warns(irt.CaptureWarning, match=r"CPU torch's random generator"):
        got = run(irt.compile_step(make(lazy)), True)
    for (out, cpu), (out_e, cpu_e) in zip(got, expected, strict=True):
        close(out, out_e)
        np.testing.assert_array_equal(cpu.numpy(), cpu_e.numpy())


@pytest.mark.parametrize("outside", ["zero_grad(set_to_none=False)", "w.clamp_()"])
def test_pending_work_on_a_tensor_the_step_reads_is_run_first_and_the_step_replays(outside):
    """Work recorded outside the step on a tensor it reads (not an argument) is run first, by
    one mark_step, and the call is still replayed; values equal eager's after every call."""
    torch.manual_seed(0)
    eager = torch.nn.Linear(4, 3)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.1)

    def step(model, opt, x):
        model(x).pow(2).sum().backward()
        opt.step()

    compiled = irt.compile_step(lambda x: step(lazy, opt_l, x))
    for k in range(6):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(k))
        for model, opt in ((eager, opt_e), (lazy, opt_l)):
            if outside == "w.clamp_()":
                with torch.no_grad():
                    model.weight.clamp_(-0.3, 0.3)
            opt.zero_grad(set_to_none=False)
        step(eager, opt_e, x)
        compiled(irt.to_lazy(x))
        for (name, p), q in zip(lazy.named_parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.cpu(), q.detach(), msg=name)
    assert compiled.replaying, compiled.last_guard_failure


# ---------------------------------------------------------------------------------------------
# Split accumulation: one compiled function per micro-batch, one for the update.


def _split(model, opt, set_to_none=True):
    def micro(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y) / 3
        loss.backward()
        return loss

    def update():
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)

    return micro, update


@pytest.mark.parametrize(
    ("make_opt", "set_to_none"),
    [
        (lambda ps, lazy: torch.optim.SGD(ps, lr=0.1, momentum=0.9), True),
        (lambda ps, lazy: torch.optim.AdamW(ps, lr=0.01, capturable=lazy), True),
        (lambda ps, lazy: torch.optim.SGD(ps, lr=0.1, momentum=0.9), False),
    ],
    ids=["sgd", "adamw", "sgd-set_to_none=False"],
)
def test_split_accumulation_replays_both_functions(make_opt, set_to_none, no_capture_warning):
    """Three micro-batch calls accumulate into p.grad (the first makes it, the others add to
    it), then the update reads p.grad and zero_grad() drops (or zeroes) it: both functions are
    replayed, the micro-batch one with two plans chosen by whether p.grad is set, each
    reading p.grad as it is then; values equal eager's after every call."""
    eager, lazy = models()
    opt_e, opt_l = make_opt(eager.parameters(), False), make_opt(lazy.parameters(), True)
    micro_e, update_e = _split(eager, opt_e, set_to_none)
    micro, update = map(irt.compile_step, _split(lazy, opt_l, set_to_none))
    data = batches(18)
    irt.reset_metrics()
    for it in range(6):
        for x, y in data[3 * it : 3 * it + 3]:
            close(micro(irt.to_lazy(x), irt.to_lazy(y)), micro_e(x, y))
            for p, q in zip(lazy.parameters(), eager.parameters(), strict=True):
                close(p.grad, q.grad)
        update()
        update_e()
        same_model(lazy, eager)
        for p, q in zip(lazy.parameters(), eager.parameters(), strict=True):
            assert (p.grad is None) is (q.grad is None)
    c = irt.metrics()["counters"]
    # traced: the micro-batch calls of the first iteration (p.grad None, then set twice) and
    # the first of the second (None again, unless zeroed in place), the update's first three
    # (its first makes the optimizer state); 24 calls in all
    assert c["StepTraced"] == (4 if set_to_none else 3) + 3
    assert c["StepReplay"] == 24 - c["StepTraced"]
    assert micro.replaying and update.replaying


def test_split_accumulation_leaves_a_gradient_the_user_kept_intact():
    """An update that reads p.grad and drops it (its results, of the gradients' shapes, take
    their buffers over): a replay donates p.grad's buffer only when nothing but p.grad holds
    the tensor; a gradient the user kept keeps its values (the program reads a copy)."""
    eager, lazy = models()
    opts = {m: torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, lazy)}

    def make_update(model):
        def update():
            halves = [p.grad * 0.5 for p in model.parameters()]
            opts[model].step()
            opts[model].zero_grad()
            return halves

        return update

    micro_e, _ = _split(eager, opts[eager])
    micro = irt.compile_step(_split(lazy, opts[lazy])[0])
    update, update_e = irt.compile_step(make_update(lazy)), make_update(eager)
    for k, (x, y) in enumerate(batches(8)):
        micro(irt.to_lazy(x), irt.to_lazy(y))
        micro_e(x, y)
        keep = k % 2 == 1 and k > 3  # traced without (its plan donates p.grad), then replayed
        kept = [p.grad for p in lazy.parameters()] if keep else []
        kept_e = [q.grad.clone() for q in eager.parameters()] if keep else []
        irt.reset_metrics()
        for h, h_e in zip(update(), update_e(), strict=True):
            close(h, h_e)
        c = irt.metrics()["counters"]
        assert c["DonatedBuffers"] == 8  # the weights, and the gradients or their copies
        assert c.get("DonationCopies", 0) == len(kept)  # a copy for each gradient kept
        for g, g_e in zip(kept, kept_e, strict=True):
            close(g, g_e)
        same_model(lazy, eager)
    assert update.replaying
