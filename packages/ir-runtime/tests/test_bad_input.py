"""Bad input fails at the call that caused it (or at the step that runs it, naming the
tensor), in the project's own words, and never poisons a later step.

Each case asserts its error's type and message, that the tensors made before it keep their
values (torch eager and numpy are the oracles) and that the next correct step runs."""

import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_core import Generic, Value
from ir_runtime import _distributed, _memory
from ir_runtime._frontend import inspect
from ir_runtime._frontend.steps import _step
from ir_runtime._graph import Graph
from ir_sharding import Mesh, ShardingError, ShardingSpec

MESH = Mesh(range(8), (4, 2), ("data", "model"))
REVERSED = Mesh(list(range(8))[::-1], (4, 2), ("data", "model"))
FLAT = Mesh(range(8), (8,), ("devices",))  # the same devices in the same order: compatible
HALF = Mesh(range(4), (4,), ("data",))  # other devices


@pytest.fixture
def before():
    """Tensors made before the bad call: one holding sharded data, one pending; and a check
    that both still hold their values and that a new, unrelated step runs."""
    irt.mark_step()
    w = irt.to_lazy(torch.arange(32.0).reshape(8, 4))
    irt.mark_sharding(w, MESH, ("data", None))
    p = irt.to_lazy(torch.arange(6.0)) * 3

    def intact():
        fresh = irt.to_lazy(torch.ones(5)) + 1
        irt.mark_step()
        assert fresh.cpu().tolist() == [2.0] * 5
        np.testing.assert_array_equal(w.cpu().numpy(), np.arange(32.0).reshape(8, 4))
        np.testing.assert_array_equal(p.cpu().numpy(), np.arange(6.0) * 3)

    return intact


# -- uneven shards across processes: each passes its own blocks, which must be even ---------


def test_uneven_blocks_of_a_process_local_part_are_refused(before):
    """In one process an uneven spec is taken (``test_uneven.py``); the calls whose arguments
    are one process's blocks of a global tensor refuse it: each process loads even blocks."""
    with pytest.raises(ShardingError, match=r"dim 0 of global_shape \(10, 2\) \(size 10\)"):
        irt.process_local_slices(MESH, ("data", None), (10, 2))
    with pytest.raises(ShardingError, match=r"dim 0 of global_shape \(6, 2\) \(size 6\)"):
        irt.from_process_local(torch.ones(3, 2), MESH, ("data", None), global_shape=(6, 2))
    before()


# -- two device orders: refused at the op that combines them ----------------------------------


def placed(mesh, entries=("data", None)):
    t = irt.to_lazy(torch.arange(32.0).reshape(8, 4))
    irt.mark_sharding(t, mesh, entries)
    return t


def test_tensors_over_two_device_orders_are_refused_at_the_op(before):
    a = placed(MESH)
    pending_before = a * 2  # recorded while one device order was in use
    b = placed(REVERSED)
    assert inspect.device_orders_checked()
    for combine in (
        lambda: a + b,
        lambda: torch.cat([a, b]),
        lambda: pending_before - b,
        lambda: b.mul(pending_before),
    ):
        with pytest.raises(irt.DeviceMismatchError) as e:
            combine()
        message = str(e.value)
        assert message.startswith("Expected all tensors to be on the same device: aten.")
        assert "test_bad_input.py:" in message  # the line that combined them
        assert f"over {MESH} (devices [0, 1, 2, 3, 4, 5, 6, 7])" in message
        assert f"over {REVERSED} (devices [7, 6, 5, 4, 3, 2, 1, 0])" in message
        assert "float32 tensor (8, 4)" in message
    value = inspect.value_of(a)
    with pytest.raises(irt.DeviceMismatchError):
        a.add_(b)
    assert inspect.value_of(a) is value
    # Pending work over one order cannot be annotated over the other (data is moved instead).
    with pytest.raises(irt.DeviceMismatchError, match="its pending value reads data over"):
        irt.mark_sharding(a * 3, REVERSED, ("data", None))
    # Each mesh's own tensors combine, and results follow them.
    c, d = b * 2, (b * 2) + b
    expected = np.arange(32.0).reshape(8, 4)
    irt.mark_step()
    np.testing.assert_array_equal(d.cpu().numpy(), expected * 3)
    np.testing.assert_array_equal(c.cpu().numpy(), expected * 2)
    np.testing.assert_array_equal((pending_before + a).cpu().numpy(), expected * 3)
    # The documented fix: place the data over one mesh.
    irt.mark_sharding(b, MESH, ("data", None))
    np.testing.assert_array_equal((a + b).cpu().numpy(), expected * 2)
    before()


def test_meshes_over_other_devices_are_refused_and_one_order_in_any_shape_mixes():
    a = placed(MESH)
    f = placed(FLAT, ("devices", None))
    np.testing.assert_array_equal((a + f).cpu().numpy(), np.arange(32.0).reshape(8, 4) * 2)
    h = placed(HALF)
    with pytest.raises(irt.DeviceMismatchError, match=r"\(devices \[0, 1, 2, 3\]\)"):
        _ = a + h
    irt.mark_step()


def test_a_graph_over_two_device_orders_is_a_lowering_error():
    x = irt.to_device(np.ones((8, 4), np.float32), ShardingSpec(MESH, ("data", None)))
    y = irt.to_device(np.ones((8, 4), np.float32), ShardingSpec(REVERSED, ("data", None)))
    z = Value(Generic("aten::add.Tensor", [Value(x), Value(y)], [x.shape], {"alpha": 1}))
    with pytest.raises(irt.LoweringError, match="one graph uses two device orders"):
        irt.execute([z])


# -- a program that cannot fit: refused before it runs; its tensor set aside ------------------


def too_big() -> int:
    """Elements of a float32 vector twice this host's memory, a multiple of 8 (it is sharded
    8 ways, so no single device is asked for more than a quarter of it)."""
    return _memory.host_bytes() // 2 // 8 * 8


def test_a_program_larger_than_memory_is_refused_and_set_aside(before):
    n = too_big()
    other = irt.to_lazy(torch.arange(4.0)) * 5
    z = torch.zeros(n, device="lazy")
    irt.mark_sharding(z, FLAT, ("devices",))
    with pytest.raises(irt.OutOfMemoryError) as e:
        irt.mark_step()
    message = str(e.value)
    per_device = n * 4 // 8
    assert f"the program needs {_memory._gb(per_device)} per device" in message
    assert f"result float32[{n}] from aten::zeros" in message
    assert "test_bad_input.py:" in message  # the line that made it
    assert "more than this host's memory, shared by its 8 CPU devices" in message
    (note,) = e.value.__notes__
    assert note.startswith(f"ir_runtime: 1 tensor(s) set aside: float32[{n}] from aten::zeros")
    assert inspect.set_aside() == [z]
    # The unrelated work of that step is still pending, and the next step computes it.
    before()
    assert other.cpu().tolist() == [0.0, 5.0, 10.0, 15.0]
    with pytest.raises(irt.OutOfMemoryError):
        z.cpu()  # read, it runs alone, and fails again
    assert inspect.set_aside() == [z]
    del z, e  # (the error's traceback holds the tensor)
    irt.mark_step()
    assert not inspect.set_aside()


def test_of_tensors_that_fit_alone_but_not_together_the_last_is_set_aside(before, monkeypatch):
    monkeypatch.setattr(_memory, "host_bytes", lambda: 1 << 20)  # a host of 1 MB
    n = (1 << 20) * 3 // 4 // 4  # float32s in 3/4 of it
    a = torch.zeros(n, device="lazy")
    b = torch.ones(n, device="lazy")
    for t in (a, b):
        irt.mark_sharding(t, FLAT, ("devices",))
    with pytest.raises(irt.OutOfMemoryError) as e:
        irt.mark_step()
    assert e.value.__notes__[0].startswith(
        f"ir_runtime: 1 tensor(s) set aside: float32[{n}] from aten::fill"
    )
    del e
    assert inspect.set_aside() == [b]
    before()  # the next step leaves b out: the rest fits
    assert a.cpu().max().item() == 0.0
    np.testing.assert_array_equal(b.cpu().numpy(), np.ones(n, np.float32))  # read: alone
    assert not inspect.set_aside()


def test_a_step_that_fails_as_it_runs_sets_aside_all_its_tensors(before, monkeypatch):
    """When every part of the step compiles (it failed on the device), nothing tells which
    tensor is at fault: all of them are set aside, and each read runs alone."""
    from ir_runtime._executable import Executable

    a = irt.to_lazy(torch.arange(3.0)) + 1
    b = irt.to_lazy(torch.arange(2.0)) * 4
    run = Executable.run
    monkeypatch.setattr(Executable, "run", lambda self, arrays: 1 / 0)
    with pytest.raises(ZeroDivisionError) as e:
        irt.mark_step()
    assert e.value.__notes__[0].startswith("ir_runtime: 3 tensor(s) set aside: float32[6]")
    del e
    monkeypatch.setattr(Executable, "run", run)
    assert {id(t) for t in inspect.set_aside()} >= {id(a), id(b)}
    fresh = irt.to_lazy(torch.ones(2)) * 7
    irt.mark_step()
    assert fresh.cpu().tolist() == [7.0, 7.0]
    assert a.cpu().tolist() == [1.0, 2.0, 3.0] and b.cpu().tolist() == [0.0, 4.0]
    before()
    assert not inspect.set_aside()


def test_the_check_reads_xla_memory_analysis(monkeypatch):
    """The bytes the check compares are the compiled program's, from XLA's analysis; on CPU
    its devices share the host's memory."""
    x = irt.to_lazy(torch.ones(64, 16)) * 2
    irt.mark_sharding(x, FLAT, ("devices", None))
    graph = Graph([inspect.value_of(x)])
    irt.mark_step()
    exe = inspect.last_executable()
    memory = exe.memory()
    assert memory["outputs"] == 64 * 16 * 4 // 8
    assert _memory.limit(exe.program.devices) == (
        _memory.host_bytes(),
        8,
        "this host's memory, shared by its 8 CPU devices",
    )
    _memory.check_fits(memory, exe.program, graph, exe.out_specs)
    monkeypatch.setattr(_memory, "host_bytes", lambda: 4096)  # a host of 4 KB
    _memory.check_fits({**memory, "peak": 512}, exe.program, graph, exe.out_specs)  # 8 x 512
    with pytest.raises(irt.OutOfMemoryError) as e:
        _memory.check_fits({**memory, "peak": 513}, exe.program, graph, exe.out_specs)
    assert str(e.value).startswith("the program needs 513 bytes per device")
    assert "4.0 KB in all, more than this host's memory" in str(e.value)
    assert "(4.0 KB inputs, 512 bytes results," in str(e.value)
    # The input, unsharded, is whole on each device; the result's shard is 64 * 16 * 4 / 8.
    assert "its largest buffers: input float32[64,16]: 4.0 KB per device; result " in str(e.value)
    assert "from aten::mul.Tensor at " in str(e.value)
    assert "test_bad_input.py:" in str(e.value)


# -- errors from the device, in the project's words -------------------------------------------


class FakeXlaError(Exception):
    pass


def test_device_failures_become_the_projects_errors():
    oom = _distributed.device_failure(
        FakeXlaError("RESOURCE_EXHAUSTED: Out of memory allocating 26843545600 bytes."), "step"
    )
    assert type(oom) is irt.OutOfMemoryError and isinstance(oom, MemoryError)
    assert str(oom).startswith("step ran out of device memory: FakeXlaError: RESOURCE_EXHAUSTED")
    other = _distributed.device_failure(FakeXlaError("INTERNAL: boom"), "step")
    assert type(other) is irt.ExecutionError


def test_wait_device_ops_reports_a_failed_program_as_the_projects_error(monkeypatch):
    from ir_runtime import _collectives

    class Failed:
        def is_deleted(self):
            return False

        def block_until_ready(self):
            raise FakeXlaError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")

    monkeypatch.setattr(_collectives, "_LAST", [Failed()])
    with pytest.raises(irt.OutOfMemoryError, match="a program launched earlier ran out") as e:
        irt.wait_device_ops()
    assert isinstance(e.value.__cause__, FakeXlaError)
    irt.wait_device_ops()  # reported once


def test_a_failed_collective_program_is_reported_once_by_the_next_wait():
    """The one-collective-in-flight rule's wait (``_launch.settle``, in C) reports a program
    that failed while in flight as the project's error, once, and counts the wait."""
    from ir_runtime import _collectives

    class Failed:
        def is_deleted(self):
            return False

        def block_until_ready(self):
            raise FakeXlaError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")

    irt.wait_device_ops()
    irt.reset_metrics()
    _collectives._IN_FLIGHT[0] = Failed()
    try:
        with pytest.raises(irt.OutOfMemoryError, match="the previous program ran out") as e:
            irt.wait_device_ops()
        assert isinstance(e.value.__cause__, FakeXlaError)
        assert _collectives._IN_FLIGHT[0] is None
    finally:
        _collectives._IN_FLIGHT[0] = None
    irt.wait_device_ops()  # reported once
    assert irt.metrics()["counters"]["CollectiveSync"] == 1


# -- the general guarantee ---------------------------------------------------------------------


def _graph_of_two_orders():
    x = irt.to_device(np.ones((8, 4), np.float32), ShardingSpec(MESH, ("data", None)))
    y = irt.to_device(np.ones((8, 4), np.float32), ShardingSpec(REVERSED, ("data", None)))
    irt.execute([Value(Generic("aten::add.Tensor", [Value(x), Value(y)], [x.shape], {}))])


def _checked_index_out_of_range():
    previous = irt.set_program_checks(True)
    try:
        a = irt.to_lazy(torch.arange(5.0))
        _ = a[irt.to_lazy(torch.tensor([1, 7]))]
        irt.mark_step()
    finally:
        irt.set_program_checks(previous)


BAD_CALLS = {
    "spec rank": (
        lambda: irt.mark_sharding(irt.to_lazy(torch.ones(8, 4)), MESH, ("data",)),
        ShardingError,
    ),
    "unknown axis": (
        lambda: irt.mark_sharding(irt.to_lazy(torch.ones(8)), MESH, ("rows",)),
        ShardingError,
    ),
    "two device orders": (lambda: placed(MESH) + placed(REVERSED), irt.DeviceMismatchError),
    "other devices": (lambda: placed(MESH) * placed(HALF), irt.DeviceMismatchError),
    "unsupported op": (
        lambda: irt.to_lazy(torch.ones(4, 4)) + torch.eye(4).to_sparse_csr(),
        irt.UnsupportedOpError,
    ),
    "graph of two orders": (_graph_of_two_orders, irt.LoweringError),
    "cpu model, lazy input": (
        lambda: torch.nn.Linear(4, 2)(irt.to_lazy(torch.ones(3, 4))),
        irt.DeviceMismatchError,
    ),
    "checked index": (_checked_index_out_of_range, irt.CheckedIndexError),
    "program too large": (
        lambda: (
            irt.mark_sharding(torch.zeros(too_big(), device="lazy"), FLAT, ("devices",)),
            irt.mark_step(),
        ),
        irt.OutOfMemoryError,
    ),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")
@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_no_bad_call_poisons_a_later_step(before, case):
    """Whatever a bad call does, it fails at that call, and the next steps (with other work)
    run and every earlier tensor keeps its value."""
    call, error = BAD_CALLS[case]
    with pytest.raises(error):
        call()
    before()
    before()


def test_no_failed_step_poisons_a_later_step(before):
    z = torch.zeros(too_big(), device="lazy")
    irt.mark_sharding(z, FLAT, ("devices",))
    with pytest.raises(irt.OutOfMemoryError):
        irt.mark_step()
    before()
    # Tensors computed from one set aside fail too, with it, and are set aside in turn (they
    # share its node: one group); read, a small part is computed without making the whole.
    w = z * 2
    part = z[:8] + 1
    with pytest.raises(irt.OutOfMemoryError) as e:
        irt.mark_step()
    assert e.value.__notes__[0].startswith("ir_runtime: 2 tensor(s) set aside: float32[")
    del e
    before()
    assert {id(t) for t in inspect.set_aside()} == {id(z), id(w), id(part)}
    assert part.cpu().tolist() == [1.0] * 8
    assert {id(t) for t in inspect.set_aside()} == {id(z), id(w)}
    del z, w
    irt.mark_step()
    assert not inspect.set_aside()


def test_copy_across_device_orders_goes_through_the_host_as_eager_copies_across_devices():
    src = placed(REVERSED) * 2  # pending, over the reversed order
    dst = placed(MESH)
    dst.copy_(src)
    assert inspect.annotation_of(dst).mesh == MESH  # it stays where it lives
    irt.mark_step()
    np.testing.assert_array_equal(dst.cpu().numpy(), np.arange(32.0).reshape(8, 4) * 2)
    assert inspect.data_of(dst).sharding.mesh.devices.flatten().tolist() == [
        d for d in irt.devices() if d.id in range(8)
    ]
    # load_state_dict from a model over another mesh
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 8), torch.nn.Linear(4, 8)
    expected = {k: v.clone() for k, v in b.state_dict().items()}
    la, lb = irt.to_lazy(a), irt.to_lazy(b)
    irt.mark_sharding(la.weight, MESH, ("data", None))
    irt.mark_sharding(lb.weight, REVERSED, ("data", None))
    la.load_state_dict(lb.state_dict())
    for k, v in expected.items():
        torch.testing.assert_close(la.state_dict()[k].cpu(), v)
    assert inspect.annotation_of(la.weight).mesh == MESH


def test_the_mesh_a_tensor_was_found_over_is_forgotten_when_its_value_changes():
    a = placed(MESH)
    b = placed(REVERSED)  # two orders: ops are checked, and pending values noted
    t = irt.to_lazy(torch.ones(8, 4)) * 2
    _ = t + b  # t's pending value noted as over nothing placed, then over b's order
    irt.mark_step()
    assert "_order" not in t.__dict__  # (the note would keep the old graph and its inputs)
    del a


# -- set-aside tensors and the rest of the front end -------------------------------------------


@pytest.fixture
def small_host(monkeypatch):
    """A host of 2 KB: a float32[1000] result does not fit (8 CPU devices share it)."""
    monkeypatch.setattr(_memory, "host_bytes", lambda: 2000)
    return monkeypatch


def _fail_one(small_host):
    x = irt.to_lazy(torch.ones(1000)) + 1
    with pytest.raises(irt.OutOfMemoryError):
        irt.mark_step()
    assert any(t is x for t in inspect.set_aside())
    return x


def test_a_set_aside_tensor_gets_data_and_is_forgotten(small_host):
    x = _fail_one(small_host)
    x.data = irt.to_lazy(torch.zeros(1000))
    irt.mark_step()
    # Its entry is gone, and with it the failed graph and the data it read.
    assert not inspect.set_aside() and not _step.SET_ASIDE
    assert x.cpu().tolist() == [0.0] * 1000


def test_a_set_aside_tensor_passed_to_a_replaying_compiled_step_runs_alone(small_host):
    step = irt.compile_step(lambda t: t + 1)
    a = irt.to_lazy(torch.ones(4))
    for _ in range(3):
        a = step(a)
    x = _fail_one(small_host)
    with pytest.raises(irt.OutOfMemoryError):
        step(x)  # still too large alone: its own error, at once
    small_host.undo()
    assert step(x).cpu().tolist() == [3.0] * 1000  # fits now: run alone, then the step
    np.testing.assert_array_equal(a.cpu().numpy(), [4.0] * 4)


def test_a_live_set_aside_tensor_does_not_enter_a_compiled_steps_program(small_host):
    x = _fail_one(small_host)
    step = irt.compile_step(lambda t: t * 2)
    out = step(irt.to_lazy(torch.ones(4)))
    assert out.cpu().tolist() == [2.0] * 4
    assert any(t is x for t in inspect.set_aside())
    small_host.undo()
    assert x.cpu().tolist() == [2.0] * 1000


def test_a_failed_check_in_a_compiled_steps_trace_loses_no_state():
    previous = irt.set_program_checks(True)
    try:
        w = irt.to_lazy(torch.ones(4))
        irt.mark_step()

        def f(i):
            w.mul_(2)
            return w.index_select(0, i)

        step = irt.compile_step(f)
        with pytest.raises(irt.CheckedIndexError, match="index 10 is out of bounds"):
            step(irt.to_lazy(torch.tensor([10])))
        assert w.cpu().tolist() == [2.0] * 4  # bound before the error came
        assert step(irt.to_lazy(torch.tensor([1]))).cpu().tolist() == [4.0]
    finally:
        irt.set_program_checks(previous)
