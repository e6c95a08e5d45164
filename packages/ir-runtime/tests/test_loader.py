"""ShardedLoader: batches placed over the mesh ahead of their use, against the same batches
placed by hand (to_lazy + mark_sharding) and against the host values."""

import collections
import gc

import jax
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


@pytest.mark.parametrize("prefetch", [1, 3])
def test_batches_are_placed_prefetch_ahead_of_the_one_in_use(prefetch):
    """When batch k is handed out, batches k+1 .. k+prefetch are already placed (their copies
    under way while step k runs), and no more than that is taken from the loader."""
    taken = []

    def source():
        for k, b in enumerate(batches(6)):
            taken.append(k)
            yield b

    loader = irt.ShardedLoader(source(), MESH, ("data", None), prefetch=prefetch)
    it = iter(loader)
    for k in range(6):
        x, _ = next(it)
        assert loader.batches == min(6, k + 1 + prefetch) == len(taken)
        assert torch.equal(irt.to_torch(x), batches(6)[k][0])
    assert next(it, None) is None


def test_a_loader_that_ended_is_not_asked_again():
    class Once:
        """An iterator that refuses to be asked again once it has ended."""

        def __init__(self, items):
            self.items, self.ended = iter(items), False

        def __iter__(self):
            return self

        def __next__(self):
            assert not self.ended, "asked again after it ended"
            try:
                return next(self.items)
            except StopIteration:
                self.ended = True
                raise

    assert len(list(irt.ShardedLoader(Once(batches(3)), MESH, ("data", None), prefetch=2))) == 3


def test_errors_come_in_order_naming_the_tensor_and_the_rule():
    with pytest.raises(TypeError, match="takes an ir_sharding Mesh"):
        irt.ShardedLoader([], "mesh", ("data",))
    with pytest.raises(ValueError, match="prefetch must be a positive int, got 0"):
        irt.ShardedLoader([], MESH, ("data",), prefetch=0)
    with pytest.raises(ShardingError, match="has 1 dims but its partition spec"):
        list(irt.ShardedLoader([(torch.randn(8),)], MESH, (None, "model")))

    def broken():
        yield from batches(2)
        raise OSError("disk gone")

    # Placed ahead, the error still comes after every batch before it has been used.
    got = []
    with pytest.raises(OSError, match="disk gone"):
        for x, _ in irt.ShardedLoader(broken(), MESH, ("data", None), prefetch=4):
            got.append(irt.to_torch(x))
    assert len(got) == 2 and torch.equal(got[1], batches(2)[1][0])
    bad = [{"x": torch.randn(8, 6)}, {"x": torch.randn(8)}]
    it = iter(irt.ShardedLoader(bad, MESH, {"x": (None, "model")}))
    assert torch.equal(irt.to_torch(next(it)["x"]), bad[0]["x"])
    with pytest.raises(ShardingError) as e:
        next(it)
    # Which tensor, and the rule; after the batch before it was used.
    assert str(e.value) == (
        "the batch's tensor 'x' has 1 dims but its partition spec (None, 'model') shards dim 1"
    )


def test_leaving_the_loop_early_frees_the_batches_placed_ahead():
    def endless():
        while True:
            yield batches(1)[0]

    gc.collect()
    before = len(jax.live_arrays())
    loader = irt.ShardedLoader(endless(), MESH, ("data", None), prefetch=2)
    it = iter(loader)
    x, y = next(it)
    assert len(jax.live_arrays()) == before + 2 * 3  # the batch in use and two ahead
    it.close()
    gc.collect()
    assert len(jax.live_arrays()) == before + 2  # the batch still held here, nothing else
    assert loader.batches == 3  # nothing placed after leaving
    del x, y
    gc.collect()
    assert len(jax.live_arrays()) == before


def test_a_second_loader_over_the_same_stream_takes_up_where_the_first_stopped():
    """Leaving the loop stops taking from the loader: a second loader over the same stream
    gets what the first had not taken (those it placed ahead are dropped with it)."""
    stream = iter(batches(6))
    first = irt.ShardedLoader(stream, MESH, ("data", None), prefetch=1)
    for _ in first:
        break
    rest = list(irt.ShardedLoader(stream, MESH, ("data", None)))
    assert len(rest) == 6 - first.batches == 4
    assert torch.equal(irt.to_torch(rest[0][0]), batches(6)[2][0])


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
