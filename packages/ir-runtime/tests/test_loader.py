"""ShardedLoader: batches placed over the mesh by a background thread, against the same
batches placed by hand (to_lazy + mark_sharding) and against the host values."""

import collections
import threading

import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_runtime._frontend import inspect
from ir_sharding import ShardingError, ShardingSpec

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
Pair = collections.namedtuple("Pair", "x y")


def batches(n, rows=8):
    torch.manual_seed(0)
    return [(torch.randn(rows, 6), torch.randint(0, 3, (rows,))) for _ in range(n)]


def placed_as(t, spec):
    return inspect.data_of(t).sharding.is_equivalent_to(spec.to_jax(), t.dim())


def test_batches_come_placed_with_their_values_and_structure():
    data = batches(4)
    spec = ShardingSpec(MESH, ("data", None))
    got = list(irt.ShardedLoader(data, MESH, ("data", None)))
    assert len(got) == 4
    for (x, y), (hx, hy) in zip(got, data, strict=True):
        assert isinstance(x, irt.LazyTensor) and inspect.data_of(x) is not None
        assert torch.equal(irt.to_torch(x), hx) and torch.equal(irt.to_torch(y), hy)
        assert placed_as(x, spec)
        assert placed_as(y, ShardingSpec(MESH, ("data",)))  # its leading dim only
        assert inspect.annotation_of(x) == spec


def test_dict_batches_take_a_spec_per_key_and_other_values_pass_through():
    torch.manual_seed(0)
    data = [
        {"ids": torch.randint(0, 9, (8, 4)), "mask": torch.ones(8, 4), "meta": Pair("a", 3)}
        for _ in range(2)
    ]
    loader = irt.ShardedLoader(data, MESH, {"ids": ("data", "model")})
    for got, want in zip(loader, data, strict=True):
        assert got["meta"] == Pair("a", 3)
        assert placed_as(got["ids"], ShardingSpec(MESH, ("data", "model")))
        assert placed_as(got["mask"], ShardingSpec.replicated(MESH))  # a key left out
        assert torch.equal(irt.to_torch(got["ids"]), want["ids"])


def test_training_through_the_loader_matches_batches_placed_by_hand():
    data = batches(5)

    def train(loader_batches):
        torch.manual_seed(1)
        model = irt.to_lazy(torch.nn.Linear(6, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        irt.reset_metrics()
        for x, y in loader_batches:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            irt.mark_step()
            losses.append(loss)
        return [float(irt.to_torch(v)) for v in losses], irt.metrics()["counters"]

    def by_hand():
        for x, y in data:
            x, y = irt.to_lazy(x), irt.to_lazy(y)
            irt.mark_sharding(x, MESH, ("data", None))
            irt.mark_sharding(y, MESH, ("data",))
            yield x, y

    want, _ = train(by_hand())
    got, counters = train(irt.ShardedLoader(data, MESH, ("data", None)))
    assert got == want
    # The very programs the hand-placed batches compiled: every step a cache hit.
    assert (counters["CompileCount"], counters["CacheHit"]) == (0, 5)


def test_the_next_batch_is_placed_while_the_current_one_is_used():
    asked = [threading.Event() for _ in range(3)]

    def source():
        for k, b in enumerate(batches(3)):
            asked[k].set()
            yield b

    it = iter(irt.ShardedLoader(source(), MESH, ("data", None), prefetch=1))
    next(it)
    # The consumer has not asked for batch 1, yet the thread has already taken it (a generous
    # hang guard, not a timing: the thread runs as soon as the consumer waits).
    assert asked[1].wait(timeout=60)
    assert len(list(it)) == 2


def test_errors_name_the_tensor_and_the_rule_and_stop_the_thread():
    with pytest.raises(TypeError, match="takes an ir_sharding Mesh"):
        irt.ShardedLoader([], "mesh", ("data",))
    with pytest.raises(ValueError, match="prefetch must be a positive int, got 0"):
        irt.ShardedLoader([], MESH, ("data",), prefetch=0)
    odd = [(torch.randn(6, 2),)]  # 6 rows over 4 devices of "data"
    with pytest.raises(ShardingError, match=r"\(6, 2\)"):
        list(irt.ShardedLoader(odd, MESH, ("data", None)))
    with pytest.raises(ShardingError, match="has 1 dims but its partition spec"):
        list(irt.ShardedLoader([(torch.randn(8),)], MESH, (None, "model")))

    def broken():
        yield batches(1)[0]
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(irt.ShardedLoader(broken(), MESH, ("data", None)))


def test_leaving_the_loop_early_stops_the_loading_thread():
    def endless():
        while True:
            yield batches(1)[0]

    for _ in irt.ShardedLoader(endless(), MESH, ("data", None)):
        break
    loaders = [t for t in threading.enumerate() if t.name == "ir_runtime-loader"]
    for t in loaders:
        t.join(timeout=60)  # a generous hang guard: it stops at its next batch
    assert not any(t.is_alive() for t in loaders)


def test_a_second_loader_over_the_same_stream_takes_up_where_the_first_stopped():
    """Leaving the loop stops the first loader's thread before the next loader starts: the
    source generator is never read by two threads at once."""
    stream = iter(batches(6))
    first = irt.ShardedLoader(stream, MESH, ("data", None), prefetch=1)
    for _ in first:
        break
    rest = list(irt.ShardedLoader(stream, MESH, ("data", None)))
    assert 1 <= len(rest) <= 5  # the first loader may have taken one batch ahead


def test_mapping_batches_that_are_not_dicts_are_placed():
    """Hugging Face tokenizers return a BatchEncoding, a UserDict: its tensors are placed too."""
    import collections as c

    class Encoding(c.UserDict):
        pass

    data = [Encoding({"input_ids": torch.randint(0, 9, (8, 4))})]
    (got,) = list(irt.ShardedLoader(data, MESH, ("data", None)))
    assert isinstance(got, Encoding)
    assert placed_as(got["input_ids"], ShardingSpec(MESH, ("data", None)))
    (plain,) = list(irt.ShardedLoader([c.defaultdict(int, x=torch.ones(8))], MESH, ("data",)))
    assert placed_as(plain["x"], ShardingSpec(MESH, ("data",)))
