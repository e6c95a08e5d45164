# cython: language_level=3
"""The floor under ``Generic(...)`` in ``bench_core.py``: an extension type of ``Generic``'s
size, called with the same arguments, that only stores four of them. No checks, no encoding,
no hashing: what any C-level node costs a Python loop to allocate, call and keep."""

cimport cython


@cython.final
@cython.no_gc
cdef class Floor:
    # Generic's layout: eight object fields and six 8-byte integers (its hashes, traversal marks).
    cdef object op, operands, shapes, attrs, _o4, _o5, _o6, _o7
    cdef unsigned long long _i0, _i1, _i2, _i3, _i4, _i5

    def __cinit__(self, op, operands, shapes, attrs=None, sharding=None, origin=None):
        self.op = op
        self.operands = operands
        self.shapes = shapes
        self.attrs = attrs
