"""CheckpointManager: a sharded training run saved with orbax and restored, into other layouts,
bit for bit; a resumed run matches the uninterrupted one; bad input changes nothing."""

import copy

import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch

import ir_runtime as irt
from ir_runtime._frontend import inspect

MESHES = {
    "4x2": irt.Mesh(np.arange(8), (4, 2), ("data", "model")),
    "8x1": irt.Mesh(np.arange(8), (8, 1), ("data", "model")),
    "2x4": irt.Mesh(np.arange(8), (2, 4), ("data", "model")),
}
LAYOUTS = {  # (mesh, first weight's spec, last weight's spec): FSDP, Megatron, replicated
    "fsdp-4x2": ("4x2", (("data", "model"), None), (("data", "model"), None)),
    "megatron-8x1": ("8x1", ("data", None), (None, "data")),
    "megatron-2x4": ("2x4", (None, "model"), ("model", None)),
    "replicated": ("4x2", None, None),
}


def model(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(dropout), torch.nn.Linear(32, 8)
    )


def placed(layout, seed=0, dropout=0.0):
    mesh_name, first, last = LAYOUTS[layout]
    m = irt.to_lazy(model(seed, dropout))
    for layer, spec in ((m[0], first), (m[3], last)):
        if spec is not None:
            irt.mark_sharding(layer.weight, MESHES[mesh_name], spec)
    return m


def batch(k):
    g = torch.Generator().manual_seed(100 + k)
    return torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)


def train(m, opt, k):
    x, y = batch(k)
    loss = torch.nn.functional.mse_loss(m(irt.to_lazy(x)), irt.to_lazy(y))
    loss.backward()
    opt.step()
    opt.zero_grad()
    irt.mark_step()
    return irt.to_torch(loss).item()


def host_state(m, opt):
    weights = {k: irt.to_torch(v) for k, v in m.state_dict().items()}
    moments = {
        (i, k): (irt.to_torch(v) if isinstance(v, irt.LazyTensor) else v.clone())
        for i, s in opt.state_dict()["state"].items()
        for k, v in s.items()
    }
    return weights, moments


@pytest.mark.parametrize(
    ("saved", "into"),
    [
        ("fsdp-4x2", "megatron-8x1"),
        ("megatron-8x1", "fsdp-4x2"),
        ("fsdp-4x2", "megatron-2x4"),
        ("megatron-2x4", "replicated"),
        ("replicated", "fsdp-4x2"),
    ],
)
def test_a_checkpoint_restores_into_another_layout_bit_for_bit(tmp_path, saved, into):
    m = placed(saved)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for k in range(2):
        train(m, opt, k)
    ckpt = irt.CheckpointManager(tmp_path)
    assert ckpt.save(2, {"model": m, "optim": opt, "data": {"epoch": 1, "seen": (3, 4)}})
    want = host_state(m, opt)

    m2 = placed(into, seed=1)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    state = {"model": m2, "optim": opt2, "data": None}
    assert irt.CheckpointManager(tmp_path).restore(None, state) == 2
    got = host_state(m2, opt2)
    for part in (0, 1):
        assert got[part].keys() == want[part].keys()
        for k in want[part]:
            assert torch.equal(got[part][k], want[part][k]), k
    assert state["data"] == {"epoch": 1, "seen": (3, 4)}
    # Each tensor kept the placement it had: the layout restored into, not the one saved.
    spec = LAYOUTS[into][1]
    assert (inspect.annotation_of(m2[0].weight) is None) == (spec is None)
    assert not isinstance(opt2.state[m2[0].weight]["step"], irt.LazyTensor)  # a CPU count


def test_a_resumed_run_matches_the_uninterrupted_one(tmp_path):
    """Dropout included: the lazy random stream resumes where it was."""
    m = placed("fsdp-4x2", dropout=0.3)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    uninterrupted = [train(m, opt, k) for k in range(6)]

    m = placed("fsdp-4x2", dropout=0.3)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    ckpt = irt.CheckpointManager(tmp_path, save_interval=3)
    losses, step = [], 0
    for k in range(3):
        losses.append(train(m, opt, k))
        step += 1
        ckpt.save_async(step, {"model": m, "optim": opt})
    ckpt.join()
    assert ckpt.all_steps() == [3]
    torch.manual_seed(12345)  # the new process's own seed: the checkpoint's replaces it
    m = placed("fsdp-4x2", seed=7, dropout=0.3)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    step = irt.CheckpointManager(tmp_path).restore(None, {"model": m, "optim": opt})
    losses += [train(m, opt, k) for k in range(step, 6)]
    assert losses == uninterrupted  # exactly: the same program on the same data and masks
    # Into another layout the sums are split differently: the same run, to rounding.
    m = placed("megatron-8x1", seed=7, dropout=0.3)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    irt.CheckpointManager(tmp_path).restore(3, {"model": m, "optim": opt})
    other = losses[:3] + [train(m, opt, k) for k in range(3, 6)]
    np.testing.assert_allclose(other, uninterrupted, rtol=1e-5)


def test_async_saves_keep_the_newest_and_orbax_reads_them(tmp_path):
    m = placed("fsdp-4x2")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    ckpt = irt.CheckpointManager(tmp_path, save_interval=2, max_to_keep=2)
    saved = []
    for step in range(1, 9):
        train(m, opt, step)
        if ckpt.save_async(step, {"model": m, "optim": opt, "step": step}):
            saved.append(step)
    ckpt.join()
    assert saved == [2, 4, 6, 8] and ckpt.all_steps() == [6, 8]
    # orbax alone reads the checkpoint: a directory of its own format.
    plain = ocp.CheckpointManager(
        tmp_path, item_handlers={"arrays": ocp.StandardCheckpointHandler()}
    ).restore(8, args=ocp.args.Composite(arrays=ocp.args.StandardRestore()))["arrays"]
    np.testing.assert_array_equal(
        np.asarray(plain["model"]["0.weight"]), irt.to_torch(m[0].weight).numpy()
    )


def test_a_mismatch_is_named_and_nothing_changes(tmp_path):
    m = placed("fsdp-4x2")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    train(m, opt, 0)
    ckpt = irt.CheckpointManager(tmp_path)
    ckpt.save(1, {"model": m})

    torch.manual_seed(0)
    other = irt.to_lazy(
        torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.0), torch.nn.Linear(32, 4)
        )
    )
    before = {k: irt.to_torch(v).clone() for k, v in other.state_dict().items()}
    with pytest.raises(
        ValueError,
        match=r"'model' '3.weight': the checkpoint holds \[8, 32\] float32, "
        r"the target \[4, 32\] float32",
    ) as e:
        ckpt.restore(1, {"model": other})
    assert type(e.value) is irt.CheckpointMismatchError
    assert isinstance(e.value, irt.CheckpointError)
    for k, v in other.state_dict().items():
        assert torch.equal(irt.to_torch(v), before[k])
    with pytest.raises(
        FileNotFoundError, match=r"no checkpoint of step 5 .* the complete ones are \[1\]"
    ) as e:
        ckpt.restore(5, {"model": m})
    assert type(e.value) is irt.CheckpointNotFoundError
    with pytest.raises(KeyError, match=r"the checkpoint has no optimizer 'optim'") as e:
        ckpt.restore(1, {"model": m, "optim": opt})
    assert type(e.value) is irt.CheckpointKeyError
    # The message as written (a KeyError's str() would quote it), the saved names listed.
    assert str(e.value) == "the checkpoint has no optimizer 'optim'; it has []"
    with pytest.raises(FileNotFoundError, match=r"no complete checkpoint") as e:
        irt.CheckpointManager(tmp_path / "empty").restore(None, {"model": m})
    assert type(e.value) is irt.CheckpointNotFoundError
    with pytest.raises(TypeError, match=r"'loader' is a object") as e:
        ckpt.save(2, {"loader": object()})
    assert type(e.value) is irt.CheckpointStateError
    assert ckpt.all_steps() == [1]


def test_bad_input_raises_the_checkpoint_error_for_it(tmp_path):
    """Each is a CheckpointError and the builtin it was before, and changes nothing."""
    m = placed("fsdp-4x2")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    train(m, opt, 0)
    cases = [  # (call, class, builtin, message)
        (
            lambda: irt.CheckpointManager(tmp_path, save_interval=0),
            irt.CheckpointArgumentError,
            ValueError,
            r"save_interval must be a positive int, got 0",
        ),
        (
            lambda: irt.CheckpointManager(tmp_path, max_to_keep=True),
            irt.CheckpointArgumentError,
            ValueError,
            r"max_to_keep must be None or a positive int, got True",
        ),
    ]
    (tmp_path / "a-file").write_text("")
    cases.append(
        (
            lambda: irt.CheckpointManager(tmp_path / "a-file"),
            irt.CheckpointDirectoryError,
            NotADirectoryError,
            r"checkpoint directory .*a-file is a file: pass a directory",
        )
    )
    ckpt = irt.CheckpointManager(tmp_path / "ckpt")
    ckpt.save(1, {"model": m, "optim": opt, "epoch": 3})
    torch.manual_seed(0)
    other = irt.to_lazy(model(seed=3))
    two_groups = torch.optim.SGD(
        [{"params": list(other.parameters())[:2]}, {"params": list(other.parameters())[2:]}],
        lr=0.1,
    )
    before = {k: irt.to_torch(v).clone() for k, v in other.state_dict().items()}
    cases += [
        (
            lambda: ckpt.save(-1, {"model": m}),
            irt.CheckpointArgumentError,
            ValueError,
            r"a checkpoint step is a non-negative int, got -1",
        ),
        (
            lambda: ckpt.save(1, {"model": m}),
            irt.CheckpointExistsError,
            ValueError,
            r"step 1 is already saved in .*: a step is saved once",
        ),
        (
            lambda: ckpt.save(2, [m]),
            irt.CheckpointStateError,
            TypeError,
            r"a checkpoint state is a dict of str names to its parts, got a list",
        ),
        (
            lambda: ckpt.save(2, {"model": m, 3: opt}),
            irt.CheckpointStateError,
            TypeError,
            r"a checkpoint state is a dict of str names to its parts, got the name 3",
        ),
        (
            lambda: ckpt.save(2, {"data": {1: 2}}),
            irt.CheckpointStateError,
            TypeError,
            r"checkpoint state 'data': dict keys must be str, got 1",
        ),
        (
            lambda: ckpt.restore(1, {"model": other, "seen": 0}),
            irt.CheckpointKeyError,
            KeyError,
            r"the checkpoint has no 'seen'; it has \['epoch'\]",
        ),
        (
            lambda: ckpt.restore(1, {"net": other}),
            irt.CheckpointKeyError,
            KeyError,
            r"the checkpoint has no 'net'; it has \[.*'model'",
        ),
        (
            lambda: ckpt.restore(1, {"model": torch.nn.Sequential(other, torch.nn.Linear(1, 1))}),
            irt.CheckpointKeyError,
            KeyError,
            r"'model': the checkpoint lacks '0.0.weight' \(and \d+ more\); a restore takes "
            r"the keys the checkpoint was saved with",
        ),
        (
            lambda: ckpt.restore(1, {"model": other, "optim": two_groups}),
            irt.CheckpointMismatchError,
            ValueError,
            r"optimizer 'optim': the checkpoint's parameter groups hold \[4\] parameters, "
            r"this optimizer's \[2, 2\]",
        ),
    ]
    for call, cls, builtin, message in cases:
        with pytest.raises(cls, match=message) as e:
            call()
        assert type(e.value) is cls and isinstance(e.value, builtin), (cls, e.value)
        assert isinstance(e.value, irt.CheckpointError) and isinstance(e.value, irt.RuntimeIRError)
        assert not isinstance(e.value, irt.RecomputeError)
    assert ckpt.all_steps() == [1]
    for k, v in other.state_dict().items():
        assert torch.equal(irt.to_torch(v), before[k])


def test_consolidated_state_dict_is_an_ordinary_cpu_state_dict():
    m = placed("megatron-2x4")
    sd = irt.consolidated_state_dict(m)
    eager = copy.deepcopy(model())
    eager.load_state_dict(sd)
    assert all(type(v) is torch.Tensor and v.device.type == "cpu" for v in sd.values())
    for k, v in eager.state_dict().items():
        assert torch.equal(v, irt.to_torch(m.state_dict()[k]))


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3, 1.0])
def test_a_process_killed_while_saving_leaves_every_listed_checkpoint_whole(tmp_path, mode, delay):
    """SIGKILL at several points of a loop of saves: whatever is listed restores whole, and
    nothing partial is listed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    writer = os.path.join(os.path.dirname(__file__), "checkpoint_writer.py")
    child = subprocess.Popen(
        [sys.executable, writer, str(tmp_path), mode], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    ckpt = irt.CheckpointManager(tmp_path, max_to_keep=3)
    steps = ckpt.all_steps()
    assert steps and len(steps) <= 4, steps  # (the newest may still have been deleting one)
    for k in steps:
        w = irt.to_lazy(torch.zeros(1024, 1024))
        state = {"w": w, "meta": None}
        assert ckpt.restore(k, state) == k
        assert state["meta"] == {"step": k}
        assert bool((irt.to_torch(w) == float(k)).all())


def test_across_process_counts_both_ways(tmp_path):
    """2 processes x 4 devices save (each writing its own shards), one process of 8 restores;
    and the other way round, into another layout."""
    import os
    import subprocess
    import sys

    from checkpoint_multiprocess import build

    script = os.path.join(os.path.dirname(__file__), "checkpoint_multiprocess.py")
    launch = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "4"]

    def run(*args):
        done = subprocess.run(
            [*launch, script, *map(str, args)], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    torch.manual_seed(0)
    want = {
        k: v.detach().numpy()
        for k, v in torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)
        )
        .state_dict()
        .items()
    }
    run("save", tmp_path / "two", "fsdp")
    here = build(5, "megatron")
    state = {"model": here, "meta": None}
    assert irt.CheckpointManager(tmp_path / "two").restore(1, state) == 1
    for k, v in here.state_dict().items():
        np.testing.assert_array_equal(irt.to_torch(v).numpy(), want[k])

    irt.CheckpointManager(tmp_path / "one").save(
        1, {"model": build(0, "megatron"), "meta": {"n": 2}}
    )
    run("restore", tmp_path / "one", "fsdp", tmp_path / "out.npz")
    got = np.load(tmp_path / "out.npz")
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)


def test_an_ordinary_state_dict_loads_into_a_sharded_model_shard_by_shard():
    """load_state_dict of a CPU state dict: each annotated tensor is placed at once, every
    device receiving only its shard; nothing is left to a program."""
    m = placed("fsdp-4x2")
    sd = model(seed=3).state_dict()
    irt.reset_metrics()
    m.load_state_dict(sd)
    assert irt.metrics()["counters"].get("CompileCount", 0) == 0
    data = inspect.data_of(m[0].weight)  # (32, 16) over all 8 devices by rows
    assert data is not None and {s.data.shape for s in data.addressable_shards} == {(4, 16)}
    for k, v in m.state_dict().items():
        assert torch.equal(irt.to_torch(v), sd[k])


def test_a_corrupt_checkpoint_is_a_clear_error(tmp_path):
    import os

    m = placed("fsdp-4x2")
    ckpt = irt.CheckpointManager(tmp_path)
    ckpt.save(1, {"model": m})
    for root, _, files in os.walk(tmp_path / "1" / "arrays"):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"garbage")
    other = placed("fsdp-4x2", seed=2)
    before = irt.to_torch(other[0].weight).clone()
    with pytest.raises(ValueError, match=r"checkpoint 1 in .* cannot be read") as e:
        irt.CheckpointManager(tmp_path).restore(1, {"model": other})
    assert type(e.value) is irt.CheckpointReadError
    assert isinstance(e.value, irt.CheckpointError)
    assert torch.equal(irt.to_torch(other[0].weight), before)


def test_a_compiled_step_resumes_as_it_ran(tmp_path):
    """compile_step keeps nothing a checkpoint must hold: after a restore its guards see the
    rebound tensors and the reloaded optimizer, and the run goes on as the uninterrupted one."""

    def run(m, opt, ks, ckpt=None):
        @irt.compile_step
        def step(x, y):
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        out = []
        for k in ks:
            x, y = batch(k)
            out.append(irt.to_torch(step(irt.to_lazy(x), irt.to_lazy(y))).item())
            if ckpt is not None and k == 2:
                ckpt.save(3, {"model": m, "optim": opt})
        return out

    m = placed("megatron-8x1")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True)
    uninterrupted = run(m, opt, range(6))
    m = placed("megatron-8x1")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True)
    first = run(m, opt, range(3), irt.CheckpointManager(tmp_path))
    m = placed("megatron-8x1", seed=9)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True)
    assert irt.CheckpointManager(tmp_path).restore(None, {"model": m, "optim": opt}) == 3
    irt.reset_metrics()
    assert first + run(m, opt, range(3, 6)) == uninterrupted
    # The restored state has the running state's kinds and placements (the step count a
    # placed lazy tensor, the tensors made in the running order): nothing compiles again.
    assert irt.metrics()["counters"].get("CompileCount", 0) == 0


def kinds(opt):
    """Per state tensor: its kind, its annotation and where its data lives."""
    out = []
    for p in (p for g in opt.param_groups for p in g["params"]):
        for k, v in opt.state[p].items():
            node = v._ir.node if isinstance(v, irt.LazyTensor) else None
            out.append(
                (
                    k,
                    type(v).__name__,
                    getattr(node, "sharding", None),
                    getattr(getattr(node, "handle", None), "sharding", None),
                )
            )
    return out


@pytest.mark.parametrize("capturable", [True, False])
def test_restored_optimizer_state_is_placed_as_the_running_state(tmp_path, capturable):
    m = placed("megatron-2x4")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=capturable)
    train(m, opt, 0)
    train(m, opt, 1)
    ckpt = irt.CheckpointManager(tmp_path)
    ckpt.save(2, {"model": m, "optim": opt})
    m2 = placed("megatron-2x4", seed=3)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-2, capturable=capturable)
    ckpt.restore(2, {"model": m2, "optim": opt2})
    assert kinds(opt2) == kinds(opt)
    assert kinds(opt)[0][:2] == ("step", "LazyTensor" if capturable else "Tensor")
    assert train(m2, opt2, 2) == train(m, opt, 2)


def test_a_partial_restore_reads_what_the_state_names(tmp_path):
    """The weights alone, from a training run's checkpoint; a true mismatch is named shortly."""
    m = placed("fsdp-4x2")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    train(m, opt, 0)
    ckpt = irt.CheckpointManager(tmp_path)
    ckpt.save(1, {"model": m, "optim": opt, "epoch": 4})
    weights = placed("megatron-8x1", seed=5)
    state = {"model": weights}
    assert ckpt.restore(None, state) == 1 and state == {"model": weights}
    for k, v in m.state_dict().items():
        assert torch.equal(irt.to_torch(weights.state_dict()[k]), irt.to_torch(v))
    eager = model(seed=5)
    ckpt.restore(1, {"model": eager})  # into a host model too
    for k, v in m.state_dict().items():
        assert torch.equal(eager.state_dict()[k], irt.to_torch(v))
    smaller = irt.to_lazy(torch.nn.Sequential(torch.nn.Linear(16, 32)))
    with pytest.raises(irt.CheckpointKeyError) as e:
        ckpt.restore(1, {"model": smaller})
    assert str(e.value) == (
        "'model': the target lacks '3.bias' (and 1 more); a restore takes the keys the "
        "checkpoint was saved with, no more, no fewer"
    )


def test_tensors_inside_plain_values_and_tensor_hyperparameters_round_trip(tmp_path):
    """A learning rate held in a tensor (the recipe for a schedule under compile_step) and a
    scheduler's state holding tensors: restored exactly, as the same kinds; the optimizer
    keeps its own rate tensor, the saved value copied in."""
    m = placed("fsdp-4x2")
    lr = torch.tensor(1e-2)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, capturable=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10)
    for k in range(3):
        train(m, opt, k)
        sched.step()
    odd = torch.tensor([[1.5, -0.0], [float("nan"), float("inf")]], dtype=torch.bfloat16)
    lazy = irt.to_lazy(torch.arange(6, dtype=torch.int32).reshape(2, 3))
    ckpt = irt.CheckpointManager(tmp_path)
    ckpt.save(
        3,
        {
            "model": m,
            "optim": opt,
            "sched": sched.state_dict(),
            "extra": {"odd": odd, "ids": [lazy]},
        },
    )

    m2 = placed("fsdp-4x2", seed=2)
    lr2 = torch.tensor(1e-2)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=lr2, capturable=True)
    sched2 = torch.optim.lr_scheduler.OneCycleLR(opt2, max_lr=0.05, total_steps=10)
    state = {"model": m2, "optim": opt2, "sched": None, "extra": None}
    ckpt.restore(3, state)
    sched2.load_state_dict(state["sched"])
    assert opt2.param_groups[0]["lr"] is lr2 and lr2.item() == lr.item()
    for key in ("base_lrs", "_last_lr"):
        assert [float(v) for v in sched2.state_dict()[key]] == [
            float(v) for v in sched.state_dict()[key]
        ]
    extra = state["extra"]
    assert type(extra["odd"]) is torch.Tensor and extra["odd"].dtype == torch.bfloat16
    assert torch.equal(extra["odd"].view(torch.int16), odd.view(torch.int16))  # bit for bit
    assert isinstance(extra["ids"][0], irt.LazyTensor)
    assert torch.equal(irt.to_torch(extra["ids"][0]), irt.to_torch(lazy))
    for k in range(3, 6):
        sched2.step(), sched.step()
        assert train(m2, opt2, k) == train(m, opt, k)

    # A number saved, a tensor running: the optimizer keeps its tensor, the number in it.
    floats = torch.optim.AdamW(m.parameters(), lr=0.25, capturable=True)
    train(m, floats, 9)
    ckpt.save(7, {"model": m, "optim": floats})
    m3 = placed("fsdp-4x2", seed=2)
    lr3 = torch.tensor(0.5)
    opt3 = torch.optim.AdamW(m3.parameters(), lr=lr3, capturable=True)
    ckpt.restore(7, {"model": m3, "optim": opt3})
    assert opt3.param_groups[0]["lr"] is lr3 and lr3.item() == 0.25

    with pytest.raises(irt.CheckpointStateError, match=r"'big'\[0\] is a tensor of 5000 elements"):
        ckpt.save(4, {"big": [torch.zeros(5000)]})


def test_a_checkpoint_from_8_devices_restores_on_4(tmp_path):
    """The annotations saved with it name devices this run lacks: they apply only on the mesh
    it was saved from, and are not looked up otherwise."""
    import subprocess
    import sys

    m = placed("megatron-2x4")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True)
    train(m, opt, 0)
    irt.CheckpointManager(tmp_path / "ckpt").save(1, {"model": m, "optim": opt})
    want = {k: irt.to_torch(v).numpy() for k, v in m.state_dict().items()}
    np.savez(tmp_path / "want.npz", **want)
    script = tmp_path / "restore4.py"
    script.write_text(
        "import sys\n"
        "import numpy as np\n"
        "import torch\n"
        "import ir_runtime as irt\n"
        "irt.init(cpu_devices=4)\n"
        "mesh = irt.Mesh(np.arange(4), (2, 2), ('data', 'model'))\n"
        "torch.manual_seed(3)\n"
        "m = irt.to_lazy(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),\n"
        "    torch.nn.Dropout(0.0), torch.nn.Linear(32, 8)))\n"
        "irt.mark_sharding(m[0].weight, mesh, ('model', None))\n"
        "opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True)\n"
        "irt.CheckpointManager(sys.argv[1]).restore(1, {'model': m, 'optim': opt})\n"
        "want = np.load(sys.argv[2])\n"
        "for k, v in m.state_dict().items():\n"
        "    np.testing.assert_array_equal(irt.to_torch(v).numpy(), want[k])\n"
        "m(irt.to_lazy(torch.ones(4, 16))).sum().backward()\n"
        "opt.step()\n"
        "irt.mark_step()\n"
        "print('restored on', len(irt.devices()))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt"), str(tmp_path / "want.npz")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "restored on 4"


class Block(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up, self.down = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def layers(seed):
    torch.manual_seed(seed)
    return torch.nn.ModuleList(Block() for _ in range(4))


def scan_train(m, opt, k):
    loss = irt.scan_layers(m, irt.to_lazy(batch(k)[0])).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    irt.mark_step()
    return irt.to_torch(loss).item()


def test_stacked_layers_restore_from_stacked_and_per_layer_saves(tmp_path):
    """stack_layers stores a stack's tensors as one per name; its checkpoints keep the per-layer
    keys. A save of the stacked model and its optimizer restores into another stacked one, which
    then trains as the saved one does; a save of the unstacked model restores into a stacked one."""
    m = irt.stack_layers(irt.to_lazy(layers(0)))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    scan_train(m, opt, 0)
    want = {k: irt.to_torch(v).clone() for k, v in m.state_dict().items()}
    assert "0.up.weight" in want and "up__weight" not in want
    mngr = irt.CheckpointManager(str(tmp_path / "stacked"))
    mngr.save(1, {"model": m, "opt": opt})
    mngr.join()
    other = irt.stack_layers(irt.to_lazy(layers(3)))
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    scan_train(other, other_opt, 2)
    mngr.restore(1, {"model": other, "opt": other_opt})
    mngr.close()
    for k, v in want.items():
        np.testing.assert_array_equal(irt.to_torch(other.state_dict()[k]), v, err_msg=k)
    assert scan_train(m, opt, 4) == scan_train(other, other_opt, 4)

    unstacked = irt.to_lazy(layers(7))
    mngr = irt.CheckpointManager(str(tmp_path / "unstacked"))
    mngr.save(1, {"model": unstacked})
    mngr.restore(1, {"model": other})
    mngr.close()
    for k, v in layers(7).state_dict().items():
        np.testing.assert_array_equal(irt.to_torch(other.state_dict()[k]), v, err_msg=k)
