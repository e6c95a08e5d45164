"""A torch_xla training script, unchanged torch_xla code (``torch_xla_train.py``: a decoder-only
Hugging Face model under FSDPv2 over a 1-D mesh, ``MpDeviceLoader`` with ``input_sharding``,
``torch_xla.compile``), run under ``python -m ir_runtime.torch_xla`` on 8 CPU devices, gives
torch eager's losses."""

import json
import os
import subprocess
import sys

import torch
import torch_xla_train as script

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torch_xla_train.py")
STEPS = 4


def _eager_losses():
    model = script.decoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for ids in script.batches(STEPS):
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_a_torch_xla_training_script_gives_eagers_losses():
    env = dict(os.environ, CPU_NUM_DEVICES="8")
    env.pop("IR_RUNTIME_CPU_DEVICES", None)
    done = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "ir_runtime.torch_xla",
                os.path.join(HERE, "torch_xla_train.py"),
            ),
            *("--steps", str(STEPS), "--warmup", "1"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])["losses"]
    want = _eager_losses()
    assert len(got) == STEPS
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
