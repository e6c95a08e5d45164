"""Every optimizer in torch.optim, on each path torch offers it (its default, foreach=True,
capturable=True where its constructor takes it), under mark_step and compile_step, with a
LambdaLR schedule that warms up from 0 and decays to 0, on a model whose embedding has rows no
step uses (their gradients exactly 0) and a Linear sharded over "model": the parameters eager
gives (within 1e-5) and no NaN where eager has none."""

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
RATES = [0.0, 0.5, 1.0, 0.5, 0.0]  # warm up from 0, decay to 0 (transformers' schedules)


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
    for _ in range(len(RATES) - 1):
        step(eager, opts[0], scheds[0], ids)
        lazy_step(lazy, opts[1], scheds[1], irt.to_lazy(ids))
        irt.mark_step()
    for (k, pl), pe in zip(lazy.named_parameters(), eager.parameters(), strict=True):
        got = irt.to_torch(pl)
        assert not got.isnan().any(), f"{k} is NaN"
        np.testing.assert_allclose(got.numpy(), pe.detach().numpy(), rtol=1e-5, atol=1e-5)
