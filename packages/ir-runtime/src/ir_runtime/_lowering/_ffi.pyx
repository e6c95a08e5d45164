# cython: language_level=3
"""The runtime's XLA FFI handlers, as the capsules ``jax.ffi.register_ffi_target`` takes.

``materialize()``: the CPU handler of ``ir::materialize`` (``materialize.c``), built against
XLA's FFI C API header (``third_party/xla``).
"""
from cpython.pycapsule cimport PyCapsule_New


cdef extern from "materialize.h":
    void* ir_runtime_materialize_handler()


def materialize():
    """A capsule holding the ``ir::materialize`` handler's address (no name, as jax's own)."""
    return PyCapsule_New(ir_runtime_materialize_handler(), NULL, NULL)
