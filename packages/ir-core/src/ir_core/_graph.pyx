# cython: language_level=3, boundscheck=False, wraparound=False
"""Traversal of IR graphs and the graph hash: iterative, linear, no recursion limit.

Longer than 400 lines, as one extension module: post-order, the graph hash and fingerprint,
pickling and relink share one iterative walker and one hashing stream, C to C.
"""

from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport uint32_t, uint64_t

from ir_core._nodes cimport Node, Value, _fingerprint, _with_operands
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

from ir_core._errors import CycleError, OperandError, ShapeError
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
    int PyGC_Disable()
    int PyGC_Enable()
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


def graph_fingerprint(roots):
    """The graph's exact canonical bytes: what ``graph_hash`` identifies, in full.

    Every node in post-order as its whole node record (the bytes its ``node_hash`` hashes: kind,
    op, shapes, attributes, sharding) with its operands' post-order positions, then the roots;
    the package README gives the encoding. Two graphs have equal fingerprints exactly when they
    are the same program over the same parameter list, so a compile cache that finds an entry by
    ``graph_hash`` compares fingerprints to rule out a collision.

    Args:
        roots: a ``Value`` or node, or an iterable of them.

    Returns:
        bytes.
    """
    cdef tuple nodes, indices
    nodes, indices = _root_nodes(roots)
    cdef Order order = Order(NULL, 0, 0)
    # From _collect to the last _pos read no Python code may run (see _epoch); encoding
    # allocates bytes objects only, but a collection triggered meanwhile could run finalizers.
    cdef int gc_was_enabled = PyGC_Disable()
    try:
        _collect(nodes, &order, NULL)
        return _fingerprint(order.nodes, order.size, nodes, indices)
    finally:
        PyMem_Free(order.nodes)
        if gc_was_enabled:
            PyGC_Enable()


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


cdef struct RelinkFrame:
    PyObject* node
    Py_ssize_t next_operand
    Py_ssize_t key          # index of the node's replacement, or -1 when it is not replaced


cdef struct Relink:
    RelinkFrame* stack
    Py_ssize_t depth
    Py_ssize_t stack_cap
    PyObject** result       # per visited node (by _pos): what its uses become; NULL until done
    Py_ssize_t size
    Py_ssize_t cap
    uint64_t key_epoch
    uint64_t epoch


cdef int _cycle(Node n) except -1:
    raise CycleError(
        f"the replacements form a cycle through {n!r}: a replacement (or one of its operands) "
        f"depends on a node it replaces. Replace the node's uses with a node built from its "
        f"operands instead")


cdef inline int _enter(Relink* w, PyObject* node) except -1:
    """Push ``node`` unless it is done; a node reached again before it is done closes a cycle."""
    cdef Py_ssize_t key = -1
    if (<Node>node)._mark == w.epoch:
        if w.result[(<Node>node)._pos] == NULL:
            _cycle(<Node>node)
        return 0
    if (<Node>node)._mark == w.key_epoch:
        key = (<Node>node)._pos
    (<Node>node)._mark = w.epoch
    if w.size == w.cap:
        _reserve(<void**>&w.result, &w.cap, w.size + 1, sizeof(PyObject*))
    (<Node>node)._pos = w.size
    w.result[w.size] = NULL
    w.size += 1
    if w.depth == w.stack_cap:
        _reserve(<void**>&w.stack, &w.stack_cap, w.depth + 1, sizeof(RelinkFrame))
    w.stack[w.depth].node = node
    w.stack[w.depth].next_operand = 0
    w.stack[w.depth].key = key
    w.depth += 1
    return 0


cdef tuple _relinked_operands(Relink* w, PyObject* operands, Py_ssize_t first):
    """The operands with each relinked value substituted; operand ``first`` is the first one
    that changed."""
    cdef Py_ssize_t k, n = _tuple_size(operands)
    cdef PyObject* v
    cdef PyObject* old
    cdef PyObject* new
    cdef list out = list(<tuple>operands)
    for k in range(first, n):
        v = _tuple_item(operands, k)
        old = <PyObject*>(<Value>v).node
        new = w.result[(<Node>old)._pos]
        if new != old:
            out[k] = Value(<object>new, (<Value>v).index)
    return tuple(out)


cdef inline Py_ssize_t _first_changed(Relink* w, PyObject* operands) noexcept:
    cdef Py_ssize_t k, n = _tuple_size(operands)
    cdef PyObject* old
    for k in range(n):
        old = <PyObject*>(<Value>_tuple_item(operands, k)).node
        if w.result[(<Node>old)._pos] != old:
            return k
    return -1


cdef int _relink_walk(Relink* w, tuple roots, tuple replacements, list built) except -1:
    cdef RelinkFrame* top
    cdef PyObject* node
    cdef PyObject* child
    cdef PyObject* operands
    cdef Py_ssize_t r, k
    for r in range(PyTuple_GET_SIZE(roots)):
        _enter(w, <PyObject*>PyTuple_GET_ITEM(roots, r))
        while w.depth:
            top = &w.stack[w.depth - 1]
            node = top.node
            if top.key >= 0:
                # A replaced node: its uses become whatever its replacement relinks to.
                child = <PyObject*>PyTuple_GET_ITEM(replacements, top.key)
                if top.next_operand == 0:
                    top.next_operand = 1
                    _enter(w, child)
                    continue
                w.result[(<Node>node)._pos] = w.result[(<Node>child)._pos]
                w.depth -= 1
                continue
            operands = <PyObject*>(<Node>node)._operands
            k = top.next_operand
            if k < _tuple_size(operands):
                top.next_operand = k + 1
                _enter(w, <PyObject*>(<Value>_tuple_item(operands, k)).node)
                continue
            w.depth -= 1
            k = _first_changed(w, operands)
            if k < 0:
                w.result[(<Node>node)._pos] = node
            else:
                rebuilt = _with_operands(<Node>node, _relinked_operands(w, operands, k))
                built.append(rebuilt)
                w.result[(<Node>node)._pos] = <PyObject*>rebuilt
    return 0


def relink(roots, replacements):
    """The graph of ``roots`` with every use of a replaced node going through its replacement.

    A node is rebuilt (``clone(operands=...)``: same ``node_hash``, new ``dag_hash``) exactly
    when one of its operands changed, and at most once; everything else, every subgraph that
    reaches no replaced node included, is the very same object. A replacement's own operands are
    relinked too, and a replacement that is itself replaced is followed, so no replaced node is
    reachable from the result. Iterative: a million-node chain works. Nothing is modified: on an
    error the old graph is as it was and nothing new is kept.

    Args:
        roots: a ``Value`` or node, or an iterable of them.
        replacements: a mapping of old node to new node. The new node must have the same output
            shapes as the old one, so that every consumer stays valid.

    Returns:
        The new roots, in the form given: one ``Value`` or node, or a list of them.

    Raises:
        OperandError: a root, key or replacement that is not a node (or a Value, for roots).
        ShapeError: a replacement whose output shapes differ from those of the node it replaces.
        CycleError: a replacement that depends on a node it replaces.
    """
    cdef bint single = type(roots) is Value or type(roots) is Generic or type(roots) is DeviceData
    cdef tuple nodes, indices
    roots = (roots,) if single else tuple(roots)
    nodes, indices = _root_nodes(roots)
    try:
        items = replacements.items()
    except AttributeError:
        raise OperandError(
            f"replacements must be a mapping of old node to new node, got {replacements!r} "
            f"({type(replacements).__name__})") from None
    cdef list keys = [], news = []
    for old, new in items:
        for what, n in (("key", old), ("replacement", new)):
            if type(n) is not Generic and type(n) is not DeviceData:
                raise OperandError(
                    f"replacement {what} {n!r} ({type(n).__name__}) is not an ir_core node; "
                    f"relink maps old nodes to new nodes")
        if (<Node>old)._shapes != (<Node>new)._shapes:
            raise ShapeError(
                f"the replacement for {old!r} has output shapes "
                f"({', '.join(map(str, (<Node>new)._shapes))}), not the replaced node's "
                f"({', '.join(map(str, (<Node>old)._shapes))}); consumers would no longer "
                f"match their operands. Replace a node with one of the same output shapes")
        keys.append(old)
        news.append(new)
    if not keys:
        return roots[0] if single else list(roots)

    global _epoch
    cdef Relink w
    w.stack = NULL
    w.result = NULL
    w.depth = w.stack_cap = w.size = w.cap = 0
    cdef list built = []
    cdef Py_ssize_t k
    # No Python code may run between stamping and the last read of a stamp (see _epoch); only
    # a collection triggered by allocating the rebuilt nodes' tuples could run any (finalizers).
    cdef int gc_was_enabled = PyGC_Disable()
    try:
        _epoch += 1
        w.key_epoch = _epoch
        for k in range(len(keys)):
            (<Node>keys[k])._mark = w.key_epoch
            (<Node>keys[k])._pos = k
        _epoch += 1
        w.epoch = _epoch
        _relink_walk(&w, nodes, tuple(news), built)
        out = []
        for k in range(PyTuple_GET_SIZE(nodes)):
            old = <object>PyTuple_GET_ITEM(nodes, k)
            new = <object>w.result[(<Node>old)._pos]
            i = <Py_ssize_t><object>PyTuple_GET_ITEM(indices, k)
            if new is old:
                out.append(roots[k])
            else:
                out.append(new if i < 0 else Value(new, i))
    finally:
        PyMem_Free(w.stack)
        PyMem_Free(w.result)
        if gc_was_enabled:
            PyGC_Enable()
    return out[0] if single else out
