"""PyTorch's parallelism vocabulary on lazy tensors: ``ir_runtime.device_mesh`` (torch's own
``DeviceMesh``), placements, and torch's ``distribute_tensor`` / ``distribute_module`` /
``parallelize_module`` / ``fully_shard`` reaching this project for its meshes. Oracles: torch
eager (values and gradients), jax's own sharding of the same partition spec (which device holds
which block), and torch's own functions for anything else."""

import copy
import inspect
import pickle
import warnings

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import (
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

import ir_runtime as irt
from ir_runtime import DistributedError
from ir_sharding import ShardingError


@pytest.fixture(scope="module")
def mesh():
    return irt.device_mesh((2, 4), ("dp", "tp"))


def _jax_blocks(t, mesh, *entries):
    """Which block of ``t`` each device holds, as jax places the same partition spec."""
    jmesh = jax.sharding.Mesh(
        np.array(jax.devices())[np.asarray(mesh.mesh).reshape(-1)].reshape(mesh.shape),
        mesh.mesh_dim_names,
    )
    want = NamedSharding(jmesh, JP(*entries)).devices_indices_map(tuple(t.shape))
    return {d.id: idx for d, idx in want.items()}


def _held_blocks(t):
    array = t._ir.node.handle
    return {d.id: idx for d, idx in array.sharding.devices_indices_map(array.shape).items()}


def _norm(blocks, shape):
    return {
        d: tuple(s.indices(n)[:2] for s, n in zip(idx, shape, strict=True))
        for d, idx in blocks.items()
    }


# -- the mesh ---------------------------------------------------------------------------------


def test_device_mesh_is_torch_s_device_mesh_with_device_ids_for_ranks(mesh):
    assert isinstance(mesh, DeviceMesh) and mesh.device_type == "lazy"
    assert mesh.mesh.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (mesh.size(), mesh.shape, mesh.ndim, mesh.mesh_dim_names) == (8, (2, 4), 2, ("dp", "tp"))
    assert mesh.get_rank() == 0 and mesh.get_coordinate() == (0, 0)
    assert (mesh.get_local_rank("dp"), mesh.get_local_rank(1)) == (0, 0)
    tp, dp = mesh["tp"], mesh["dp"]
    assert tp.mesh.tolist() == [0, 1, 2, 3] and dp.mesh.tolist() == [0, 4]
    assert tp.get_local_rank() == 0 and dp.size() == 2
    assert tp._get_root_mesh() is mesh and mesh["dp", "tp"] is mesh
    with pytest.raises(KeyError, match="ascending order"):  # torch's own rule
        mesh["tp", "dp"]
    flat = mesh._flatten("all")
    assert flat.mesh.tolist() == list(range(8)) and flat.mesh_dim_names == ("all",)
    assert pickle.loads(pickle.dumps(tp)) == tp
    with mesh:
        from torch.distributed.device_mesh import _mesh_resources

        assert _mesh_resources.get_current_mesh() is mesh


def test_a_mesh_has_no_process_groups_and_says_so(mesh):
    with pytest.raises(DistributedError, match="has no process groups"):
        mesh["tp"].get_group()
    with pytest.raises(DistributedError, match="needs mesh_dim"):
        mesh.get_local_rank()
    assert not torch.distributed.is_initialized()  # no default group was made for it


def test_a_mesh_that_does_not_cover_the_devices_is_refused():
    with pytest.raises(ShardingError, match=r"mesh_shape \(2, 2\) holds 4 devices, but it must"):
        irt.device_mesh((2, 2), ("a", "b"))
    with pytest.raises(ShardingError, match="unique"):
        irt.device_mesh((2, 4), ("a", "a"))
    small = irt.device_mesh((2,), ("x",), devices=[2, 5])
    assert small.mesh.tolist() == [2, 5] and small.get_rank() == 2


# -- placements ----------------------------------------------------------------------------------


PLACEMENTS = [
    ([Shard(0), Shard(1)], ("dp", "tp")),
    ([Shard(-1), Shard(0)], ("tp", "dp")),
    ([Shard(0), Shard(0)], (("dp", "tp"), None)),
    ([Shard(1), Shard(1)], (None, ("dp", "tp"))),
    ([Replicate(), Shard(-2)], ("tp", None)),
    ([Shard(1), Replicate()], (None, "dp")),
    ([Replicate(), Replicate()], (None, None)),
]


@pytest.mark.parametrize("placements, entries", PLACEMENTS, ids=str)
def test_distribute_tensor_places_blocks_where_jax_places_the_same_spec(mesh, placements, entries):
    t = torch.randn(16, 8)
    d = distribute_tensor(t, mesh, placements)
    assert isinstance(d, irt.LazyTensor) and d.device_mesh is mesh
    assert d.placements == tuple(
        Shard(p.dim % 2) if isinstance(p, Shard) else p for p in placements
    )
    assert _norm(_held_blocks(d), t.shape) == _norm(_jax_blocks(t, mesh, *entries), t.shape)
    torch.testing.assert_close(d.full_tensor().cpu(), t, rtol=0, atol=0)
    torch.testing.assert_close(d.cpu(), t, rtol=0, atol=0)


def test_distribute_tensor_of_a_lazy_tensor_leaves_the_source_as_it_was(mesh):
    src = irt.to_lazy(torch.arange(32.0).reshape(8, 4))
    before = src._ir.node.handle.sharding
    d = distribute_tensor(src, mesh, [Shard(0), Replicate()])
    assert src._ir.node.handle.sharding == before and src.placements == ()
    assert d.placements == (Shard(0), Replicate())
    assert torch.equal(d.cpu(), src.cpu())


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_a_partial_reads_and_redistributes_to_eager_s_value(mesh, op):
    t = torch.randn(8, 4)
    d = distribute_tensor(t, mesh, [Replicate(), Partial(op)])
    assert d.placements == (Replicate(), Partial(op))
    assert torch.equal(d.cpu(), t) and torch.equal(d.full_tensor().cpu(), t)
    r = d.redistribute(mesh, [Shard(0), Replicate()])
    assert r.placements == (Shard(0), Replicate()) and torch.equal(r.cpu(), t)
    assert torch.equal(d.to_local().cpu(), t)  # one process: its devices hold the whole value


def test_redistribute_places_the_value_and_sends_the_gradient_back(mesh):
    t = torch.randn(8, 16)
    d = distribute_tensor(t, mesh, [Shard(0), Shard(1)]).requires_grad_()
    r = d.redistribute(placements=[Replicate(), Shard(0)], forward_dtype=torch.float64)
    assert r.placements == (Replicate(), Shard(0)) and r.dtype == torch.float64
    (r * r).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), 2 * t)
    assert d.grad.dtype == torch.float32 and d.grad.placements == (Shard(0), Shard(1))


def test_placements_of_results_are_those_xla_chose(mesh):
    x = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Shard(1)])
    y = (x * 2).sum(0)  # pending, unannotated: read back from the program that computes it
    assert y.placements == (Replicate(), Shard(0))
    assert y.device_mesh is mesh
    assert irt.to_lazy(torch.ones(3)).placements == ()  # one device


def test_a_placement_over_part_of_an_axis_is_described_by_the_finest_that_contains_it(mesh):
    """Dim 0 in 2 blocks over devices {0,1,4,5} and {2,3,6,7}: half of the tp axis, which no
    placement on (dp, tp) says. The description replicates (every device 'holds' all of it)."""
    t = irt.to_lazy(torch.randn(8, 4))
    cube = irt.Mesh(range(8), (2, 2, 2), ("a", "b", "c"))
    irt.mark_sharding(t, cube, ("b", None))
    assert t.placements == (Replicate(), Replicate())
    irt.mark_sharding(t, cube, (("a", "b", "c"), None))  # all 8 in mesh order: exact
    assert t.placements == (Shard(0), Shard(0))


def test_bad_placements_are_refused_naming_them(mesh):
    t = torch.randn(6, 4)
    with pytest.raises(ShardingError, match=r"1 placement\(s\) .* for a mesh of 2 dim"):
        distribute_tensor(t, mesh, [Shard(0)])
    with pytest.raises(ShardingError, match=r"names dim 2 of a tensor with 2 dim"):
        distribute_tensor(t, mesh, [Shard(2), Replicate()])
    with pytest.raises(ShardingError, match=r"6"):  # 6 rows in 4 blocks
        distribute_tensor(t, mesh, [Replicate(), Shard(0)])
    with pytest.raises(ShardingError, match="Partial's op"):
        distribute_tensor(t, mesh, [Replicate(), Partial("prod")])
    with pytest.raises(ShardingError, match="leaf"):
        distribute_tensor(torch.randn(4, 4, requires_grad=True) * 2, mesh)


def test_torch_s_functions_keep_their_identity_and_run_torch_s_code_for_other_meshes(mesh):
    import torch.distributed.tensor as dt

    assert dt.distribute_tensor is distribute_tensor
    params = list(inspect.signature(distribute_tensor).parameters)
    assert params == ["tensor", "device_mesh", "placements", "src_data_rank"]
    assert "mesh" in inspect.signature(fully_shard).parameters
    with pytest.raises(RuntimeError, match="No device mesh is currently active"):
        distribute_tensor(torch.ones(2))  # torch's own code, torch's own error


# -- modules ---------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d=16, h=32):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def _pair(seed=0, cls=MLP):
    torch.manual_seed(seed)
    eager = cls()
    return eager, irt.to_lazy(copy.deepcopy(eager))


def _assert_same_training(eager, lazy, x, loss_fn=lambda y: (y * y).mean(), steps=3):
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, lazy)]
    for _ in range(steps):
        for m, opt, inp in zip((eager, lazy), opts, (x, irt.to_lazy(x)), strict=True):
            loss = loss_fn(m(inp))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if m is eager:
                want = loss.detach()
            else:
                irt.mark_step()
                torch.testing.assert_close(loss.cpu(), want, rtol=1e-5, atol=1e-6)
    for (n, p), q in zip(eager.named_parameters(), lazy.parameters(), strict=True):
        torch.testing.assert_close(q.cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=n)


def test_colwise_and_rowwise_shard_a_megatron_mlp_with_eager_s_training(mesh):
    eager, lazy = _pair()
    parallelize_module(
        lazy,
        mesh["tp"],
        {"up": ColwiseParallel(), "down": RowwiseParallel(), "norm": SequenceParallel()},
    )
    assert lazy.up.weight.placements == (Shard(0),) and lazy.up.bias.placements == (Shard(0),)
    assert lazy.down.weight.placements == (Shard(1),) and lazy.down.bias.placements == (
        Replicate(),
    )
    assert lazy.up.weight.device_mesh == mesh["tp"]
    _assert_same_training(eager, lazy, torch.randn(8, 4, 16))


def test_rowwise_output_shard_1_embeddings_and_prepare_module_input_output(mesh):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.col = nn.Embedding(32, 16)
            self.mlp = MLP()
            self.head = nn.Linear(16, 32, bias=False)

        def forward(self, ids):
            h = self.emb(ids) + self.col(ids)
            return self.head(self.mlp(h))

    eager, lazy = _pair(cls=Net)
    tp = mesh["tp"]
    parallelize_module(
        lazy,
        tp,
        {
            "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "col": ColwiseParallel(output_layouts=Shard(1)),
            "mlp": PrepareModuleInputOutput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                output_layouts=(Replicate(),),
                desired_output_layouts=(Shard(1),),
            ),
            "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
            "head": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
        },
    )
    parallelize_module(
        lazy.head,
        tp,
        PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(-1)),
    )
    assert lazy.emb.weight.placements == (Shard(0),) and lazy.col.weight.placements == (Shard(1),)
    ids = torch.randint(0, 32, (4, 8))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, lazy)]
    for _ in range(2):
        want = F.cross_entropy(eager(ids).flatten(0, 1), ids.flatten())
        got = F.cross_entropy(lazy(irt.to_lazy(ids)).flatten(0, 1), irt.to_lazy(ids).flatten())
        for loss, opt in ((want, opts[0]), (got, opts[1])):
            loss.backward()
            opt.step()
            opt.zero_grad()
        irt.mark_step()
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        lazy.emb.weight.cpu(), eager.emb.weight.detach(), rtol=1e-5, atol=1e-6
    )


def test_loss_parallel_on_vocabulary_sharded_logits_is_eager_s_loss(mesh):
    eager, lazy = _pair()
    parallelize_module(lazy, mesh["tp"], {"down": ColwiseParallel(use_local_output=False)})
    x, y = torch.randn(8, 16), torch.randint(0, 16, (8,))
    want = F.cross_entropy(eager(x), y)
    want.backward()
    with loss_parallel():
        got = F.cross_entropy(lazy(irt.to_lazy(x)), irt.to_lazy(y))
        got.backward()
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        lazy.up.weight.grad.cpu(), eager.up.weight.grad, rtol=1e-4, atol=1e-6
    )


def test_a_plan_is_checked_whole_before_anything_changes(mesh):
    _, lazy = _pair()
    before = {n: p._spec for n, p in lazy.named_parameters()}
    with pytest.raises(
        ShardingError, match=r"plan key 'nothing.here' names no submodule .* 'nothing'"
    ):
        parallelize_module(
            lazy, mesh["tp"], {"up": ColwiseParallel(), "nothing.here": ColwiseParallel()}
        )
    with pytest.raises(ShardingError, match="ColwiseParallel on norm: a LayerNorm"):
        parallelize_module(lazy, mesh["tp"], {"up": ColwiseParallel(), "norm": ColwiseParallel()})
    with pytest.raises(ShardingError, match="takes a 1-d mesh"):
        parallelize_module(lazy, mesh, {"up": ColwiseParallel()})
    odd = nn.Linear(16, 6)  # 6 rows in 4 blocks
    with pytest.raises(ShardingError, match=r"weight \(6, 16\)"):
        parallelize_module(odd, mesh["tp"], ColwiseParallel())
    assert {n: p._spec for n, p in lazy.named_parameters()} == before
    assert not lazy.up._forward_pre_hooks


def test_distribute_module_runs_the_partition_function_and_replicates_the_rest(mesh):
    eager, lazy = _pair()

    def partition(name, module, device_mesh):
        if name == "up":
            for key, p in list(module.named_parameters()):
                module.register_parameter(
                    key, nn.Parameter(distribute_tensor(p, device_mesh, [Replicate(), Shard(0)]))
                )

    seen = []
    distribute_module(
        lazy, mesh, partition, input_fn=lambda m, inputs, dm: seen.append(dm) or inputs
    )
    assert lazy.up.weight.placements == (Replicate(), Shard(0))
    assert lazy.down.weight.placements == (Replicate(), Replicate())
    _assert_same_training(eager, lazy, torch.randn(8, 16), steps=2)
    assert seen and seen[0] is mesh


def test_fully_shard_shards_parameters_on_dim_0_beside_tensor_parallelism(mesh):
    eager, lazy = _pair()
    parallelize_module(lazy, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(lazy.up, mesh=mesh["dp"])
    fully_shard(lazy, mesh=mesh["dp"], reshard_after_forward=False)
    assert lazy.up.weight._spec.partition_spec == (("dp", "tp"), None)
    assert lazy.down.weight._spec.partition_spec == ("dp", "tp")
    assert lazy.norm.weight.placements == (Shard(0),)
    assert type(lazy).__name__ == "FSDPMLP" and lazy.reshard() is None
    _assert_same_training(eager, lazy, torch.randn(8, 16))
    assert lazy.up.weight.grad is None
    with pytest.raises(ShardingError, match="already fully sharded"):
        fully_shard(lazy, mesh=mesh["dp"])
    with pytest.raises(ShardingError, match="ModuleList"):
        fully_shard(nn.ModuleList([nn.Linear(2, 2)]), mesh=mesh["dp"])


def test_fully_shard_mixed_precision_computes_in_bfloat16_with_float32_gradients(mesh):
    """Oracle: the eager model run on bfloat16 copies of its parameters
    (``functional_call``), its gradients flowing back to the float32 ones."""
    eager, lazy = _pair()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(lazy, mesh=mesh["dp"], mp_policy=policy)
    x = torch.randn(8, 16)
    params = dict(eager.named_parameters())
    cast = {n: p.to(torch.bfloat16) for n, p in params.items()}
    want = torch.func.functional_call(eager, cast, (x.to(torch.bfloat16),))
    want.float().pow(2).mean().backward()
    got = lazy(irt.to_lazy(x))
    assert got.dtype == torch.bfloat16 and lazy.up.weight.dtype == torch.float32
    got.float().pow(2).mean().backward()
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=0, atol=0)
    for n, p in lazy.named_parameters():
        assert p.grad.dtype == torch.float32
        # (computed in bfloat16 by both: torch's tolerance for bfloat16, one or two roundings)
        torch.testing.assert_close(p.grad.cpu(), params[n].grad, rtol=1.6e-2, atol=1e-4, msg=n)


def test_bad_fully_shard_arguments_are_refused_before_anything_changes(mesh):
    _, lazy = _pair()
    lazy.down = irt.to_lazy(nn.Linear(32, 15))  # 15 rows in 2 blocks
    before = {n: p._spec for n, p in lazy.named_parameters()}
    with pytest.raises(ShardingError, match=r"down.weight|weight \(15, 32\)"):
        fully_shard(lazy, mesh=mesh["dp"])
    assert {n: p._spec for n, p in lazy.named_parameters()} == before
    assert type(lazy) is MLP


def test_a_compiled_step_retraces_once_for_a_changed_placement(mesh):
    _, lazy = _pair()
    parallelize_module(lazy, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1)

    def step(model, x):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    compiled = irt.compile_step(step)
    for _ in range(4):
        compiled(lazy, distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Replicate()]))
    assert compiled.replaying
    irt.reset_metrics()
    for _ in range(4):
        compiled(lazy, distribute_tensor(torch.randn(8, 16), mesh, [Replicate(), Shard(0)]))
    c = irt.metrics()["counters"]
    assert c.get("StepGuardFailed", 0) == 1 and c["CompileCount"] == 1
    assert "placed" in compiled.last_guard_failure
    assert compiled.replaying


def test_dcp_refuses_lazy_tensors_across_processes(mesh, monkeypatch):
    import torch.distributed.checkpoint as dcp

    from ir_runtime import _distributed

    monkeypatch.setattr(_distributed, "process_count", lambda: 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DistributedError, match="across 2 processes"):
            dcp.save(
                {"w": distribute_tensor(torch.ones(8), mesh, [Shard(0), Replicate()])},
                checkpoint_id="/nonexistent",
            )


def test_from_local_in_one_process_places_the_whole_tensor_and_passes_gradients(mesh):
    from torch.distributed.tensor import DTensor

    x = irt.to_lazy(torch.randn(8, 4)).requires_grad_()
    d = DTensor.from_local(x, mesh, [Shard(0), Replicate()])
    assert isinstance(d, irt.LazyTensor) and d.placements == (Shard(0), Replicate())
    (d * 3).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((8, 4), 3.0))
    with pytest.raises(ShardingError, match="the local tensor is the whole one"):
        DTensor.from_local(x, mesh, [Shard(0), Replicate()], shape=(16, 4))


def test_prepare_module_input_places_keyword_inputs(mesh):
    class Scaled(nn.Module):
        def forward(self, x, *, scale=None):
            return x * scale

    module = Scaled()
    parallelize_module(
        module,
        mesh["tp"],
        PrepareModuleInput(
            input_layouts=(Shard(0),),
            desired_input_layouts=(Replicate(),),
            input_kwarg_layouts={"scale": Replicate()},
            desired_input_kwarg_layouts={"scale": Shard(1)},
        ),
    )
    seen = {}  # (what the forward gets: this hook runs after the plan's)
    module.register_forward_pre_hook(
        lambda m, args, kwargs: seen.update(x=args[0], scale=kwargs["scale"]), with_kwargs=True
    )
    x, scale = torch.randn(8, 4), torch.randn(8, 4)
    out = module(irt.to_lazy(x), scale=irt.to_lazy(scale))
    torch.testing.assert_close(out.cpu(), x * scale)
    assert seen["x"].placements == (Replicate(),) and seen["scale"].placements == (Shard(1),)


def test_a_subclass_of_a_torch_style_that_overrides_its_hooks_is_refused_by_name(mesh):
    """Its ``_prepare_*_fn`` run per rank on shards (torchao's float8 styles cast there):
    refused, naming them, rather than silently read as its base; a subclass that overrides
    nothing of its base's is its base."""

    class Halved(ColwiseParallel):
        @staticmethod
        def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
            return outputs * 0.5

    class Named(ColwiseParallel):
        def __init__(self):
            super().__init__(output_layouts=Replicate())

    eager, lazy = _pair()
    with pytest.raises(ShardingError, match=r"Halved on up overrides \['_prepare_output_fn'\]"):
        parallelize_module(lazy, mesh["tp"], {"up": Halved()})
    assert lazy.up.weight._spec is None
    parallelize_module(lazy, mesh["tp"], {"up": Named()})
    assert lazy.up.weight.placements == (Shard(0),)
    x = torch.randn(8, 16)
    torch.testing.assert_close(lazy(irt.to_lazy(x)).cpu(), eager(x).detach(), rtol=1e-5, atol=1e-6)


def test_mixed_precision_recompute_under_reentrant_checkpointing_uses_the_forward_s_dtype(mesh):
    import torch.utils.checkpoint as checkpoint

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))

        def forward(self, x, ckpt=False):
            for layer in self.layers:
                x = checkpoint.checkpoint(layer, x, use_reentrant=True) if ckpt else layer(x)
            return x

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    torch.manual_seed(0)
    models = [irt.to_lazy(Stack()) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    x = torch.randn(8, 16, requires_grad=True)
    grads = []
    for model, ckpt in zip(models, (False, True), strict=True):
        fully_shard(model, mesh=mesh["dp"], mp_policy=policy)
        model(irt.to_lazy(x).requires_grad_(), ckpt=ckpt).float().pow(2).sum().backward()
        grads.append([p.grad.cpu() for p in model.parameters()])
        assert all(p.dtype == torch.float32 and p.is_leaf for p in model.parameters())
    for want, got in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_an_interrupted_forward_leaves_the_parameters_as_they_were(mesh):
    _, lazy = _pair()
    fully_shard(lazy, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    lazy.up.register_forward_hook(lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        lazy(irt.to_lazy(torch.randn(4, 16)))
    assert lazy.up.weight.dtype == torch.bfloat16  # (a KeyboardInterrupt skips always_call)
    lazy.up._forward_hooks.popitem()
    lazy(irt.to_lazy(torch.randn(4, 16)))  # the next forward restores what was left
    assert all(p.dtype == torch.float32 and p.is_leaf for p in lazy.parameters())


def test_a_user_annotation_replaces_a_placement_s_open_constraint(mesh):
    x = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Replicate()])
    y = (x * 2).redistribute(mesh["tp"], [Shard(0)])  # (dim 0 on tp: dp has no dim)
    assert y._ir.node.attrs.get("open")
    irt.mark_sharding(y, mesh._ir_mesh, ("dp", "tp"))
    assert not y._ir.node.attrs.get("open") and "{?}" not in irt.dump([y], "stablehlo")
    irt.clear_sharding(y)
    irt.check_graph([y._ir])
    assert torch.equal(y.cpu(), x.cpu() * 2)


def test_distribute_tensor_of_a_pending_tensor_leaves_it_unannotated(mesh):
    b = irt.to_lazy(torch.randn(8, 4)) * 2
    d = distribute_tensor(b, mesh, [Shard(0), Replicate()])
    assert b._ir.node.sharding is None and d.is_leaf and d.placements == (Shard(0), Replicate())
    assert torch.equal(d.cpu(), b.cpu())


def test_parameters_a_partition_function_wraps_keep_their_placement_and_its_gradient(mesh):
    _, lazy = _pair()

    def partition(name, module, device_mesh):
        if name == "up":
            w = distribute_tensor(module.weight, device_mesh, [Shard(0)])
            module.register_parameter("weight", nn.Parameter(w))

    distribute_module(lazy, mesh["tp"], partition)
    w = lazy.up.weight
    assert w._spec is not None and w.placements == (Shard(0),) and w.device_mesh == mesh["tp"]
    lazy(irt.to_lazy(torch.randn(4, 16))).sum().backward()
    assert w.grad._ir.node.sharding == w._spec  # (the gradient's constraint)


def test_a_plan_that_fails_late_changes_nothing_even_beside_fsdp(mesh):
    m = irt.to_lazy(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 12)))
    fully_shard(m, mesh=mesh["dp"])
    before = [p._spec for p in m.parameters()]
    with pytest.raises(ShardingError, match="12"):  # 12 rows over dp x tp: 8 blocks
        parallelize_module(m, mesh["tp"], {"0": ColwiseParallel(), "1": ColwiseParallel()})
    assert [p._spec for p in m.parameters()] == before and not m[0]._forward_pre_hooks


def test_reading_placements_inside_a_compiled_step_keeps_it_replaying(mesh):
    _, lazy = _pair()
    parallelize_module(lazy, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})

    def step(x):
        h = torch.relu(lazy(x)) * 2
        return h.to_local().sum() + h.full_tensor().mean()

    compiled = irt.compile_step(step)
    irt.reset_metrics()
    for _ in range(5):
        compiled(distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Replicate()]))
    assert compiled.replaying, compiled.reason
    assert irt.metrics()["counters"]["ExecuteCount"] == 5
