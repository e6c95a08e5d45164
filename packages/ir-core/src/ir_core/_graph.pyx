# cython: language_level=3, boundscheck=False, wraparound=False
"""Traversal of IR graphs and the graph hash: iterative, linear, no recursion limit."""

from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport uint32_t, uint64_t

from ir_core._nodes cimport Node, Value
from ir_core._canon cimport (
    XXH128_hash_t,
    ir_put_hash,
    ir_put_len,
    ir_put_u64,
    XXH3_128bits_digest,
    XXH3_128bits_reset,
    XXH3_128bits_update,
    XXH3_createState,
    XXH3_freeState,
    XXH3_state_t,
    u128,
)

from ir_core._errors import OperandError
from ir_core._nodes import DeviceData, Generic


# Each traversal stamps the nodes it reaches with a fresh epoch instead of filling a visited
# set. Epochs are taken and nodes stamped only while this thread holds the GIL and runs no
# Python code, so two traversals never see each other's stamps.
cdef uint64_t _epoch = 0


cdef struct Frame:
    PyObject* node
    Py_ssize_t next_operand


cdef struct Order:
    PyObject** nodes    # post-order; borrowed: the roots keep every reachable node alive
    Py_ssize_t size
    Py_ssize_t cap


cdef int _reserve(void** p, Py_ssize_t* cap, Py_ssize_t need, size_t item) except -1:
    if need <= cap[0]:
        return 0
    cdef Py_ssize_t new_cap = cap[0] * 2 if cap[0] else 64
    while new_cap < need:
        new_cap *= 2
    cdef void* q = PyMem_Realloc(p[0], new_cap * item)
    if q == NULL:
        raise MemoryError()
    p[0] = q
    cap[0] = new_cap
    return 0


cdef extern from "Python.h":
    # Borrowed-pointer forms of the tuple macros: the walk below holds no references of its own.
    Py_ssize_t _tuple_size "PyTuple_GET_SIZE"(PyObject* t) nogil
    PyObject* _tuple_item "PyTuple_GET_ITEM"(PyObject* t, Py_ssize_t k) nogil


cdef tuple _root_nodes(object roots):
    """The node of each root (a Value or a node), and each root's output index (-1 for a node)."""
    if type(roots) is Value or type(roots) is Generic or type(roots) is DeviceData:
        roots = (roots,)
    nodes = []
    indices = []
    for k, r in enumerate(roots):
        if type(r) is Value:
            nodes.append((<Value>r).node)
            indices.append((<Value>r).index)
        elif type(r) is Generic or type(r) is DeviceData:
            nodes.append(r)
            indices.append(-1)
        else:
            raise OperandError(
                f"root {k} is {r!r} ({type(r).__name__}); roots must be ir_core.Value or nodes")
    return tuple(nodes), tuple(indices)


cdef enum:
    CHUNK = 1 << 16
    ITEM_MAX = 64   # room for the longest run written between two _room calls (31 bytes)


cdef struct Stream:
    XXH3_state_t* state
    char* buf
    Py_ssize_t size


cdef inline void _flush(Stream* s) noexcept:
    XXH3_128bits_update(s.state, s.buf, s.size)
    s.size = 0


cdef inline char* _room(Stream* s) noexcept:
    """Where the next items go: room for ITEM_MAX bytes, flushing the chunk when it is full."""
    if s.size + ITEM_MAX > CHUNK:
        _flush(s)
    return s.buf + s.size


cdef inline void _put_ref(Stream* s, Py_ssize_t pos, Py_ssize_t index) noexcept:
    cdef char* p = _room(s)
    p = ir_put_len(p, c't', 2)
    p = ir_put_u64(p, c'i', <uint64_t>pos)
    p = ir_put_u64(p, c'i', <uint64_t>index)
    s.size = p - s.buf


cdef inline void _put_len(Stream* s, uint32_t n) noexcept:
    s.size = ir_put_len(_room(s), c't', n) - s.buf


cdef inline void _put_record(Stream* s, PyObject* node) noexcept:
    """The node's graph-hash record: (node_hash, ((operand position, output index), ...))."""
    cdef PyObject* operands = <PyObject*>(<Node>node)._operands
    cdef Py_ssize_t k, n = _tuple_size(operands)
    cdef PyObject* v
    cdef char* p = ir_put_len(_room(s), c't', 2)
    p = ir_put_hash(p, (<Node>node)._nh_lo, (<Node>node)._nh_hi)
    s.size = ir_put_len(p, c't', <uint32_t>n) - s.buf
    for k in range(n):
        v = _tuple_item(operands, k)
        _put_ref(s, (<Node>(<Value>v).node)._pos, (<Value>v).index)


cdef int _collect(tuple roots, Order* out, Stream* s) except -1:
    """Post-order of everything reachable from ``roots``, each node once; sets ``node._pos``.

    With a stream, also writes each node's graph-hash record as the node is finished: by then
    every operand has its position. Calls no Python code (see ``_epoch``)."""
    global _epoch
    _epoch += 1
    cdef uint64_t epoch = _epoch
    cdef Frame* stack = NULL
    cdef Py_ssize_t depth = 0, stack_cap = 0, r, k
    cdef PyObject* node
    cdef PyObject* child
    cdef PyObject* operands
    try:
        for r in range(PyTuple_GET_SIZE(roots)):
            node = <PyObject*>PyTuple_GET_ITEM(roots, r)
            if (<Node>node)._mark == epoch:
                continue
            (<Node>node)._mark = epoch
            _reserve(<void**>&stack, &stack_cap, depth + 1, sizeof(Frame))
            stack[depth].node = node
            stack[depth].next_operand = 0
            depth += 1
            while depth:
                node = stack[depth - 1].node
                operands = <PyObject*>(<Node>node)._operands
                k = stack[depth - 1].next_operand
                if k < _tuple_size(operands):
                    stack[depth - 1].next_operand = k + 1
                    child = <PyObject*>(<Value>_tuple_item(operands, k)).node
                    # Nodes are built from existing nodes only, so the graph has no cycles and a
                    # node can be marked when first reached.
                    if (<Node>child)._mark != epoch:
                        (<Node>child)._mark = epoch
                        _reserve(<void**>&stack, &stack_cap, depth + 1, sizeof(Frame))
                        stack[depth].node = child
                        stack[depth].next_operand = 0
                        depth += 1
                else:
                    depth -= 1
                    _reserve(<void**>&out.nodes, &out.cap, out.size + 1, sizeof(PyObject*))
                    (<Node>node)._pos = out.size
                    out.nodes[out.size] = node
                    out.size += 1
                    if s != NULL:
                        _put_record(s, node)
    finally:
        PyMem_Free(stack)
    return 0


def post_order(roots):
    """Every node reachable from ``roots``, each once, operands before their users.

    Args:
        roots: a ``Value`` or node, or an iterable of them. Operands are visited in order, and
            roots in the order given, so the order is deterministic.

    Returns:
        A list of nodes.
    """
    cdef tuple nodes = _root_nodes(roots)[0]
    cdef Order order = Order(NULL, 0, 0)
    cdef Py_ssize_t k
    try:
        _collect(nodes, &order, NULL)
        result = PyList_New(order.size)
        for k in range(order.size):
            Py_INCREF(<object>order.nodes[k])
            PyList_SET_ITEM(result, k, <object>order.nodes[k])
        return result
    finally:
        PyMem_Free(order.nodes)


cdef XXH128_hash_t _digest(Stream* s) noexcept:
    _flush(s)
    return XXH3_128bits_digest(s.state)


def graph_hash(roots):
    """XXH3-128 of the whole graph reachable from ``roots``, sharing included.

    ``dag_hash`` hashes each node's expression tree, so it cannot tell ``f(a, b)`` from
    ``f(a, a)`` when ``a`` and ``b`` are leaves of one shape. The graph hash encodes the graph
    itself: each node, in post-order, as its ``node_hash`` and its operands' post-order positions,
    then the roots' positions (the package README gives the exact encoding). Equal graph hashes
    mean the same program over the same parameter list: it is what a compile cache keys on.

    Args:
        roots: a ``Value`` or node, or an iterable of them; a node root stands for all of its
            outputs (output index -1 in the encoding).

    Returns:
        A 128-bit int.
    """
    cdef tuple nodes, indices
    nodes, indices = _root_nodes(roots)
    cdef Order order = Order(NULL, 0, 0)
    cdef Stream s = Stream(NULL, NULL, 0)
    cdef Py_ssize_t k
    cdef XXH128_hash_t records
    cdef XXH128_hash_t h
    cdef char* p
    try:
        s.state = XXH3_createState()
        s.buf = <char*>PyMem_Malloc(CHUNK)
        if s.state == NULL or s.buf == NULL:
            raise MemoryError()
        XXH3_128bits_reset(s.state)
        _collect(nodes, &order, &s)
        records = _digest(&s)
        # The head: (node count, records hash, roots). From _collect to here no Python code
        # runs, so every _pos read is this traversal's.
        XXH3_128bits_reset(s.state)
        p = ir_put_len(s.buf, c't', 3)
        p = ir_put_u64(p, c'i', <uint64_t>order.size)
        s.size = ir_put_hash(p, records.low64, records.high64) - s.buf
        _put_len(&s, <uint32_t>PyTuple_GET_SIZE(nodes))
        for k in range(PyTuple_GET_SIZE(nodes)):
            _put_ref(&s, (<Node>PyTuple_GET_ITEM(nodes, k))._pos,
                     <Py_ssize_t><object>PyTuple_GET_ITEM(indices, k))
        h = _digest(&s)
    finally:
        PyMem_Free(order.nodes)
        PyMem_Free(s.buf)
        if s.state != NULL:
            XXH3_freeState(s.state)
    return u128(h.low64, h.high64)


def _reduce_node(Node node):
    """Pickle support: a node as the flat post-order record list of its subgraph."""
    nodes = post_order((node,))
    position = {n: k for k, n in enumerate(nodes)}
    records = []
    for n in nodes:
        if type(n) is DeviceData:
            records.append(("DeviceData", n.shape, n.handle, n.sharding))
        else:
            operands = tuple([(position[v.node], v.index) for v in n.operands])
            records.append(("Generic", n.op, operands, n.shapes, dict(n.attrs), n.sharding))
    return _rebuild_graph, (records,)


def _rebuild_graph(records):
    """Rebuild the nodes of ``_reduce_node``'s records, in order; return the last (the root)."""
    built = []
    for r in records:
        if r[0] == "DeviceData":
            built.append(DeviceData(r[1], r[2], r[3]))
        else:
            operands = tuple([Value(built[p], i) for p, i in r[2]])
            built.append(Generic(r[1], operands, r[3], r[4], r[5]))
    return built[len(built) - 1]
