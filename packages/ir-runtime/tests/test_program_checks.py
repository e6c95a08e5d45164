"""Checked programs (IR_RUNTIME_PROGRAM_CHECKS=1): an index out of range and an integer division by
zero raise eager's error after the program ran, against torch eager; unchecked programs keep
XLA's behaviour."""

import copy
import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ir_runtime as irt
from ir_runtime import _runtime_checks
from ir_runtime._errors import CheckedDivisionError, CheckedIndexError, ProgramCheckError
from ir_runtime._execute import execute
from ir_runtime._lower import lower

pytestmark = pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")


@pytest.fixture
def checked():
    previous = _runtime_checks.set_program_checks(True)
    yield
    _runtime_checks.set_program_checks(previous)


@pytest.fixture
def unchecked():
    previous = _runtime_checks.set_program_checks(False)
    yield
    _runtime_checks.set_program_checks(previous)


def lazy(args):
    return [irt.to_lazy(a) if isinstance(a, torch.Tensor) else a for a in args]


def run(fn, args):
    """``fn`` on lazy copies of ``args``, its result read back (which runs the program)."""
    return irt.to_torch(fn(*lazy(args)))


def t(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


X = torch.arange(5.0)
M = torch.arange(20.0).reshape(4, 5)
ONES = torch.ones(2)


def setitem(x, i):
    y = x.clone()
    y[i] = 9.0
    return y


# (op, function, good arguments, bad arguments, the dim and size a bad index names, or None)
INDEX = [
    ("aten::index.Tensor", lambda x, i: x[i], (X, t(1, -5)), (X, t(1, 7)), (0, 5)),
    ("aten::index.Tensor", lambda x, i: x[i], (X, t(4)), (X, t(-6)), (0, 5)),
    ("aten::index.Tensor", lambda m, i: m[:, i], (M, t(0, -1)), (M, t(0, 5)), (1, 5)),
    ("aten::index.Tensor", lambda m, i, j: m[i, j], (M, t(3), t(4)), (M, t(3), t(9)), (1, 5)),
    (
        "aten::index_put.default",
        lambda x, i: x.index_put((i,), torch.tensor(-1.0, device=x.device)),
        (X, t(0, -1)),
        (X, t(0, 5)),
        (0, 5),
    ),
    ("aten::index_put.default", setitem, (X, t(-1, 3)), (X, t(5, 3)), (0, 5)),
    (
        "aten::index_put.default",
        lambda x, i, v: x.index_put((i,), v, accumulate=True),
        (X, t(2, 2), ONES),
        (X, t(2, -7), ONES),
        (0, 5),
    ),
    (
        "aten::gather.default",
        lambda m, i: m.gather(1, i),
        (M, t(4, 0).expand(4, 2)),
        (M, t(4, 5).expand(4, 2)),
        (1, 5),
    ),
    ("aten::gather.default", lambda x, i: x.gather(0, i), (X, t(0)), (X, t(-1)), (0, 5)),
    (
        "aten::gather.default",
        lambda x, i: torch.take_along_dim(x, i),
        (X, t(3, 1)),
        (X, t(3, 8)),
        (0, 5),
    ),
    (
        "aten::scatter.src",
        lambda x, i, s: x.scatter(0, i, s),
        (X, t(1, 4), ONES),
        (X, t(1, 5), ONES),
        (0, 5),
    ),
    ("aten::scatter.value", lambda x, i: x.scatter(0, i, 2.0), (X, t(0, 4)), (X, t(0, -1)), (0, 5)),
    (
        "aten::scatter.value_reduce",
        lambda x, i: x.scatter(0, i, 2.0, reduce="add"),
        (X, t(0, 0)),
        (X, t(0, 9)),
        (0, 5),
    ),
    (
        "aten::scatter_add.default",
        lambda x, i, s: x.scatter_add(0, i, s),
        (X, t(3, 3), ONES),
        (X, t(3, 6), ONES),
        (0, 5),
    ),
    (
        "aten::scatter_reduce.two",
        lambda x, i, s: x.scatter_reduce(0, i, s, "amax", include_self=False),
        (X, t(1, 2), ONES),
        (X, t(1, 5), ONES),
        (0, 5),
    ),
    (
        "aten::index_select.default",
        lambda m, i: m.index_select(1, i),
        (M, t(4, 0)),
        (M, t(4, 5)),
        (1, 5),
    ),
    (
        "aten::index_select.default",
        lambda m, i: m.index_select(0, i),
        (M, t(3)),
        (M, t(-1)),
        (0, 4),
    ),
    (
        "aten::index_add.default",
        lambda m, i, s: m.index_add(0, i, s, alpha=2),
        (M, t(0, 3), torch.ones(2, 5)),
        (M, t(0, 4), torch.ones(2, 5)),
        (0, 4),
    ),
    (
        "aten::index_copy.default",
        lambda m, i, s: m.index_copy(0, i, s),
        (M, t(1, 2), torch.ones(2, 5)),
        (M, t(1, -2), torch.ones(2, 5)),
        (0, 4),
    ),
    (
        "aten::index_fill.int_Scalar",
        lambda m, i: m.index_fill(1, i, 7.0),
        (M, t(0, -5)),
        (M, t(0, -6)),
        (1, 5),
    ),
    (
        "aten::index_fill.int_Tensor",
        lambda m, i, v: m.index_fill(1, i, v),
        (M, t(4), torch.tensor(7.0)),
        (M, t(5), torch.tensor(7.0)),
        (1, 5),
    ),
    (
        "aten::index_reduce.default",
        lambda m, i, s: m.index_reduce(0, i, s, "prod"),
        (M, t(3, 3), torch.full((2, 5), 2.0)),
        (M, t(3, 4), torch.full((2, 5), 2.0)),
        (0, 4),
    ),
    ("aten::take.default", lambda m, i: m.take(i), (M, t(19, -20)), (M, t(19, 20)), None),
    (
        "aten::put.default",
        lambda x, i, s: x.put(i, s),
        (X, t(0, -5), ONES),
        (X, t(0, -6), ONES),
        None,
    ),
    ("aten::embedding.default", lambda i, w: F.embedding(i, w), (t(3, 0), M), (t(3, 4), M), (0, 4)),
    (
        "aten::_embedding_bag_forward_only.default",
        lambda i, w, o: F.embedding_bag(i, w, o),
        (t(1, 3, 2), M, t(0, 1)),
        (t(1, 3, -1), M, t(0, 1)),
        (0, 4),
    ),
    (
        "aten::nll_loss_forward.default",
        lambda m, i: F.nll_loss(m, i),
        (M, t(0, 4, 1, -100)),
        (M, t(0, 5, 1, 1)),
        (1, 5),
    ),
    (
        "aten::nll_loss_forward.default",
        lambda m, i: F.cross_entropy(m, i),
        (M, t(0, 4, 1, 2)),
        (M, t(0, 1, -1, 2)),
        (1, 5),
    ),
    (
        "aten::multi_margin_loss.default",
        lambda m, i: F.multi_margin_loss(m, i),
        (M, t(0, 4, 1, 2)),
        (M, t(0, 4, 1, 5)),
        (1, 5),
    ),
    (
        "aten::multilabel_margin_loss_forward.default",
        lambda m, i: F.multilabel_margin_loss(m, i),
        (M, t(1, 3, -1, 0, 0).expand(4, 5)),
        (M, t(1, -1, 9, 0, 0).expand(4, 5)),
        (1, 5),
    ),
]

N = torch.tensor([7, -7, 5, -3])
D = torch.tensor([2, 3, -2, 1])
Z = torch.tensor([2, 0, -2, 1])

DIVISION = [
    ("aten::floor_divide.default", lambda n, d: n // d, (N, D), (N, Z)),
    ("aten::floor_divide.default", lambda n: n // 0, (N,), (N,)),
    ("aten::remainder.Tensor", lambda n, d: n % d, (N, D), (N, Z)),
    ("aten::remainder.Scalar", lambda n: torch.remainder(n, 0), (N,), (N,)),
    ("aten::fmod.Tensor", lambda n, d: torch.fmod(n, d), (N, D), (N, Z)),
    ("aten::fmod.Scalar", lambda n: torch.fmod(n, 0), (N,), (N,)),
    ("aten::div.Tensor_mode", lambda n, d: torch.div(n, d, rounding_mode="trunc"), (N, D), (N, Z)),
    ("aten::div.Tensor_mode", lambda n, d: torch.div(n, d, rounding_mode="floor"), (N, D), (N, Z)),
    (
        "aten::floor_divide.default",
        lambda n, d: n // d,
        (N.to(torch.int32), D.to(torch.int32)),
        (N.to(torch.int32), Z.to(torch.int32)),
    ),
    (
        "aten::div.Tensor_mode",
        lambda n, d: torch.div(n, d, rounding_mode="trunc"),
        (N.abs().to(torch.uint8), D.abs().to(torch.uint8)),
        (N.abs().to(torch.uint8), Z.abs().to(torch.uint8)),
    ),
]


def _good(fn, args):
    """The same value as eager, with no error."""
    want = fn(*args)
    got = run(fn, args)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.numpy(), want.numpy())


def _bad(fn, args, error):
    """Eager raises; so does the checked program, with an error of eager's type (and
    ``error``), naming the op and this line."""
    with pytest.raises(Exception) as eager:
        fn(*args)
    line = inspect.getsourcelines(fn)[1]
    with pytest.raises(type(eager.value)) as got:
        run(fn, args)
    assert isinstance(got.value, error)
    return str(got.value), line


def _names_op_and_line(message, op, line):
    assert f"in {op} recorded at {__file__}:" in message
    # (a lambda spread over several lines records the line of its call)
    assert any(f"{__file__}:{k} " in message for k in range(line, line + 4)), message


@pytest.mark.parametrize("op, fn, good, bad, where", INDEX, ids=[c[0] for c in INDEX])
def test_index_out_of_range_raises_as_eager(checked, op, fn, good, bad, where):
    _good(fn, good)
    message, line = _bad(fn, bad, CheckedIndexError)
    _names_op_and_line(message, op, line)
    if where is not None:
        assert f"is out of bounds for dimension {where[0]} with size {where[1]}" in message
    else:
        assert f"is out of bounds for a tensor of {bad[0].numel()} elements" in message


@pytest.mark.parametrize("op, fn, good, bad", DIVISION, ids=[c[0] for c in DIVISION])
def test_integer_division_by_zero_raises_as_eager(checked, op, fn, good, bad):
    if len(good) == 2:  # (a literal 0 has no good case)
        _good(fn, good)
    message, line = _bad(fn, bad, CheckedDivisionError)
    assert isinstance(CheckedDivisionError(""), ZeroDivisionError)
    assert message.startswith("integer division by zero, in ")
    _names_op_and_line(message, op, line)


def test_the_offending_value_is_named(checked):
    x, i = irt.to_lazy(X), irt.to_lazy(t(1, 2, 7, 9))
    with pytest.raises(CheckedIndexError, match=r"^index 7 is out of bounds for dimension 0"):
        irt.to_torch(x[i])


def test_float_division_and_empty_results_are_not_checked(checked):
    q = irt.to_lazy(torch.tensor([1.0, 2.0])) // irt.to_lazy(torch.tensor([0.0, 1.0]))
    assert irt.to_torch(q).tolist() == [float("inf"), 2.0]  # as eager
    empty = irt.to_lazy(torch.zeros(0, dtype=torch.int64)) // irt.to_lazy(torch.tensor(0))
    assert irt.to_torch(empty).shape == (0,)  # eager divides no element: no error
    s = irt.to_lazy(torch.tensor([3, 4])) / irt.to_lazy(torch.tensor([0, 2]))  # true division
    assert irt.to_torch(s).tolist() == [float("inf"), 2.0]


def test_the_first_failed_check_is_raised_and_the_others_counted(checked):
    x = irt.to_lazy(X)
    a = x[irt.to_lazy(t(8))]
    b = irt.to_lazy(N) // irt.to_lazy(Z)
    with pytest.raises(CheckedIndexError, match=r"index 8 .* 1 more check"):
        irt.mark_step()
    del a, b


def test_unchecked_programs_clamp_as_xla_does(unchecked):
    """Off (the default), an out-of-range index gathers a clamped value and a division by zero
    gives what XLA computes, with no error and no check in the program."""
    a = irt.to_lazy(X)
    i = irt.to_lazy(t(1, 7))
    before = irt.metrics()["counters"].get("ProgramCheckRead", 0)
    assert irt.to_torch(a[i]).tolist() == [1.0, 4.0]
    irt.to_torch(irt.to_lazy(N) // irt.to_lazy(Z))  # (undefined values, no error)
    assert irt.metrics()["counters"].get("ProgramCheckRead", 0) == before


def test_the_environment_variable_turns_checks_on(monkeypatch):
    previous = _runtime_checks.set_program_checks(None)
    try:
        monkeypatch.setenv("IR_RUNTIME_PROGRAM_CHECKS", "1")
        assert _runtime_checks.enabled()
        with pytest.raises(CheckedIndexError):
            irt.to_torch(irt.to_lazy(X)[irt.to_lazy(t(5))])
        monkeypatch.setenv("IR_RUNTIME_PROGRAM_CHECKS", "0")
        assert not _runtime_checks.enabled()
        assert irt.to_torch(irt.to_lazy(X)[irt.to_lazy(t(5))]).tolist() == [4.0]
    finally:
        _runtime_checks.set_program_checks(previous)


def test_checked_and_unchecked_programs_are_cached_apart():
    def step():  # (a graph no other test compiles)
        return irt.to_torch(irt.to_lazy(torch.arange(6.0) * 2)[irt.to_lazy(t(2, 9, 0))] - 1)

    def misses():
        return irt.metrics()["counters"]["CacheMiss"]

    previous = _runtime_checks.set_program_checks(False)
    try:
        step()
        start = misses()
        assert step().tolist() == [3.0, 9.0, -1.0] and misses() == start  # a hit
        _runtime_checks.set_program_checks(True)
        with pytest.raises(CheckedIndexError):
            step()
        assert misses() == start + 1  # the checked program, compiled
        with pytest.raises(CheckedIndexError):
            step()
        assert misses() == start + 1
        _runtime_checks.set_program_checks(False)
        assert step().tolist() == [3.0, 9.0, -1.0] and misses() == start + 1
    finally:
        _runtime_checks.set_program_checks(previous)


def test_unchecked_lowering_has_no_check(unchecked):
    value = (irt.to_lazy(X)[irt.to_lazy(t(2))])._ir
    plain = lower(value)
    _runtime_checks.set_program_checks(True)
    with_checks = lower(value)
    # The checked program returns one more result: its flags (whether each check failed and
    # the value that did).
    assert "tensor<2xi64>" not in plain.split("return")[1]
    assert with_checks.split("return")[1].count("tensor<2xi64>") == 1


def test_one_host_read_per_checked_run(checked):
    a = irt.to_lazy(M)
    reads = irt.metrics()["counters"].get("ProgramCheckRead", 0)
    b = a.index_select(0, irt.to_lazy(t(1, 2))) + a[irt.to_lazy(t(0, 3))]
    c = b.gather(1, irt.to_lazy(t(0, 4).expand(2, 2)))
    irt.mark_step()
    assert irt.metrics()["counters"]["ProgramCheckRead"] == reads + 1
    assert torch.equal(irt.to_torch(c), (M[[1, 2]] + M[[0, 3]]).gather(1, t(0, 4).expand(2, 2)))


def test_after_the_error_the_next_step_runs_and_earlier_tensors_keep_their_values(checked):
    a = irt.to_lazy(M)
    e = a * 2
    irt.mark_step()
    bad = a[irt.to_lazy(t(9))]
    with pytest.raises(CheckedIndexError):
        irt.mark_step()
    del bad  # (run outside deferred(), its results were dropped: it is still pending)
    c = e + 1
    irt.mark_step()
    assert torch.equal(irt.to_torch(a), M)
    assert torch.equal(irt.to_torch(e), M * 2)
    assert torch.equal(irt.to_torch(c), M * 2 + 1)


def test_inside_deferred_the_error_comes_after_the_results_are_bound(checked):
    """The front end's steps bind their results inside ``deferred()``: the step is done when
    the error comes (the bad result holds XLA's clamped value), and the next step runs."""
    w = irt.to_lazy(torch.ones(3))
    irt.mark_step()
    with pytest.raises(CheckedIndexError, match="results are bound") as got:
        with _runtime_checks.deferred():
            w.add_(1)
            bad = irt.to_lazy(X)[irt.to_lazy(t(1, 7))]
            irt.mark_step()
    assert isinstance(got.value, ProgramCheckError)
    assert irt.to_torch(bad).tolist() == [1.0, 4.0]  # bound: read with no program, no error
    assert irt.to_torch(w).tolist() == [2.0, 2.0, 2.0]  # the step ran once
    w.mul_(3)
    irt.mark_step()
    assert irt.to_torch(w).tolist() == [6.0, 6.0, 6.0]


def test_deferred_keeps_the_first_failure_and_an_error_leaving_it_wins(checked):
    bad = [irt.to_lazy(X)[irt.to_lazy(t(k))]._ir for k in (7, 8)]
    with pytest.raises(CheckedIndexError, match=r"^index 7 "):
        with _runtime_checks.deferred():
            first = execute([bad[0]])  # (the runtime's own entry: nothing it binds)
            execute([bad[1]])
    assert first[0].handle is not None
    with pytest.raises(KeyError):
        with _runtime_checks.deferred():
            execute([bad[0]])
            raise KeyError("mine")
    with pytest.raises(CheckedIndexError):  # outside deferred(): at once
        execute([bad[1]])


def test_regions_are_not_checked(checked):
    """Inside a scan_layers body nothing is checked (a flag cannot leave the scan); the
    program still compiles and runs, and a check outside the body still raises."""

    class Pick(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("where", torch.tensor([2, 0, 1]))

        def forward(self, h):
            return h[:, self.where] * 2

    layers = torch.nn.ModuleList(Pick() for _ in range(2))
    x = torch.arange(6.0).reshape(2, 3)
    lazy_layers = irt.to_lazy(copy.deepcopy(layers))
    got = irt.to_torch(irt.scan_layers(lazy_layers, irt.to_lazy(x)))
    want = x
    for layer in layers:
        want = layer(want)
    assert torch.equal(got, want)
    h = irt.scan_layers(lazy_layers, irt.to_lazy(x))
    with pytest.raises(CheckedIndexError):
        irt.to_torch(h[irt.to_lazy(t(4))])


def test_sharded_inputs_are_checked_over_every_shard(checked):
    mesh = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
    table = irt.to_lazy(torch.arange(32.0).reshape(8, 4))
    irt.mark_sharding(table, mesh, ("data", "model"))
    ids = irt.to_lazy(torch.arange(8) % 8)
    irt.mark_sharding(ids, mesh, ("data",))
    got = irt.to_torch(F.embedding(ids, table) * 2)
    assert torch.equal(got, F.embedding(torch.arange(8), torch.arange(32.0).reshape(8, 4)) * 2)
    bad = irt.to_lazy(torch.tensor([0, 1, 2, 3, 4, 5, 6, 8]))  # the last shard's
    irt.mark_sharding(bad, mesh, ("data",))
    with pytest.raises(CheckedIndexError, match=r"^index 8 is out of bounds for dimension 0"):
        irt.to_torch(F.embedding(bad, table))
