from cpython.object cimport PyObject
from libc.stdint cimport uint64_t


cdef class Shape:
    cdef readonly str dtype
    cdef readonly tuple dims
    # The canonical encoding of (dtype, dims), spliced into every node that has this shape.
    cdef bytes _enc
    cdef Py_hash_t _hash


cdef class Node:
    cdef str _op
    cdef tuple _operands        # tuple[Value, ...]
    cdef tuple _shapes          # tuple[Shape, ...]
    cdef tuple _attrs           # (k0, v0, k1, v1, ...), keys in code-point order
    cdef object _attrs_view
    cdef object _sharding
    cdef bytes _sharding_bytes  # None when unsharded
    # Where the node was recorded (any object the recorder chooses; None when not given).
    # Neither hashed nor compared: the same computation recorded from two lines is one graph.
    cdef object _origin
    cdef uint64_t _nh_lo, _nh_hi, _dh_lo, _dh_hi
    # Traversal scratch, not part of the node's identity or hash: written by _graph only while
    # it holds the GIL and calls no Python code, so two traversals never interleave.
    cdef uint64_t _mark
    cdef Py_ssize_t _pos


cdef class Value:
    cdef readonly Node node
    cdef readonly Py_ssize_t index


# A Generic like ``src`` (a Generic) but with ``operands``, a tuple of Value: node_hash copied,
# dag_hash computed. For traversals that rebuild nodes (relink).
cdef Node _with_operands(Node src, tuple operands)

# The exact canonical bytes of a graph whose nodes (post-order, ``_pos`` set) are ``nodes``.
cdef bytes _fingerprint(PyObject** nodes, Py_ssize_t count, tuple roots, tuple indices)
