"""Buffer donation: a step's program writes the new values of the tensors it replaces into
their old buffers, and nothing the user can still read is lost."""

import copy
import warnings

import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_runtime._frontend import inspect

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def counters():
    return irt.metrics()["counters"]


def pair(momentum=0.9, shard=True):
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    lazy = irt.to_lazy(copy.deepcopy(eager))
    if shard:
        irt.mark_sharding(lazy[0].weight, MESH, ("model", None))
        irt.mark_sharding(lazy[2].weight, MESH, (None, "model"))
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=momentum) for m in (eager, lazy)]
    return eager, lazy, opts


def batch(k):
    g = torch.Generator().manual_seed(k)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def train(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def assert_same_parameters(lazy, eager):
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        np.testing.assert_allclose(
            irt.to_torch(p_l).numpy(), p_e.detach().numpy(), rtol=1e-5, atol=1e-7
        )


def lazy_step(model, opt, x, y):
    loss = train(model, opt, irt.to_lazy(x), irt.to_lazy(y))
    irt.mark_step()
    return loss


@pytest.fixture(autouse=True)
def _no_unusable_donation():
    """jax warns when a donated buffer was not usable: it would free nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "Some donated buffers were not usable")
        yield


@pytest.mark.parametrize("shard", [True, False], ids=["sharded", "one-device"])
def test_mark_step_donates_parameters_and_optimizer_state(shard):
    eager, lazy, (opt_e, opt_l) = pair(shard=shard)
    for k in range(4):
        # (their nodes: holding an array itself would keep it from being donated)
        before = [inspect.value_of(p).node for p in lazy.parameters()]
        irt.reset_metrics()
        loss = lazy_step(lazy, opt_l, *batch(k))
        expected = train(eager, opt_e, *batch(k))
        np.testing.assert_allclose(irt.to_torch(loss).numpy(), expected.item(), rtol=1e-5)
        exe = inspect.last_executable()
        if k == 0:
            # No momentum yet; a parameter placed from host memory gives its device copy.
            assert counters()["DonatedBuffers"] == 4
        if k >= 1:  # parameters and momentum buffers, each written in place
            assert counters()["DonatedBuffers"] == 8 == len(exe.donate)
            assert all(n.handle.is_deleted() for n in before)  # jax really took them over
            memory = exe.memory()
            assert memory["aliased"] > 0 and memory["peak"] < (
                memory["arguments"] + memory["outputs"] + memory["temporaries"]
            )
        del before
    assert_same_parameters(lazy, eager)


def test_a_copy_taken_before_the_step_keeps_its_value():
    eager, lazy, (opt_e, opt_l) = pair()
    lazy_step(lazy, opt_l, *batch(0))
    train(eager, opt_e, *batch(0))
    kept = lazy[0].weight.detach().clone()  # the weight's data, kept
    alias = lazy[0].weight.detach()  # shares the weight's storage: follows it, as in eager
    alias_e = eager[0].weight.detach()
    kept_view = lazy[2].bias[1:]
    expected = irt.to_torch(lazy[0].weight)  # (a host read: it leaves the weight as it is)
    irt.reset_metrics()
    lazy_step(lazy, opt_l, *batch(1))
    train(eager, opt_e, *batch(1))
    assert counters()["DonatedBuffers"] == 7  # all but the weight the copy holds
    np.testing.assert_array_equal(irt.to_torch(kept).numpy(), expected.numpy())
    close = {"rtol": 1e-5, "atol": 1e-7}
    np.testing.assert_allclose(irt.to_torch(alias).numpy(), alias_e.numpy(), **close)
    bias = eager[2].bias[1:].detach().numpy()
    np.testing.assert_allclose(irt.to_torch(kept_view).numpy(), bias, **close)
    weight = eager[0].weight.detach().numpy()
    np.testing.assert_allclose(irt.to_torch(lazy[0].weight).numpy(), weight, **close)


def test_a_tensor_the_step_only_reads_is_not_donated():
    _, lazy, (_, opt_l) = pair(momentum=0.0)
    x, y = batch(0)
    lx, ly = irt.to_lazy(x), irt.to_lazy(y)
    for _ in range(3):
        train(lazy, opt_l, lx, ly)
        irt.mark_step()
    data = inspect.data_of(lx)
    train(lazy, opt_l, lx, ly)
    irt.mark_step()
    assert not data.is_deleted()
    np.testing.assert_array_equal(irt.to_torch(lx).numpy(), x.numpy())


def test_an_array_held_outside_is_not_donated():
    _, lazy, (_, opt_l) = pair(momentum=0.0)
    lazy_step(lazy, opt_l, *batch(0))
    held = inspect.data_of(lazy[0].bias)  # (a jax array handed out keeps its buffer)
    value = np.asarray(held).copy()
    irt.reset_metrics()
    lazy_step(lazy, opt_l, *batch(1))
    assert counters()["DonatedBuffers"] == 3
    np.testing.assert_array_equal(np.asarray(held), value)


def test_a_pending_read_of_old_data_survives_a_host_read():
    """A host read runs only what shares computed work with the tensor read; a pending tensor
    left for later still reads the parameters' old data, so that is not donated."""
    eager, lazy, (opt_e, opt_l) = pair(momentum=0.0)
    lazy_step(lazy, opt_l, *batch(0))
    train(eager, opt_e, *batch(0))
    doubled = lazy[0].weight.detach() * 2  # pending, reading the weight as it is now
    expected = eager[0].weight.detach() * 2
    loss = train(lazy, opt_l, *map(irt.to_lazy, batch(1)))
    train(eager, opt_e, *batch(1))
    irt.reset_metrics()
    loss.item()  # runs the step, not `doubled`
    assert counters()["HostReadTensors"] < len(inspect.live_tensors())
    assert counters()["DonatedBuffers"] == 3  # the weight `doubled` reads is kept
    np.testing.assert_allclose(irt.to_torch(doubled).numpy(), expected.numpy(), rtol=1e-6)
    np.testing.assert_allclose(
        irt.to_torch(lazy[0].weight).numpy(), eager[0].weight.detach(), rtol=1e-5, atol=1e-7
    )


def test_compile_step_replays_donate_and_copy_what_is_still_read():
    eager, lazy, (opt_e, opt_l) = pair()
    step = irt.compile_step(lambda x, y: train(lazy, opt_l, x, y))
    irt.reset_metrics()
    for k in range(5):  # traced three times (the first makes the momentum), then replayed
        x, y = batch(k)
        step(irt.to_lazy(x), irt.to_lazy(y))
        train(eager, opt_e, x, y)
    c = counters()
    assert c["StepReplay"] == 2 and c["StepTraced"] == 3
    assert step.replaying and len(inspect.last_executable().donate) == 8
    kept = lazy[2].weight.detach().clone()
    expected = irt.to_torch(lazy[2].weight)
    irt.reset_metrics()
    x, y = batch(5)
    step(irt.to_lazy(x), irt.to_lazy(y))
    train(eager, opt_e, x, y)
    c = counters()
    assert c["StepReplay"] == 1 and c["DonationCopies"] == 1 and c["DonatedBuffers"] == 8
    np.testing.assert_array_equal(irt.to_torch(kept).numpy(), expected.numpy())
    assert_same_parameters(lazy, eager)
    # Only the jax array of a weight held outside (the tensor, its value and node are the
    # step's alone): the replay donates a copy of it, and the array keeps its value.
    held = inspect.data_of(lazy[0].bias)
    value = np.asarray(held).copy()
    irt.reset_metrics()
    x, y = batch(6)
    step(irt.to_lazy(x), irt.to_lazy(y))
    train(eager, opt_e, x, y)
    c = counters()
    assert c["StepReplay"] == 1 and c["DonationCopies"] == 1
    assert not held.is_deleted()
    np.testing.assert_array_equal(np.asarray(held), value)
    assert_same_parameters(lazy, eager)


def test_a_replay_reading_a_deleted_buffer_names_it_and_changes_nothing():
    # A replay passes its arrays to the launch unchecked; the launch names a deleted one.
    _, lazy, (_, opt_l) = pair()
    step = irt.compile_step(lambda x, y: train(lazy, opt_l, x, y))
    for k in range(4):
        step(irt.to_lazy(batch(k)[0]), irt.to_lazy(batch(k)[1]))
    assert step.replaying
    before = [irt.to_torch(p).clone() for p in lazy.parameters()]
    inspect.data_of(lazy[0].weight).delete()
    irt.reset_metrics()
    x, y = batch(9)
    with pytest.raises(
        irt.ExecutionError,
        match=r"parameter \d+ of the program holds a "
        r"deleted \(donated\) buffer \(float32\[32, 16\]\)",
    ):
        step(irt.to_lazy(x), irt.to_lazy(y))
    assert counters().get("StepReplay", 0) == 0 and counters().get("ExecuteCount", 0) == 0
    for p, was in list(zip(lazy.parameters(), before, strict=True))[1:]:
        np.testing.assert_array_equal(irt.to_torch(p).numpy(), was.numpy())
    # Held elsewhere, a donated buffer is copied first: a deleted one is named before that.
    step = irt.compile_step(lambda x, y: train(lazy, opt_l, x, y))
    lazy[0].weight.data = irt.to_lazy(before[0])
    for k in range(4):
        step(irt.to_lazy(batch(k)[0]), irt.to_lazy(batch(k)[1]))
    assert step.replaying
    before = [irt.to_torch(p).clone() for p in lazy.parameters()]
    held = inspect.data_of(lazy[2].bias)  # (a reference the replay counts: not its alone)
    held.delete()
    irt.reset_metrics()
    with pytest.raises(irt.ExecutionError, match=r"deleted \(donated\) buffer \(float32\[4\]\)"):
        step(irt.to_lazy(x), irt.to_lazy(y))
    assert counters().get("DonationCopies", 0) == 0 and counters().get("ExecuteCount", 0) == 0
    for p, was in list(zip(lazy.parameters(), before, strict=True))[:3]:
        np.testing.assert_array_equal(irt.to_torch(p).numpy(), was.numpy())


def test_a_failed_replay_launch_leaves_the_random_streams_as_they_were():
    # The replay reseeds (the step calls manual_seed) and draws dropout's key before its
    # launch: a launch refused (a deleted input) puts both streams back.
    from ir_runtime._frontend.recording import _rng

    torch.manual_seed(0)
    model = irt.to_lazy(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Dropout(0.5)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(x):
        torch.manual_seed(7)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step = irt.compile_step(train_step)
    x = irt.to_lazy(batch(0)[0])
    for _ in range(4):
        step(x)
    assert step.replaying
    torch.manual_seed(3)  # (the caller's generator, which the replay reseeds to 7)
    state, seedings, cpu = dict(_rng._state), _rng.seedings(), torch.get_rng_state()
    inspect.data_of(model[0].weight).delete()
    with pytest.raises(irt.ExecutionError, match="deleted"):
        step(x)
    assert dict(_rng._state) == state and _rng.seedings() == seedings
    assert torch.equal(torch.get_rng_state(), cpu)


def test_a_long_loop_donates_every_step_without_compiling_again():
    _, lazy, (_, opt_l) = pair()
    lazy_step(lazy, opt_l, *batch(0))
    lazy_step(lazy, opt_l, *batch(1))
    irt.reset_metrics()
    for k in range(30):
        lazy_step(lazy, opt_l, *batch(k % 3))
    c = counters()
    assert c.get("CacheMiss", 0) == 0 and c["DonatedBuffers"] == 30 * 8


def test_each_result_takes_the_buffer_it_replaces_as_jax_would():
    """Parameters and AdamW's two states, all of one shape and sharding: paired wrongly (a
    weight's buffer to a state's result), XLA must copy to keep the old weight readable. The
    program's memory, from XLA's analysis, against the same step hand-written in jax.jit."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from ir_sharding import ShardingSpec

    fsdp, d = ("data", "model"), 256
    torch.manual_seed(0)
    model = irt.to_lazy(torch.nn.Sequential(*(torch.nn.Linear(d, d, bias=False) for _ in range(2))))
    for p in model.parameters():
        irt.mark_sharding(p, MESH, (fsdp, None))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = irt.to_lazy(torch.randn(8, d))
    irt.mark_sharding(x, MESH, ("data", None))
    for _ in range(3):
        (model(x) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        irt.mark_step()
    ours = inspect.last_executable().memory()

    mesh = ShardingSpec(MESH, ()).to_jax().mesh
    ws, xs = NamedSharding(mesh, P(fsdp, None)), NamedSharding(mesh, P("data", None))

    def step(ws_, ms, vs, x):
        def loss(ws_):
            h = x
            for w in ws_:
                h = h @ w.T
            return (h**2).mean()

        grads = jax.grad(loss)(ws_)
        ms = [0.9 * m + 0.1 * g for m, g in zip(ms, grads, strict=True)]
        vs = [0.999 * v + 0.001 * g * g for v, g in zip(vs, grads, strict=True)]
        new = [
            w * (1 - 1e-5) - 1e-3 * (m / 0.27) / (jnp.sqrt(v / 0.003) + 1e-8)
            for w, m, v in zip(ws_, ms, vs, strict=True)
        ]
        return new, ms, vs

    two = [ws, ws]
    fn = jax.jit(
        step, in_shardings=(two, two, two, xs), out_shardings=(two,) * 3, donate_argnums=(0, 1, 2)
    )
    w = jax.ShapeDtypeStruct((d, d), jnp.float32, sharding=ws)
    xa = jax.ShapeDtypeStruct((8, d), jnp.float32, sharding=xs)
    m = fn.lower([w, w], [w, w], [w, w], xa).compile().memory_analysis()
    assert ours["aliased"] == m.alias_size_in_bytes > 0
    # (within a few scalars' bytes; a wrong pairing copies whole weights, 32 KiB each here)
    assert ours["temporaries"] <= m.temp_size_in_bytes + 1024


@pytest.mark.parametrize("reader", ["copy", "pending"])
def test_an_annotation_never_leaves_two_nodes_sharing_a_buffer(reader):
    """mark_sharding of held data makes a new node for the tensor; jax would place one
    device's data replicated by reusing that buffer, and donating the new node's would then
    destroy what the old one (a copy, a pending op) still reads, or donate it twice."""
    ref = torch.arange(64.0).reshape(8, 8)
    w = irt.to_lazy(ref.clone())
    irt.mark_step()
    kept = w.detach().clone() if reader == "copy" else w + 0
    irt.mark_sharding(w, MESH, (None, None))
    w.mul_(2)
    irt.mark_step()
    np.testing.assert_array_equal(irt.to_torch(kept).numpy(), ref.numpy())
    np.testing.assert_array_equal(irt.to_torch(w).numpy(), 2 * ref.numpy())


def test_a_view_taken_outside_follows_a_replayed_step():
    w = irt.to_lazy(torch.arange(4.0))
    irt.mark_step()

    def halve():
        w.mul_(0.5)

    step = irt.compile_step(halve)
    for _ in range(3):
        step()
    v = w[1:]
    step()
    assert step.replaying
    np.testing.assert_array_equal(irt.to_torch(v).numpy(), np.arange(1.0, 4.0) / 16)


# -- reference counts, calibrated on the running interpreter ------------------------------------


def test_reference_counts_are_calibrated_on_this_interpreter():
    """Every donation count subtracts what its own frame holds; ``refs`` must count exactly the
    holders of an object, the caller's locals included, on the interpreter that runs us."""
    import sys

    from ir_runtime import _donation

    assert _donation.CALIBRATION.trusted, _donation.CALIBRATION
    assert _donation.ENABLED[0]
    holder = [object()] * 3
    x = holder[0]
    assert _donation.refs(x) == 4  # three list slots and the local x
    assert _donation.refs(x) == sys.getrefcount(x) - 1  # getrefcount: its own argument too
    del holder
    assert _donation.refs(x) == 1


def test_counts_that_cannot_be_trusted_are_refused():
    import itertools
    import sys

    from ir_runtime._donation import Calibration

    flips = itertools.count()
    wobbly = Calibration(getrefcount=lambda x: sys.getrefcount(x) + next(flips) % 2)
    assert not wobbly.trusted and "references where 2, 3 and 4 are held" in wobbly.reason
    assert not Calibration(gil=False).trusted  # a free-threaded build: deferred counts
    # A constant offset (an interpreter that counts its own frame differently) is calibrated.
    plain = Calibration(getrefcount=lambda x: sys.getrefcount(x))
    shifted = Calibration(getrefcount=lambda x: sys.getrefcount(x) - 3)
    assert plain.trusted and shifted.trusted and shifted.own == plain.own - 3


def test_untrusted_counts_turn_donation_off_with_one_warning_and_the_same_values():
    """On an interpreter whose counts are off, donation is switched off (one DonationWarning
    at import, saying why) and training gives the same values, donating nothing."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import itertools, sys, warnings
        real, flips = sys.getrefcount, itertools.count()
        sys.getrefcount = lambda x: real(x) + next(flips) % 2
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import ir_runtime as irt
        sys.getrefcount = real
        kinds = [w.category.__name__ for w in caught]
        assert kinds.count("DonationWarning") == 1, kinds
        text = str(next(w.message for w in caught if w.category.__name__ == "DonationWarning"))
        assert "donates no buffers" in text and "2, 3 and 4" in text, text
        import torch
        irt.init(cpu_devices=1)
        torch.manual_seed(0)
        eager = torch.nn.Linear(8, 4)
        lazy = irt.to_lazy(torch.nn.Linear(8, 4))
        lazy.load_state_dict(eager.state_dict())
        opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, lazy)]
        x = torch.randn(16, 8)
        for _ in range(3):
            for m, opt, xs in ((eager, opts[0], x), (lazy, opts[1], irt.to_lazy(x))):
                opt.zero_grad()
                m(xs).square().mean().backward()
                opt.step()
            irt.mark_step()
        assert irt.metrics()["counters"].get("DonatedBuffers", 0) == 0
        torch.testing.assert_close(irt.to_torch(lazy.weight), eager.weight.detach())
        print("ok")
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("ok")


def test_a_tracer_at_import_does_not_skew_the_calibration():
    """Before CPython 3.13, a tracer that reads ``frame.f_locals`` (a debugger's conditional
    breakpoint) keeps a snapshot of the probe's locals: calibrated under it, every later count
    would be low and a buffer still read could be donated. Calibration runs untraced."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import sys
        def tracer(frame, event, arg):
            frame.f_locals
            return tracer
        sys.settrace(tracer)
        from ir_runtime import _donation
        sys.settrace(None)
        assert _donation.CALIBRATION.trusted, _donation.CALIBRATION
        holder = [object()]
        x = holder[0]
        assert _donation.refs(x) == 2, _donation.refs(x)  # the list and the local x
        print("ok")
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
