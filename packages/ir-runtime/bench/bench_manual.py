"""Manual sharding against automatic: a row-parallel matmul on the 4x2 mesh, side by side.

x [B, K] is split ("data", "model") and W [K, N] ("model", None). GSPMD's version is
``(x @ W).relu()`` with those annotations: XLA inserts the all-reduce over "model" itself. The
manual version is ``shard_map`` of ``all_reduce(x_local @ W_local, "model")`` then the same relu
outside. Both run as ``compile_step`` steps (forward alone, and a training step: forward,
backward and SGD on W), beside ``jax.jit`` of each form (``jax.shard_map`` for the manual one).
Results are checked equal first. Step times are medians of blocks of steps, each block waited
for; the systems alternate, and the ratio is the median of each round's.

Prints a table and writes JSON (``--json PATH``).
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # benchjson, at the top

import benchjson  # noqa: E402
import ir_runtime as irt  # noqa: E402

irt.init(cpu_devices=8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

MESH = irt.Mesh(list(range(8)), (4, 2), ("data", "model"))
JAX_MESH = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
BLOCK = 10


def _row_parallel(x, w):
    return irt.all_reduce(x @ w, "model")


def ours(xc, wc, train: bool):
    """(gspmd step, manual step): compile_step functions of x, over W held lazily."""
    out = []
    for manual in (False, True):
        w = irt.to_lazy(wc.clone()).requires_grad_(train)
        irt.mark_sharding(w, MESH, ("model", None))
        opt = torch.optim.SGD([w], lr=1e-3) if train else None
        mm = irt.shard_map(
            _row_parallel, MESH, in_specs=(("data", "model"), ("model", None)),
            out_specs=("data", None),
        )  # fmt: skip

        def forward(x, w=w, mm=mm, manual=manual):
            return torch.relu(mm(x, w) if manual else x @ w)

        if train:

            @irt.compile_step
            def step(x, w=w, opt=opt, forward=forward):
                opt.zero_grad()
                loss = forward(x).square().mean()
                loss.backward()
                opt.step()
                return loss
        else:
            step = irt.compile_step(forward)
        out.append((step, w))
    x = irt.to_lazy(xc)
    irt.mark_sharding(x, MESH, ("data", "model"))
    irt.mark_step()
    return [(lambda step=step: step(x)) for step, _ in out], [w for _, w in out]


def theirs(xa, wa, train: bool):
    """(gspmd step, manual step) in jax.jit, W donated when trained."""
    xs = NamedSharding(JAX_MESH, P("data", "model"))
    ws = NamedSharding(JAX_MESH, P("model", None))
    x = jax.device_put(xa, xs)

    def gspmd(x, w):
        return jax.nn.relu(x @ w)

    manual_mm = jax.shard_map(
        lambda x, w: lax.psum(x @ w, "model"), mesh=JAX_MESH,
        in_specs=(P("data", "model"), P("model", None)), out_specs=P("data", None),
    )  # fmt: skip

    def manual(x, w):
        return jax.nn.relu(manual_mm(x, w))

    steps = []
    for f in (gspmd, manual):
        w = [jax.device_put(wa, ws)]
        if train:

            def loss(w, x, f=f):
                return jnp.mean(f(x, w) ** 2)

            @jax.jit
            def update(w, x, loss=loss):
                value, g = jax.value_and_grad(loss)(w, x)
                return w - 1e-3 * g, value

            def step(update=update, w=w):
                w[0], value = update(w[0], x)
                return value
        else:
            jf = jax.jit(f)

            def step(jf=jf, w=w):
                return jf(x, w[0])

        steps.append(step)
    return steps


def time_all(systems: dict, rounds: int) -> dict:
    waits = {name: irt.wait_device_ops for name in systems if name.startswith("ir_runtime")}
    last = {}
    for name, step in systems.items():
        for _ in range(3):
            last[name] = step()
        waits.get(name, lambda: None)()
    samples = {name: [] for name in systems}
    for _ in range(rounds):
        for name, step in systems.items():
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                out = step()
            if name in waits:
                waits[name]()
            else:
                out.block_until_ready()
            samples[name].append((time.perf_counter() - t0) / BLOCK)
            time.sleep(0.02)
    return samples


def bench(batch, k, n, rounds, train):
    rng = np.random.default_rng(0)
    xa = rng.standard_normal((batch, k)).astype(np.float32)
    wa = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    (g_step, m_step), (g_w, m_w) = ours(torch.tensor(xa), torch.tensor(wa), train)
    jg, jm = theirs(xa, wa, train)
    # Same results first: the two forms agree with each other and with jax.
    a, b = g_step(), m_step()
    np.testing.assert_allclose(a.detach().cpu().numpy(), b.detach().cpu().numpy(), rtol=2e-5)
    np.testing.assert_allclose(a.detach().cpu().numpy(), np.asarray(jg()), rtol=2e-5, atol=1e-6)
    systems = {
        "ir_runtime GSPMD": g_step,
        "ir_runtime shard_map": m_step,
        "jax.jit GSPMD": jg,
        "jax.jit shard_map": jm,
    }
    samples = time_all(systems, rounds)
    if train:  # after the same number of SGD steps, the same weights
        np.testing.assert_allclose(g_w.detach().cpu().numpy(), m_w.detach().cpu().numpy(),
                                   rtol=1e-4, atol=1e-6)  # fmt: skip
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    ratio = statistics.median(
        m / g
        for m, g in zip(samples["ir_runtime shard_map"], samples["ir_runtime GSPMD"], strict=True)
    )
    return {
        "batch": batch,
        "w": [k, n],
        "train": train,
        "us": {k: round(v, 1) for k, v in med.items()},
        "shard_map_over_gspmd": round(ratio, 3),
        "jax_shard_map_over_gspmd": round(med["jax.jit shard_map"] / med["jax.jit GSPMD"], 3),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rows = [
        bench(1024, 1024, 1024, args.rounds, train=False),
        bench(1024, 1024, 1024, args.rounds, train=True),
    ]
    names = list(rows[0]["us"])
    print("\nRow-parallel matmul on the 4x2 mesh, us per step (medians of blocks, waited for)")
    print(f"{'step':<22}" + "".join(f"{n:>24}" for n in names) + f"{'ours: manual/GSPMD':>22}")
    for r in rows:
        label = "forward" if not r["train"] else "train (fwd+bwd+SGD)"
        print(
            f"{label:<22}" + "".join(f"{r['us'][n]:>24.0f}" for n in names)
            + f"{r['shard_map_over_gspmd']:>22.3f}"
        )  # fmt: skip
    print("target: shard_map at most 1.1x the GSPMD step")
    benchjson.write(
        args.json,
        {
            "row_parallel": rows,
            "targets": {"shard_map_over_gspmd_max": 1.1},
            "environment": benchjson.environment(torch=torch.__version__, jax=jax.__version__),
        },
    )


if __name__ == "__main__":
    main()
