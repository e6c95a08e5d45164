"""Uneven shardings: a split dim that is not a multiple of its number of blocks, as XLA and
torch_xla take them (the last blocks are shorter, or empty).

jax holds an array only in even blocks, so the engine holds such data evenly
(``ShardingSpec.evenly``: each uneven dim whole, its axes replicating it) and keeps the user's
annotation; a program constrains the annotated value to the uneven spec and XLA computes its
blocks, padded. Oracles: torch eager for values and gradients, jax for where data lives, XLA's
own HLO printer for the sharding a compiled program carries."""

import copy

import jax
import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_runtime._frontend import inspect
from ir_sharding import Mesh, ShardingSpec

MESH = Mesh(range(8), (4, 2), ("data", "model"))
SPEC = ("data", "model")  # a (6, 5) tensor: 6 rows in 4 blocks, 5 columns in 2: both uneven


def _held_as(array, spec) -> bool:
    """Whether the jax ``array`` is placed as ``spec`` says (jax's own comparison)."""
    assert isinstance(array, jax.Array)
    return array.sharding.is_equivalent_to(spec.to_jax(), array.ndim)


@pytest.mark.parametrize("kind", ["data", "pending"])
def test_an_uneven_spec_is_annotated_and_its_data_held_evenly(kind):
    x = torch.randn(6, 5)
    t = irt.to_lazy(x)
    if kind == "pending":
        t = t * 2
        x = x * 2
    spec = ShardingSpec(MESH, SPEC)
    irt.mark_sharding(t, MESH, SPEC)
    assert inspect.annotation_of(t) == spec
    irt.mark_step()
    assert torch.equal(irt.to_torch(t), x)
    assert spec.evenly((6, 5)) == ShardingSpec.replicated(MESH)
    assert _held_as(inspect.data_of(t), ShardingSpec.replicated(MESH))
    w = irt.to_lazy(torch.randn(6, 8))
    irt.mark_sharding(w, MESH, ("data", "model"))  # rows uneven, columns even: split
    assert _held_as(inspect.data_of(w), ShardingSpec(MESH, (None, "model")))


def test_a_program_computes_the_uneven_blocks_as_xla_prints_them():
    x, w = torch.randn(6, 5), torch.randn(5, 7)
    y = torch.relu(irt.to_lazy(x) @ irt.to_lazy(w))
    irt.mark_sharding(y, MESH, SPEC)
    z = y.sum(0)
    irt.mark_step()
    torch.testing.assert_close(irt.to_torch(y), torch.relu(x @ w))
    torch.testing.assert_close(irt.to_torch(z), torch.relu(x @ w).sum(0))
    # XLA partitioned the program: each device computes a padded block of ceil(6 / 4) rows
    # and ceil(7 / 2) columns
    assert "f32[2,4]" in inspect.last_executable().compiled.as_text()
    # the result leaves the program as the data is held: even
    assert _held_as(inspect.data_of(y), ShardingSpec(MESH, SPEC).evenly((6, 7)))


def test_training_with_uneven_parameters_matches_eager_and_settles():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model = irt.to_lazy(copy.deepcopy(eager))
    lazy = dict(model.named_parameters())
    for p in lazy.values():  # weights (7, 5), (3, 7); biases (7,), (3,): all uneven
        irt.mark_sharding(p, MESH, ("data", "model") if p.dim() == 2 else ("data",))
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_l = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [(torch.randn(6, 5), torch.randn(6, 3)) for _ in range(5)]
    counts = []
    for x, y in data:
        loss_e = torch.nn.functional.mse_loss(eager(x), y)
        loss_e.backward()
        opt_e.step()
        opt_e.zero_grad()
        lx, ly = irt.to_lazy(x), irt.to_lazy(y)
        irt.mark_sharding(lx, MESH, ("data", None))  # a batch of 6 over 4 blocks
        irt.mark_sharding(ly, MESH, ("data", None))
        loss_l = torch.nn.functional.mse_loss(model(lx), ly)
        loss_l.backward()
        opt_l.step()
        opt_l.zero_grad()
        irt.mark_step()
        torch.testing.assert_close(irt.to_torch(loss_l), loss_e, rtol=1e-5, atol=1e-6)
        counters = irt.metrics()["counters"]
        counts.append((counters["CompileCount"], counters["Reshard"]))
    for name, p in eager.named_parameters():
        torch.testing.assert_close(irt.to_torch(lazy[name]), p.detach(), rtol=1e-5, atol=1e-6)
        assert inspect.annotation_of(lazy[name]).mesh == MESH
    # From the third step on, no new program and no data moved between placements.
    assert counts[2] == counts[-1], counts


def test_a_smaller_last_batch_is_placed_by_the_loader():
    batches = [(torch.randn(8, 2),), (torch.randn(6, 2),)]
    got = [x for (x,) in irt.ShardedLoader(batches, MESH, ("data", None))]
    for (want,), x in zip(batches, got, strict=True):
        assert torch.equal(irt.to_torch(x), want)
        assert inspect.annotation_of(x) == ShardingSpec(MESH, ("data", None))
    assert _held_as(inspect.data_of(got[1]), ShardingSpec.replicated(MESH))


def test_every_placement_takes_an_uneven_spec_in_one_process():
    spec = ShardingSpec(MESH, ("data", None))
    a = np.arange(12.0, dtype=np.float32).reshape(6, 2)
    data = irt.to_device(a, spec)
    assert _held_as(data.handle, ShardingSpec.replicated(MESH))
    np.testing.assert_array_equal(np.asarray(data.handle), a)
    t = irt.from_process_local(torch.from_numpy(a), MESH, ("data", None))
    assert inspect.annotation_of(t) == spec and torch.equal(irt.to_torch(t), torch.from_numpy(a))
    y = irt.execute([inspect.value_of(t * 2)], out_shardings=[spec])
    np.testing.assert_array_equal(np.asarray(y[0].handle), a * 2)
    assert _held_as(y[0].handle, ShardingSpec.replicated(MESH))


def test_gradients_of_an_uneven_annotation_match_eager():
    x = torch.randn(6, 5, requires_grad=True)
    leaf = irt.to_lazy(x.detach()).requires_grad_()
    irt.mark_sharding_with_gradients(leaf, MESH, SPEC)
    (leaf.sin() * 3).sum().backward()
    (x.sin() * 3).sum().backward()
    torch.testing.assert_close(irt.to_torch(leaf.grad), x.grad)
