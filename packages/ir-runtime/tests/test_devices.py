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
