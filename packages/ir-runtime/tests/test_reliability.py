"""300 sharded training steps with collectives on 8 virtual CPU devices, in a row.

XLA's CPU collectives deadlock (rendezvous timeout, process abort) when several executions of a
program with all-reduces overlap on a 2-core machine (ANCHORS.md). The runtime waits for a
collective program on CPU before it returns, so executions never overlap; this test would hang
and abort without that."""

import numpy as np
from models import data, leaf, linear_sgd_step, numpy_sgd_step, params, pinned

import ir_runtime as irt
from ir_sharding import Mesh, ShardingSpec

STEPS = 300


def test_300_sharded_steps_with_collectives():
    irt.CACHE.clear()
    irt.reset_metrics()
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    xs, ws = ShardingSpec(mesh, ("data", None)), ShardingSpec(mesh, (None, "model"))
    batches = [data(k, 32, 16, 8) for k in range(10)]
    w0, b0 = params(0, 16, 8)
    w, b = leaf(w0, ws), leaf(b0)
    ref_w, ref_b = w0, b0
    losses, ref_losses = [], []
    for k in range(STEPS):
        x, y = batches[k % len(batches)]
        # Each parameter's result pinned where the parameter lives, so the next step's graph
        # is the same program (XLA would otherwise pick a placement for the new b).
        step = linear_sgd_step(leaf(x, xs), leaf(y, xs), w, b)
        roots = pinned(step, [ws, ShardingSpec.replicated(mesh), None])
        new_w, new_b, loss = irt.execute(roots)
        w, b = leaf_of(new_w), leaf_of(new_b)
        losses.append(float(irt.to_host(loss)))
        ref_w, ref_b, ref_loss = numpy_sgd_step(x, y, ref_w, ref_b)
        ref_losses.append(ref_loss)
    c = irt.metrics()["counters"]
    assert c["CompileCount"] == 1
    assert c["ExecuteCount"] == STEPS
    assert c["CollectiveSync"] == STEPS  # the program has all-reduces, and each was waited for
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(irt.to_host(w.node), ref_w, rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0]


def leaf_of(result):
    from ir_core import Value

    return Value(result)
