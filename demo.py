"""The main job, as far as the project goes today.

Records one SGD step of a linear model (y = x @ W + b, mean-squared error) as an ir-core graph,
twice over new data, and shows what a compile cache keys on: the graph hash is the same for
every step, and changes when a parameter is annotated with a sharding over a 4x2 device mesh.
Annotating the recorded step (clone W with the sharding, relink its consumers) gives exactly the
graph recorded with W sharded from the start.

Training under SPMD on virtual CPU devices arrives with ir-runtime (issues #4 and #5); this
script grows into that demo.
"""

from ir_core import DeviceData, Generic, Shape, Value, dump_text, graph_hash, post_order
from ir_sharding import Mesh, ShardingSpec, relink, with_sharding

BATCH, IN, OUT, LR = 16, 32, 8, 0.1


def f32(*dims):
    return Shape("float32", dims)


def op(name, *operands, shape, **attrs):
    return Value(Generic(name, [*operands], [shape], attrs))


def sgd_step(x, y, w, b):
    """The ATen ops of forward, backward and update; returns the new (W, b) and the loss."""
    pred = op(
        "aten::add.Tensor",
        op("aten::mm", x, w, shape=f32(BATCH, OUT)),
        b,
        shape=f32(BATCH, OUT),
        alpha=1,
    )
    diff = op("aten::sub.Tensor", pred, y, shape=f32(BATCH, OUT), alpha=1)
    loss = op("aten::mean", op("aten::mul.Tensor", diff, diff, shape=f32(BATCH, OUT)), shape=f32())
    grad_pred = op("aten::mul.Scalar", diff, shape=f32(BATCH, OUT), other=2.0 / (BATCH * OUT))
    x_t = op("aten::permute", x, shape=f32(IN, BATCH), dims=(1, 0))
    grad_w = op("aten::mm", x_t, grad_pred, shape=f32(IN, OUT))
    grad_b = op("aten::sum.dim_IntList", grad_pred, shape=f32(OUT), dim=(0,), keepdim=False)
    new_w = op("aten::sub.Tensor", w, grad_w, shape=f32(IN, OUT), alpha=LR)
    new_b = op("aten::sub.Tensor", b, grad_b, shape=f32(OUT), alpha=LR)
    return [new_w, new_b, loss]


def parameters(w_sharding=None):
    return (
        Value(DeviceData(f32(IN, OUT), handle="W", sharding=w_sharding)),
        Value(DeviceData(f32(OUT), handle="b")),
    )


def batch(step):
    return (
        Value(DeviceData(f32(BATCH, IN), handle=f"x[{step}]")),
        Value(DeviceData(f32(BATCH, OUT), handle=f"y[{step}]")),
    )


def main():
    w, b = parameters()
    hashes = []
    for step in range(3):
        roots = sgd_step(*batch(step), w, b)
        hashes.append(graph_hash(roots))
        w, b = roots[0], roots[1]  # the next step reads this step's results
        print(f"step {step}: {len(post_order(roots))} nodes, graph_hash {hashes[-1]:032x}")
    # Every step after the first reads the previous step's graph, so only fresh leaves compare:
    fresh = [graph_hash(sgd_step(*batch(s), *parameters())) for s in range(3)]
    assert len(set(fresh)) == 1, "same step over new data must hash the same"
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    w_spec = ShardingSpec(mesh, (None, "model"))
    sharded = graph_hash(sgd_step(*batch(0), *parameters(w_spec)))
    assert sharded != fresh[0]
    # Annotate the step already recorded: W's node is cloned with the spec, and every consumer
    # is relinked to the clone.
    recorded = sgd_step(*batch(0), *parameters())
    w_node = next(n for n in post_order(recorded) if n.op == "device_data" and n.handle == "W")
    annotated = relink(recorded, {w_node: with_sharding(Value(w_node), w_spec).node})
    assert graph_hash(annotated) == sharded
    print(f"one step over new data: graph_hash {fresh[0]:032x} every time (one compile)")
    print(f"the same step with W sharded:  {sharded:032x} (compiles once more)")
    print(f"W annotated after recording:   {graph_hash(annotated):032x} (the same program)\n")
    print(f"W {w_spec.partition_spec} over {mesh}: {w_spec.to_hlo_text()}")
    print(w_spec.visualize((IN, OUT)), end="\n\n")
    print(dump_text(annotated))


if __name__ == "__main__":
    main()
