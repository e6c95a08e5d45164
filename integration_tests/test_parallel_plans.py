"""PyTorch's parallelism vocabulary end to end, on 8 devices: the TP tutorial's Llama under its
TP + SP plan and FSDP2 (``fully_shard`` per block and at the root), and Hugging Face Llama,
Qwen2 and Mistral under their own ``tp_plan``, train 5 AdamW steps with eager's losses; the plan
compiles to the program its hand-written ``mark_sharding`` version compiles to; checkpoints
(DCP, ``CheckpointManager``, ``save_pretrained``) restore across meshes bit for bit."""

import copy
import re
import warnings

import hf_models
import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
import tp_llama
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel

import ir_runtime as irt
from ir_runtime._frontend import inspect
from ir_sharding import ShardingError

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def _batch(mesh, *tensors):
    return [distribute_tensor(t, mesh, [Shard(0), Replicate()]) for t in tensors]


def _train_tutorial_llama(mesh, prepare, loss_parallel_head=False):
    """5 AdamW steps of the tutorial Llama, eager and lazy (``prepare(lazy)`` places it), under
    ``compile_step``; returns the lazy losses, eager's, the step and the metrics' counters."""
    eager = tp_llama.build()
    lazy = prepare(irt.to_lazy(copy.deepcopy(eager)))
    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, lazy)}

    def step(model, tokens, labels):
        logits = model(tokens)
        if loss_parallel_head and model is lazy:
            with loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
                loss.backward()
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
        opts[model].step()
        opts[model].zero_grad()
        return loss.detach()

    compiled = irt.compile_step(step)
    irt.CACHE.clear()  # (compiles counted from a cold cache)
    irt.reset_metrics()
    want, got = [], []
    torch.manual_seed(1)
    for _ in range(5):
        tokens, labels = torch.randint(0, 128, (8, 16)), torch.randint(0, 128, (8, 16))
        want.append(step(eager, tokens, labels))
        got.append(irt.to_torch(compiled(lazy, *_batch(mesh, tokens, labels))))
    assert compiled.replaying, compiled.reason or compiled.last_guard_failure
    return torch.stack(got), torch.stack(want), lazy, dict(irt.metrics()["counters"])


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)], ids=["2x4", "4x2"])
def test_the_tp_tutorial_llama_with_fsdp_trains_with_eager_s_losses(shape):
    mesh = irt.device_mesh(shape, ("dp", "tp"))
    got, want, lazy, counters = _train_tutorial_llama(mesh, lambda m: tp_llama.parallelize(m, mesh))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=0)
    assert (counters["StepTraced"], counters["StepReplay"]) == (3, 2)
    wq = lazy.layers[0].attention.wq.weight
    assert wq.placements == (Shard(0), Shard(0)) and wq.device_mesh is mesh
    assert lazy.layers[0].attention.wo.weight.placements == (Shard(0), Shard(1))


def test_loss_parallel_over_a_vocabulary_sharded_head_trains_with_eager_s_losses():
    mesh = irt.device_mesh((2, 4), ("dp", "tp"))

    def prepare(model):
        tp_llama.parallelize(model, mesh, fsdp=False)
        head = ColwiseParallel(input_layouts=Shard(1), use_local_output=False)
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, mesh["tp"], {"output": head})  # the tutorial's loss_parallel
        return model

    got, want, _, _ = _train_tutorial_llama(mesh, prepare, loss_parallel_head=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=0)


def _collectives(text: str) -> dict:
    return {c: len(re.findall(rf"= \S+ {c}(-start)?\(", text)) for c in COLLECTIVES}


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)], ids=["2x4", "4x2"])
def test_a_plan_compiles_to_the_program_of_its_hand_written_annotations(shape):
    """The same collectives (by kind, in the compiled HLO), the same peak bytes (XLA's memory
    analysis), as many traces and compiles: the plan is only annotations."""
    mesh = irt.device_mesh(shape, ("dp", "tp"))
    programs = {}
    for how, prepare in (
        ("plan", lambda m: tp_llama.parallelize(m, mesh)),
        ("hand", lambda m: tp_llama.annotate_by_hand(m, mesh._ir_mesh)),
    ):
        got, want, _, counters = _train_tutorial_llama(mesh, prepare)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=0)
        executable = inspect.last_executable()
        programs[how] = (
            _collectives(executable.compiled.as_text()),
            executable.memory()["peak"],
            counters["StepTraced"],
            counters["CompileCount"],
        )
    assert programs["plan"] == programs["hand"]
    assert sum(programs["plan"][0].values()) > 0  # (a sharded program: it has collectives)


HF = [("llama", {}), ("qwen2", {}), ("mistral", {"sliding_window": 4})]


@pytest.mark.parametrize("kind, extra", HF, ids=[k for k, _ in HF])
def test_a_hugging_face_model_trains_under_its_own_tp_plan_and_fsdp(kind, extra):
    mesh = irt.device_mesh((2, 4), ("dp", "tp"))  # 4 key/value heads over tp = 4
    eager = hf_models.causal(
        kind, hidden_size=64, num_attention_heads=8, num_key_value_heads=4, **extra
    ).train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    irt.apply_tp_plan(lazy, mesh)
    for layer in lazy.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(lazy, mesh=mesh["dp"])
    attention = lazy.model.layers[0].self_attn
    assert attention.k_proj.weight.placements == (Shard(0), Shard(0))
    assert attention.o_proj.weight.placements == (Shard(0), Shard(1))
    step = hf_models.training_step(eager, lazy)
    compiled = irt.compile_step(step)
    irt.reset_metrics()
    for _ in range(5):
        ids = torch.randint(1, 96, (8, 8))
        want = step(eager, ids, None)
        got = compiled(lazy, *_batch(mesh, ids), None)
        torch.testing.assert_close(irt.to_torch(got), want, rtol=1e-4, atol=0)
    counters = irt.metrics()["counters"]
    assert (counters["StepTraced"], counters["StepReplay"]) == (3, 2)


def test_apply_tp_plan_refuses_a_style_it_does_not_take_and_changes_nothing():
    mesh = irt.device_mesh((2, 4), ("dp", "tp"))
    model = irt.to_lazy(hf_models.causal("llama", num_key_value_heads=4, hidden_size=64))
    before = {n: p._spec for n, p in model.named_parameters()}
    with pytest.raises(ShardingError, match="'moe_tp_experts' is not a style taken here"):
        irt.apply_tp_plan(model, mesh, {"lm_head": "colwise", "model.norm": "moe_tp_experts"})
    with pytest.raises(
        ShardingError, match=r"plan key 'model\.layers\.\*\.nope' names no submodule"
    ):
        irt.apply_tp_plan(model, mesh, {"lm_head": "colwise", "model.layers.*.nope": "colwise"})
    assert {n: p._spec for n, p in model.named_parameters()} == before


def _state(model) -> dict:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def test_checkpoints_of_a_placed_model_restore_into_another_mesh_bit_for_bit(tmp_path):
    """DCP (``torch.distributed.checkpoint.save/load``), ``load_state_dict`` and
    ``CheckpointManager`` of a model placed on 2x4 restore into one placed on 4x2."""
    source = tp_llama.parallelize(
        irt.to_lazy(tp_llama.build(seed=1)), irt.device_mesh((2, 4), ("dp", "tp"))
    )
    want = _state(source)
    target_mesh = irt.device_mesh((4, 2), ("dp", "tp"))

    def target():
        return tp_llama.parallelize(irt.to_lazy(tp_llama.build(seed=2)), target_mesh)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (DCP: "assuming ... a single process")
        dcp.save(source.state_dict(), checkpoint_id=tmp_path / "dcp")
        restored = target()
        state = restored.state_dict()
        dcp.load(state, checkpoint_id=tmp_path / "dcp")
    got = _state(restored)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    wq = restored.layers[0].attention.wq.weight
    assert wq.placements == (Shard(0), Shard(0)) and wq.device_mesh is target_mesh

    restored = target()
    restored.load_state_dict(source.state_dict())  # (a copy into each placed parameter)
    got = _state(restored)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert restored.layers[0].attention.wq.weight.placements == (Shard(0), Shard(0))

    manager = irt.CheckpointManager(tmp_path / "orbax")
    manager.save(0, {"model": source})
    restored = target()
    manager.restore(0, {"model": restored})
    got = _state(restored)
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_clip_grad_norm_of_a_placed_model_is_eager_s():
    mesh = irt.device_mesh((2, 4), ("dp", "tp"))
    eager = tp_llama.build()
    lazy = tp_llama.parallelize(irt.to_lazy(copy.deepcopy(eager)), mesh)
    tokens = torch.randint(0, 128, (8, 16))
    for model, batch in ((eager, tokens), (lazy, _batch(mesh, tokens)[0])):
        model(batch).float().logsumexp(-1).mean().backward()
    want = torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.5)
    got = torch.nn.utils.clip_grad_norm_(lazy.parameters(), 0.5)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=0)
    for p, q in zip(eager.parameters(), lazy.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-6)


def test_save_pretrained_of_a_placed_hugging_face_model_reloads_in_eager(tmp_path):
    import transformers

    mesh = irt.device_mesh((2, 4), ("dp", "tp"))
    eager = hf_models.causal("llama", hidden_size=64, num_attention_heads=8, num_key_value_heads=4)
    lazy = irt.to_lazy(copy.deepcopy(eager))
    irt.apply_tp_plan(lazy, mesh)
    fully_shard(lazy, mesh=mesh["dp"])
    with torch.no_grad():
        for p in lazy.parameters():
            p.mul_(1.5)
    lazy.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is type(eager)
    for (n, p), q in zip(loaded.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(p, q.detach() * 1.5), n
