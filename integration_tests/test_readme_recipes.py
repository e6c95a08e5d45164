"""The READMEs' recipes run as written, against eager: a block marked with a comment naming
this file is executed from the README itself, so the README cannot drift from what works."""

import re
from pathlib import Path

import numpy as np
import torch
import transformers

import ir_runtime as irt

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- The block below runs as integration_tests/test_readme_recipes.py"


def block(readme: Path, title: str) -> str:
    """The python block that follows this file's mark under the heading ``title``."""
    text = readme.read_text()
    section = text[text.index(f"### {title}\n") :]
    after = section[section.index(MARK) :]
    found = re.search(r"```python\n(.*?)\n```", after, re.S)
    assert found, f"no python block after the mark in {readme}: {title}"
    return found.group(1)


def test_the_megatron_recipe_for_a_hugging_face_decoder_trains_as_eager():
    code = block(
        ROOT / "packages/ir-runtime/README.md", "Tensor parallelism for a Hugging Face decoder"
    )
    ns: dict = {"__name__": "readme"}
    irt.reset_metrics()
    exec(compile(code, "ir-runtime/README.md", "exec"), ns)
    model, mesh = ns["model"], ns["mesh"]
    layer = model.model.layers[0]
    for p, spec in (
        (layer.self_attn.q_proj.weight, ("model", None)),
        (layer.self_attn.o_proj.weight, (None, "model")),
        (layer.mlp.up_proj.weight, ("model", None)),
        (layer.mlp.down_proj.weight, (None, "model")),
        (model.model.embed_tokens.weight, ("model", None)),
        (model.lm_head.weight, ("model", None)),
    ):
        assert p._spec.partition_spec == spec and p._spec.mesh == mesh
    assert layer.input_layernorm.weight._spec is None
    assert ns["train_step"].replaying
    c = irt.metrics()["counters"]
    assert c["StepReplay"] >= len(ns["batches"]) - 3 and c["CompileCount"] <= 2

    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(ns["config"])
    opt = torch.optim.AdamW(eager.parameters(), lr=3e-3)
    sched = transformers.get_cosine_schedule_with_warmup(opt, 2, 8)
    want = []
    for ids in ns["batches"]:
        loss = eager(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        want.append(loss.item())
    np.testing.assert_allclose(ns["losses"], want, rtol=1e-5, atol=1e-6)


def test_the_parallelism_recipe_places_and_trains_as_eager():
    from torch.distributed.tensor import Shard

    code = block(ROOT / "packages/ir-runtime/README.md", "A plan in one process")
    ns: dict = {"__name__": "readme"}
    torch.manual_seed(0)
    exec(compile(code, "ir-runtime/README.md", "exec"), ns)
    model = ns["model"]
    assert model[0].up.weight.placements == (Shard(0), Shard(0))
    assert model[0].down.weight.placements == (Shard(0), Shard(1))
    assert ns["train_step"].replaying
    torch.manual_seed(0)
    eager = torch.nn.Sequential(ns["Block"](), ns["Block"]())
    opt = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    for _ in range(4):
        x = torch.randn(16, 8, 64)
        loss = eager(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    torch.testing.assert_close(torch.tensor(ns["loss"].item()), loss.detach(), rtol=1e-4, atol=0)
