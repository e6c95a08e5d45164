"""300 sharded training steps with collectives on 8 virtual CPU devices, in a row.

XLA's CPU collectives deadlock (rendezvous timeout, process abort) when several executions of a
program with all-reduces overlap on a 2-core machine (README, collectives). The runtime lets at
most one collective program run on CPU devices: the next one waits for it before it starts,
while the host builds the next step. The loop below never waits itself (losses are read at the
end), so without that rule many executions would be in flight and the run would hang and
abort."""

import numpy as np
from models import data, leaf, linear_sgd_step, numpy_sgd_step, params, pinned

import ir_runtime as irt
from ir_sharding import Mesh, ShardingSpec

STEPS = 300


def test_300_sharded_steps_with_collectives():
    irt.wait_device_ops()  # nothing of an earlier test still in flight: the counts are ours
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
        losses.append(loss)
        ref_w, ref_b, ref_loss = numpy_sgd_step(x, y, ref_w, ref_b)
        ref_losses.append(ref_loss)
    c = irt.metrics()["counters"]
    assert c["CompileCount"] == 1
    assert c["ExecuteCount"] == STEPS
    # The program has all-reduces: every launch after the first waited for the one before.
    assert c["CollectiveSync"] == STEPS - 1
    losses = [float(irt.to_host(x)) for x in losses]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(irt.to_host(w.node), ref_w, rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0]


def leaf_of(result):
    from ir_core import Value

    return Value(result)
