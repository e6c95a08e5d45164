"""Mesh: validation of every argument, the properties, value semantics."""

import pickle

import numpy as np
import pytest

from ir_sharding import Mesh, ShardingError


def test_properties():
    mesh = Mesh(np.array([3, 1, 0, 2, 7, 6, 5, 4]), (4, 2), ("data", "model"))
    assert mesh.device_ids == (3, 1, 0, 2, 7, 6, 5, 4)
    assert all(type(d) is int for d in mesh.device_ids)
    assert mesh.shape == (4, 2)
    assert mesh.size == 8
    assert mesh.ndim == 2
    assert mesh.axis_names == ("data", "model")
    np.testing.assert_array_equal(mesh.logical_mesh(), [[3, 1], [0, 2], [7, 6], [5, 4]])
    assert mesh.axis_index("model") == 1
    assert mesh.axis_index(0) == 0


def test_logical_mesh_is_a_copy():
    mesh = Mesh(range(4), (2, 2), ("a", "b"))
    grid = mesh.logical_mesh()
    grid[0, 0] = 99
    assert mesh.logical_mesh()[0, 0] == 0
    assert mesh.device_ids == (0, 1, 2, 3)


def test_device_ids_any_array_like_flattened_in_c_order():
    assert Mesh(np.arange(6).reshape(2, 3), (3, 2), ("a", "b")).device_ids == tuple(range(6))
    assert Mesh([np.int32(2), np.int64(0)], [2], ["x"]).device_ids == (2, 0)


def test_value_semantics():
    a = Mesh(range(4), (2, 2), ("a", "b"))
    assert a == Mesh([0, 1, 2, 3], [2, 2], ["a", "b"])
    assert hash(a) == hash(Mesh([0, 1, 2, 3], [2, 2], ["a", "b"]))
    assert a != Mesh([1, 0, 2, 3], (2, 2), ("a", "b"))
    assert a != Mesh(range(4), (4, 1), ("a", "b"))
    assert a != Mesh(range(4), (2, 2), ("b", "a"))
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(a) == "Mesh(range(4), (2, 2), ('a', 'b'))"
    assert repr(Mesh([2, 3], (2,), ("x",))) == "Mesh(range(2, 4), (2,), ('x',))"
    assert repr(Mesh([3, 2], (2,), ("x",))) == "Mesh([3, 2], (2,), ('x',))"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([0, 1, 2], (2, 2), ("a", "b")), r"mesh_shape \(2, 2\) holds 4 devices but 3 device"),
        ((range(8), (2, 2), ("a", "b")), r"holds 4 devices but 8 device"),
        (([0, 1, 1, 2], (2, 2), ("a", "b")), r"device ids \[0, 1, 1, 2\] repeat 1"),
        (([0, -1], (2,), ("a",)), "device id -1 is negative"),
        (([0, 1.5], (2,), ("a",)), r"device id 1.5 is 1.5 \(float\)"),
        (([0, True], (2,), ("a",)), "is True, a bool"),
        ("01", "device_ids must be integers"),
        ((range(4), (2, 2), ("a",)), r"has 1 name\(s\) but mesh_shape \(2, 2\) has 2 axes"),
        ((range(4), (2, 2), ("a", "a")), "repeats 'a'"),
        ((range(4), (2, 2), ("a", 1)), "axis name 1 .* is not a non-empty str"),
        ((range(4), (2, 2), ("a", "")), "axis name '' .* is not a non-empty str"),
        ((range(4), (2, 2), "ab"), "axis_names must be a sequence of str"),
        ((range(4), (4, 0), ("a", "b")), r"has size 0 on axis 1"),
        ((range(4), (), ()), "mesh_shape is empty"),
        ((range(4), 4, ("a",)), "mesh_shape must be a sequence of ints"),
        ((range(4), (2.0, 2), ("a", "b")), r"mesh_shape entry 0 is 2.0"),
    ],
)
def test_bad_meshes_name_the_value_and_the_rule(args, message):
    if isinstance(args, str):
        args = (args, (2,), ("a",))
    with pytest.raises(ShardingError, match=message):
        Mesh(*args)


def test_sharding_error_is_a_value_error():
    assert issubclass(ShardingError, ValueError)


def test_axis_index_errors():
    mesh = Mesh(range(4), (2, 2), ("a", "b"))
    with pytest.raises(ShardingError, match=r"unknown mesh axis 'c'; this mesh's axes are \('a'"):
        mesh.axis_index("c")
    with pytest.raises(ShardingError, match="mesh axis index 2 is out of range"):
        mesh.axis_index(2)
    with pytest.raises(ShardingError, match="mesh axis index -1 is out of range"):
        mesh.axis_index(-1)
