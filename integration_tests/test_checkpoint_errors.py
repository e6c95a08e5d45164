"""``CheckpointManager``'s bad input and faults: each refused in the project's words, and the
manager goes on working, the values saved before read back as they were; the directory a
process killed while saving or deleting leaves lists only whole steps; a restore is the way
out of a step that failed (its tensors set aside)."""

import json
import os
import re

import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_runtime import _memory
from ir_runtime._frontend import inspect


def batch(d=32, n=16):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def small_host(monkeypatch):
    """A host of 2 KB: a float32[1000] result does not fit (8 CPU devices share it)."""
    monkeypatch.setattr(_memory, "host_bytes", lambda: 2000)
    return monkeypatch


def run_state(scale: float, epoch: int) -> dict:
    """A state with a lazy module, a plain value and an optimizer that has state; ``scale``
    makes each step's weights its own."""
    torch.manual_seed(0)
    model = irt.to_lazy(torch.nn.Linear(4, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(irt.to_lazy(batch(4, 2))).sum().backward()
    opt.step()
    irt.mark_step()
    return {"model": model, "opt": opt, "epoch": epoch}


def values_of(state) -> dict:
    """The state's values as host copies: the oracle a restore is compared with."""
    out = {
        f"model/{k}": irt.to_torch(t).numpy().copy() for k, t in state["model"].state_dict().items()
    }
    for i, s in state["opt"].state_dict()["state"].items():
        out[f"opt/{i}"] = irt.to_torch(s["momentum_buffer"]).numpy().copy()
    out["epoch"] = state["epoch"]
    return out


def assert_restores(mngr, step, want):
    target = run_state(0.0, -1)
    assert mngr.restore(step, target) == step
    got = values_of(target)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_a_state_of_plain_values_alone_saves_and_restores(tmp_path):
    """orbax refuses an empty tree ("Found empty item."): a state without tensors saves no
    arrays item, and parts with no tensors (a module without parameters, an optimizer before
    its first step) save and restore beside plain values."""
    mngr = irt.CheckpointManager(tmp_path)
    plain = {"epoch": 3, "name": "run", "lrs": (0.1, float("inf")), "seen": [1, {"a": None}]}
    assert mngr.save(1, dict(plain))
    fresh = torch.optim.Adam(irt.to_lazy(torch.nn.Linear(4, 3)).parameters())
    assert mngr.save(2, {"relu": torch.nn.ReLU(), "opt": fresh, "epoch": 4})
    trained = run_state(2.0, 5)
    want = values_of(trained)
    assert mngr.save(3, trained)  # the manager goes on to save tensors

    back = {"epoch": 0, "name": "", "lrs": (), "seen": []}
    assert mngr.restore(1, back) == 1
    assert back == plain
    back = {"relu": torch.nn.ReLU(), "opt": fresh, "epoch": 0}
    assert mngr.restore(2, back) == 2
    assert back["epoch"] == 4 and fresh.state_dict()["state"] == {}
    assert_restores(mngr, 3, want)
    only_plain = {"epoch": 0}  # and plain values alone out of a checkpoint with tensors
    assert mngr.restore(3, only_plain) == 3 and only_plain == {"epoch": 5}
    with pytest.raises(irt.CheckpointKeyError, match=r"the checkpoint has no 'model'; it has \[\]"):
        mngr.restore(1, {"model": trained["model"], "epoch": 0})
    mngr.close()


DAMAGES = {  # how the meta file is damaged -> what the error says of it
    "truncated": (lambda text: text[: len(text) // 2], r"is not JSON, truncated or overwritten"),
    "garbage bytes": (lambda text: b"\xff\x00\x13 not json", r"is not JSON, .*UnicodeDecodeError"),
    "missing": (None, r"is missing"),
    "not a dict": (
        lambda text: "[1, 2]",
        r"is JSON but not what save writes \(the top level is a list",
    ),
    "a key lacking": (
        lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "rng"}),
        r"not what save writes \(the top level has no 'rng'; it has \['host', 'optimizers'",
    ),
    "a key of the wrong type": (
        lambda text: json.dumps({**json.loads(text), "host": {}}),
        r"not what save writes \(the top level\['host'\] is a dict, not a list\)",
    ),
    "an optimizer's key lacking": (
        lambda text: json.dumps(
            {**json.loads(text), "optimizers": {"opt": {"groups": [], "plain": {}}}}
        ),
        r"not what save writes \(optimizer 'opt' has no 'indices'",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_meta_file_is_named_and_nothing_changes(tmp_path, damage):
    mngr = irt.CheckpointManager(tmp_path)
    first, second = run_state(1.0, 1), run_state(2.0, 2)
    want_first, want_second = values_of(first), values_of(second)
    mngr.save(1, first)
    mngr.save(2, second)
    path = os.path.join(mngr.directory, "2", "meta", "metadata")
    write, says = DAMAGES[damage]
    if write is None:
        os.remove(path)
    else:
        damaged = write(open(path).read())
        with open(path, "wb" if isinstance(damaged, bytes) else "w") as f:
            f.write(damaged)

    target = run_state(3.0, 3)
    before = values_of(target)
    with pytest.raises(irt.CheckpointReadError) as e:
        mngr.restore(2, target)
    message = str(e.value)
    assert message.startswith(f"checkpoint step 2: its meta file {path} "), message
    assert re.search(says, message), message
    assert message.endswith(
        "a step restores only from the meta file its save wrote: restore another step ([1])"
    )
    assert isinstance(e.value, ValueError)
    if damage in ("truncated", "garbage bytes"):
        assert isinstance(e.value.__cause__, ValueError)  # JSONDecodeError, UnicodeDecodeError
    elif damage == "missing":
        assert isinstance(e.value.__cause__, FileNotFoundError)
    got = values_of(target)  # nothing assigned
    for k in before:
        np.testing.assert_array_equal(got[k], before[k], err_msg=k)

    assert_restores(mngr, 1, want_first)  # the others read as they were
    mngr.save(3, second)
    assert_restores(mngr, 3, want_second)
    mngr.close()


def failing_json_write(monkeypatch):
    """orbax writes the meta file in the background: a full disk, there, deterministically."""
    import orbax.checkpoint as ocp

    async def no_space(self, item, directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", no_space)


@pytest.mark.parametrize("reported_by", ["join", "save", "save_async", "restore"])
def test_a_failed_background_save_is_reported_once_by_the_next_call(
    tmp_path, monkeypatch, reported_by
):
    mngr = irt.CheckpointManager(tmp_path, save_interval=2)
    saved, failing = run_state(1.0, 2), run_state(2.0, 4)
    want_saved, want_failing = values_of(saved), values_of(failing)
    mngr.save(2, saved)
    failing_json_write(monkeypatch)
    assert mngr.save_async(4, failing)
    assert not mngr.save_async(5, failing)  # skipped by the interval: neither waits nor reports
    report = {
        "join": mngr.join,
        "save": lambda: mngr.save(6, failing),
        "save_async": lambda: mngr.save_async(6, failing),
        "restore": lambda: mngr.restore(2, run_state(0.0, -1)),
    }[reported_by]
    with pytest.raises(irt.CheckpointSaveError) as e:
        report()
    monkeypatch.undo()
    assert str(e.value) == (
        f"saving checkpoint step 4 in {mngr.directory} failed: OSError: [Errno 28] No space "
        f"left on device. Step 4 is not saved; the steps saved before it ([2]) are untouched: "
        f"fix the cause (disk space, permissions) and save the step again"
    )
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == 28
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, irt.CheckpointError)
    assert mngr.all_steps() == [2]  # the call that reported it did nothing else

    mngr.join()  # once: reported, and gone
    assert_restores(mngr, 2, want_saved)
    assert mngr.save_async(6, failing)
    mngr.join()
    assert mngr.save(4, failing)  # the failed step saves again
    assert mngr.all_steps() == [2, 4, 6]
    assert_restores(mngr, 4, want_failing)
    assert_restores(mngr, 6, want_failing)
    mngr.close()


# -- CheckpointManager: a process killed while saving or deleting lists only whole steps ----


def test_a_step_whose_deletion_was_cut_short_is_not_listed(tmp_path, monkeypatch):
    """max_to_keep drops step 1 when step 3 is complete. A process killed while removing its
    files leaves some of them; here the removal stops after the first one (the step's
    ``_CHECKPOINT_METADATA``, as the kill left it), and the manager of the next process must
    neither list step 1 nor restore it, and removes what is left of it."""
    import shutil

    def cut_short(path, *args, **kwargs):  # one file removed, then the process is gone
        for root, dirs, files in os.walk(path):
            dirs.sort()
            if files:
                os.remove(os.path.join(root, sorted(files)[0]))
                return

    mngr = irt.CheckpointManager(tmp_path, max_to_keep=2)
    states = {k: run_state(float(k), k) for k in (1, 2, 3)}
    wants = {k: values_of(s) for k, s in states.items()}
    mngr.save(1, states[1])
    mngr.save(2, states[2])
    monkeypatch.setattr(shutil, "rmtree", cut_short)
    mngr.save(3, states[3])
    monkeypatch.undo()

    after = irt.CheckpointManager(tmp_path, max_to_keep=2)  # the next process
    assert after.all_steps() == [2, 3] and after.latest_step() == 3
    with pytest.raises(irt.CheckpointNotFoundError) as e:
        after.restore(1, run_state(0.0, -1))
    assert str(e.value) == (
        f"no checkpoint of step 1 in {after.directory}; the complete ones are [2, 3]"
    )
    target = run_state(0.0, -1)
    assert after.restore(None, target) == 3  # the latest
    for k, v in wants[3].items():
        np.testing.assert_array_equal(values_of(target)[k], v, err_msg=k)
    assert_restores(after, 2, wants[2])
    assert sorted(os.listdir(tmp_path)) == ["2", "3"]  # nothing left of step 1
    after.save(4, states[1])  # and it goes on keeping two
    assert after.all_steps() == [3, 4] and sorted(os.listdir(tmp_path)) == ["3", "4"]
    after.close()
    mngr.close()


def test_a_step_whose_save_was_cut_short_is_not_listed(tmp_path, monkeypatch):
    """A save stopped before orbax finalized it (its meta file never written, as a kill there
    leaves it) is not listed by the next process's manager, nor restored, and saves again."""
    mngr = irt.CheckpointManager(tmp_path)
    first, second = run_state(1.0, 1), run_state(2.0, 2)
    want_first, want_second = values_of(first), values_of(second)
    mngr.save(1, first)
    failing_json_write(monkeypatch)
    with pytest.raises(irt.CheckpointSaveError):
        mngr.save(2, second)
    monkeypatch.undo()
    assert [n for n in os.listdir(tmp_path) if n.startswith("2")]  # the partial step is there

    after = irt.CheckpointManager(tmp_path)  # the next process
    assert after.all_steps() == [1]
    with pytest.raises(irt.CheckpointNotFoundError, match=r"no checkpoint of step 2 .*\[1\]$"):
        after.restore(2, run_state(0.0, -1))
    target = run_state(0.0, -1)
    assert after.restore(None, target) == 1  # the latest complete one
    for k, v in want_first.items():
        np.testing.assert_array_equal(values_of(target)[k], v, err_msg=k)
    assert after.save(2, second)
    assert after.all_steps() == [1, 2]
    assert_restores(after, 2, want_second)
    after.close()
    mngr.close()


def test_a_checkpoint_restores_into_a_set_aside_tensor(small_host, tmp_path):
    model = irt.to_lazy(torch.nn.Linear(4, 250))  # weight: 1000 float32
    ckpt = irt.CheckpointManager(tmp_path)
    ckpt.save(1, {"model": model})
    saved = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.mul_(3).add_(1)  # a step too large for this host
    with pytest.raises(irt.OutOfMemoryError):
        irt.mark_step()
    assert any(t is model.weight for t in inspect.set_aside())
    ckpt.restore(1, {"model": model})  # the way out: not run, restored
    small_host.undo()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v.cpu(), saved[k])
    irt.mark_step()
    assert not inspect.set_aside()
