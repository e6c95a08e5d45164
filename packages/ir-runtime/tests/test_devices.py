"""Devices, metrics and the public surface."""

import pytest

import ir_runtime as irt


def test_devices_are_the_eight_virtual_cpus():
    assert [d.id for d in irt.devices()] == list(range(8))
    assert irt.init(cpu_devices=8) == irt.devices()  # asking again for the same count is fine


def test_asking_for_another_count_after_start_is_a_clear_error():
    with pytest.raises(
        irt.DeviceCountError, match=r"already started with 8 CPU device\(s\); cannot switch to 4"
    ):
        irt.init(cpu_devices=4)
    with pytest.raises(irt.DeviceCountError, match="positive int"):
        irt.init(cpu_devices=0)


def test_env_var_sets_the_count(monkeypatch):
    monkeypatch.setenv("IR_RUNTIME_CPU_DEVICES", "8")
    assert len(irt.init()) == 8
    monkeypatch.setenv("IR_RUNTIME_CPU_DEVICES", "eight")
    with pytest.raises(irt.DeviceCountError, match="not an integer"):
        irt.init()


def test_registry_covers_the_families_and_refuses_duplicates():
    ops = irt.supported_ops()
    for needed in [
        "aten::add.Tensor",
        "aten::mm.default",
        "aten::convolution.default",
        "aten::sum.dim_IntList",
        "aten::view.default",
        "aten::gather.default",
        "aten::_log_softmax.default",
        "aten::nll_loss_forward.default",
        "ir::random_uniform",
    ]:
        assert needed in ops
    with pytest.raises(ValueError, match="already has a lowering rule"):
        irt.register_lowering("aten::add.Tensor")(lambda node, x, y: x)


def test_metrics_report_names_every_counter():
    report = irt.metrics_report()
    for name in [
        "CompileCount",
        "CacheHit",
        "CacheMiss",
        "PersistentCacheHit",
        "ExecuteCount",
        "TransferToDevice",
        "TransferToHost",
    ]:
        assert name in report


def test_outbound_data_counts_the_bytes_each_device_receives():
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from ir_runtime._data import put

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    host = np.arange(64, dtype=np.float32).reshape(8, 8)
    for spec, per_device in [
        (PartitionSpec(), 64),  # replicated: the whole array to each of 8 devices
        (PartitionSpec("data", "model"), 8),  # blocks of 2x4
        (PartitionSpec("data"), 16),  # blocks of 2x8, each on the 2 devices of a model row
    ]:
        for _ in range(2):  # the first of its kind through jax.device_put, then the fast path
            irt.reset_metrics()
            a = put(host, NamedSharding(mesh, spec))
            np.testing.assert_array_equal(np.asarray(a), host)
            got = irt.metrics()["timers"]["OutboundData"]
            assert (got["count"], got["total"]) == (1, 8 * per_device * 4), spec
    with pytest.raises(ValueError):  # a transfer that fails records nothing
        irt.reset_metrics()
        put(np.zeros((3, 8), np.float32), NamedSharding(mesh, PartitionSpec("data")))
    assert "OutboundData" not in irt.metrics()["timers"]
