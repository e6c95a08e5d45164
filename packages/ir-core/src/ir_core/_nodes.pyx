# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Immutable IR nodes whose XXH3-128 hashes are computed once, in the constructor.

The canonical encoding that feeds the hashes is specified in the package README; the tests hold
this module to a reference implementation built on the ``xxhash`` package.

Longer than 400 lines, as one extension module: every node type encodes itself through the same
C-level writer and reads the others' fields directly, which splitting would turn into calls
across modules on the hash path.
"""

cimport cython
from cpython.dict cimport PyDict_Next
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from ir_core._canon cimport (
    XXH128_hash_t,
    XXH3_128bits,
    XXH3_64bits,
    ir_put_hash,
    ir_put_len,
    ir_put_u64,
    u128,
)

from operator import index as _as_index
from types import MappingProxyType

from ir_core._errors import (
    AttributeTypeError,
    NodeSpecError,
    OperandError,
    OutputIndexError,
    ShapeError,
    ShardingTypeError,
)


# dtype names as numpy and torch spell them. Interned: a Shape's dtype is always one of these
# very string objects, so comparing dtypes is a pointer comparison.
DTYPES = frozenset((
    "bool",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
    "complex64", "complex128",
))
cdef dict _DTYPE_INTERN = {name: name for name in DTYPES}


cdef extern from *:
    """
    /* A str's UTF-8 bytes. An ASCII str (every op and attribute name in practice) is its own
       UTF-8 encoding, stored inline: read it in place rather than through a call. */
    static inline const char* ir_utf8(PyObject* s, Py_ssize_t* n) {
        if (PyUnicode_IS_COMPACT_ASCII(s)) {
            *n = PyUnicode_GET_LENGTH(s);
            return (const char*)(((PyASCIIObject*)s) + 1);
        }
        return PyUnicode_AsUTF8AndSize(s, n);
    }

    /* Code-point order of two str, as PyUnicode_Compare gives it: <0, 0 or >0. Two ASCII str
       compare as their bytes do. */
    static inline int ir_str_cmp(PyObject* a, PyObject* b) {
        if (PyUnicode_IS_COMPACT_ASCII(a) && PyUnicode_IS_COMPACT_ASCII(b)) {
            Py_ssize_t na = PyUnicode_GET_LENGTH(a), nb = PyUnicode_GET_LENGTH(b);
            int c = memcmp(((PyASCIIObject*)a) + 1, ((PyASCIIObject*)b) + 1, na < nb ? na : nb);
            return c != 0 ? c : (na > nb) - (na < nb);
        }
        return PyUnicode_Compare(a, b);
    }
    """
    const char* ir_utf8(object s, Py_ssize_t* n) except NULL
    int ir_str_cmp(object a, object b) noexcept  # both are str: no error is possible

cdef enum:
    INLINE_CAP = 512    # bytes encoded on the stack before the buffer moves to the heap
    MAX_DEPTH = 64      # nesting of tuples inside an attribute value
    SORT_INLINE = 32    # attributes sorted in a C array; more go through list.sort

cdef uint64_t CANONICAL_NAN = 0x7FF8000000000000ULL


# ---------------------------------------------------------------------------------------------
# The byte buffer the canonical encoding is written into.

cdef struct Buf:
    char* data
    Py_ssize_t size
    Py_ssize_t cap
    char inline_[INLINE_CAP]


cdef inline void buf_init(Buf* b) noexcept:
    b.data = b.inline_
    b.size = 0
    b.cap = INLINE_CAP


cdef inline void buf_free(Buf* b) noexcept:
    if b.data != b.inline_:
        PyMem_Free(b.data)
    b.data = b.inline_


cdef int buf_grow(Buf* b, Py_ssize_t need) except -1:
    cdef Py_ssize_t cap = b.cap * 2
    while cap < b.size + need:
        cap *= 2
    cdef char* p = <char*>PyMem_Malloc(cap)
    if p == NULL:
        raise MemoryError()
    memcpy(p, b.data, b.size)
    buf_free(b)
    b.data = p
    b.cap = cap
    return 0


cdef inline int put_raw(Buf* b, const char* p, Py_ssize_t n) except -1:
    if b.size + n > b.cap:
        buf_grow(b, n)
    memcpy(b.data + b.size, p, n)
    b.size += n
    return 0


cdef inline int put_byte(Buf* b, char c) except -1:
    if b.size + 1 > b.cap:
        buf_grow(b, 1)
    b.data[b.size] = c
    b.size += 1
    return 0


cdef inline int put_tag_u64(Buf* b, char tag, uint64_t v) except -1:
    if b.size + 9 > b.cap:
        buf_grow(b, 9)
    b.size = ir_put_u64(b.data + b.size, tag, v) - b.data
    return 0


cdef int _too_long(char tag, Py_ssize_t n) except -1:
    raise OverflowError(
        f"an encoded item of type {chr(tag)!r} has {n} elements or bytes; the canonical encoding "
        f"allows at most 2**32 - 1")


cdef inline int put_tag_len(Buf* b, char tag, Py_ssize_t n) except -1:
    """A type tag followed by a length or count, u32 little-endian."""
    if <size_t>n > 0xFFFFFFFFU:
        _too_long(tag, n)
    if b.size + 5 > b.cap:
        buf_grow(b, 5)
    b.size = ir_put_len(b.data + b.size, tag, <uint32_t>n) - b.data
    return 0


cdef inline int put_str(Buf* b, str s) except -1:
    cdef Py_ssize_t n
    cdef const char* p = ir_utf8(s, &n)
    put_tag_len(b, c's', n)
    return put_raw(b, p, n)


cdef int put_value(Buf* b, object v, int depth, object name, str op) except -1:
    """Encode one attribute value: type tag, then a fixed-size or length-prefixed payload.

    ``name`` and ``op`` only label the error for a value that has no encoding."""
    cdef type t = type(v)
    cdef int overflow = 0
    cdef long long i
    cdef double d
    cdef uint64_t bits
    cdef Py_ssize_t k, n
    if v is None:
        return put_byte(b, c'N')
    if t is bool:
        put_byte(b, c'B')
        return put_byte(b, 1 if v is True else 0)
    if t is int:
        i = PyLong_AsLongLongAndOverflow(v, &overflow)
        if overflow == 0:
            return put_tag_u64(b, c'i', <uint64_t>i)
        raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
        put_tag_len(b, c'J', len(raw))
        return put_raw(b, raw, len(raw))
    if t is float:
        d = v
        if d != d:
            bits = CANONICAL_NAN
        else:
            memcpy(&bits, &d, 8)
        return put_tag_u64(b, c'f', bits)
    if t is str:
        return put_str(b, v)
    if t is bytes:
        put_tag_len(b, c'y', len(<bytes>v))
        return put_raw(b, v, len(<bytes>v))
    if t is tuple:
        if depth >= MAX_DEPTH:
            raise AttributeTypeError(
                f"attribute {name!r} of {op!r}: tuple nested deeper than {MAX_DEPTH} levels; "
                f"flatten the value")
        n = PyTuple_GET_SIZE(v)
        put_tag_len(b, c't', n)
        for k in range(n):
            put_value(b, <object>PyTuple_GET_ITEM(v, k), depth + 1, name, op)
        return 0
    hint = "; use a tuple" if t is list else ""
    raise AttributeTypeError(
        f"attribute {name!r} of {op!r}: {v!r} of type {t.__name__} has no canonical encoding: "
        f"attribute values must be None, bool, int, float, str, bytes or tuples of those{hint}")


cdef tuple put_attrs(Buf* b, object attrs, str op):
    """Encode a mapping, keys in code-point order; return it as a flat (k0, v0, k1, v1, ...),
    untracked by the cyclic GC (see _untracked)."""
    cdef dict src
    cdef Py_ssize_t n, k, j, pos = 0
    cdef PyObject* key
    cdef PyObject* val
    cdef PyObject* keys[SORT_INLINE]
    cdef PyObject* vals[SORT_INLINE]
    if attrs is None:
        put_tag_len(b, c'm', 0)
        return _NO_ATTRS
    if type(attrs) is dict:
        src = <dict>attrs
    else:
        try:
            src = dict(attrs)
        except (TypeError, ValueError):
            raise AttributeTypeError(
                f"attrs of {op!r} must be a mapping of str to values, got {attrs!r}") from None
    n = len(src)
    put_tag_len(b, c'm', n)
    if n == 0:
        return _NO_ATTRS
    if n > SORT_INLINE:
        for name in src:
            if type(name) is not str:
                _bad_key(name, op)
        return _put_items(b, tuple(sorted(src.items())), op)
    # Insertion sort in C arrays: n is small, and comparing str objects is a memcmp.
    k = 0
    while PyDict_Next(src, &pos, &key, &val):
        if type(<object>key) is not str:
            _bad_key(<object>key, op)
        j = k
        while j > 0 and ir_str_cmp(<object>keys[j - 1], <object>key) > 0:
            keys[j] = keys[j - 1]
            vals[j] = vals[j - 1]
            j -= 1
        keys[j] = key
        vals[j] = val
        k += 1
    cdef Py_ssize_t start = b.size
    for k in range(n):
        put_str(b, <str>keys[k])
        put_value(b, <object>vals[k], 0, <object>keys[k], op)
    return _attrs_tuple(b.data + start, b.size - start, keys, vals, n)


# Nodes whose attributes encode alike share one attribute tuple: the encoding determines every
# value and its type (a NaN's sign and payload aside, which no hash sees either), and graphs
# repeat a few attribute sets (alpha=1, dim=-1, keepdim=False) over thousands of nodes. A
# direct-mapped cache, bounded by its slot count and by the size of what a slot may hold (a
# larger encoding is not cached: its tuple is the node's own); each slot keeps the encoding it
# was filled from, compared byte for byte before a hit. Only the GIL's holder touches it.
cdef enum:
    ATTRS_SLOTS = 1024
    ATTRS_CACHED_MAX = 256  # bytes of encoding

cdef struct AttrsSlot:
    uint64_t h
    PyObject* enc   # bytes, owned
    PyObject* tup   # tuple, owned

cdef AttrsSlot _attrs_cache[ATTRS_SLOTS]


cdef tuple _attrs_tuple(const char* enc, Py_ssize_t size, PyObject** keys, PyObject** vals,
                        Py_ssize_t n):
    """The flat (k0, v0, k1, v1, ...) tuple of attributes encoded as ``enc[:size]``."""
    cdef uint64_t h = 0
    cdef AttrsSlot* slot = NULL
    cdef Py_ssize_t k
    if size <= ATTRS_CACHED_MAX:
        h = XXH3_64bits(enc, size)
        slot = &_attrs_cache[h & (ATTRS_SLOTS - 1)]
        if (slot.enc != NULL and slot.h == h and PyBytes_GET_SIZE(<object>slot.enc) == size
                and memcmp(PyBytes_AS_STRING(<object>slot.enc), enc, size) == 0):
            return <tuple>slot.tup
    cdef tuple out = PyTuple_New(2 * n)
    for k in range(n):
        Py_INCREF(<object>keys[k])
        PyTuple_SET_ITEM(out, 2 * k, <object>keys[k])
        Py_INCREF(<object>vals[k])
        PyTuple_SET_ITEM(out, 2 * k + 1, <object>vals[k])
    _untracked(out)
    if slot == NULL:
        return out
    cdef bytes raw = enc[:size]
    cdef PyObject* old_enc = slot.enc
    cdef PyObject* old_tup = slot.tup
    Py_INCREF(raw)
    Py_INCREF(out)
    slot.h = h
    slot.enc = <PyObject*>raw
    slot.tup = <PyObject*>out
    Py_XDECREF(old_enc)  # (last: freeing them runs no code that could see the slot half-set)
    Py_XDECREF(old_tup)
    return out


cdef tuple _put_items(Buf* b, tuple items, str op):
    """More attributes than the C arrays hold: ``items`` sorted by name, encoded, flattened."""
    for name, value in items:
        put_str(b, name)
        put_value(b, value, 0, name, op)
    return _untracked(tuple([x for item in items for x in item]))


cdef int _bad_key(object key, str op) except -1:
    raise AttributeTypeError(
        f"attribute name {key!r} of {op!r} is a {type(key).__name__}; attribute names must be str")


cdef tuple _NO_ATTRS = ()
cdef object _EMPTY_ATTRS_VIEW = MappingProxyType({})


cdef bytes _sharding_bytes(object sharding):
    if sharding is None:
        return None
    try:
        method = sharding.canonical_bytes
    except AttributeError:
        raise ShardingTypeError(
            f"sharding {sharding!r} of type {type(sharding).__name__} does not supply its "
            f"canonical bytes: an annotation must define canonical_bytes() -> bytes "
            f"(ir_sharding.ShardingSpec does), or be None for unsharded") from None
    raw = method()
    if type(raw) is not bytes:
        raise ShardingTypeError(
            f"{type(sharding).__name__}.canonical_bytes() returned {type(raw).__name__}, "
            f"expected bytes")
    return raw


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void* op)


cdef inline tuple _untracked(tuple t):
    """Take a tuple out of the cyclic GC's view, as the collector itself would on its next pass.

    Only for tuples of Values, Shapes or attribute values: none of those is a container the
    collector tracks, so such a tuple can never be part of a reference cycle. Untracking at once
    keeps the collector from rescanning every node's tuples while a large graph is being built.
    """
    PyObject_GC_UnTrack(<void*>t)  # a no-op for a tuple already untracked
    return t


# ---------------------------------------------------------------------------------------------

cdef object INT64_MAX = 2 ** 63 - 1


cdef object _dim_as_int(object d, Py_ssize_t k, tuple dims):
    if type(d) is bool:
        raise ShapeError(f"dim {k} of {dims!r} is a bool; dims must be integers")
    try:
        return _as_index(d)
    except TypeError:
        raise ShapeError(
            f"dim {k} of {dims!r} is {d!r} ({type(d).__name__}); dims must be integers") from None


@cython.final
@cython.no_gc
@cython.freelist(64)
cdef class Shape:
    """The dtype and dims of one output: ``Shape("float32", (4, 8))``.

    Args:
        dtype: a name from ``DTYPES``, spelled as numpy and torch spell it.
        dims: non-negative integers, one per dimension; ``()`` for a scalar.
    """

    def __cinit__(self, dtype, dims):
        interned = _DTYPE_INTERN.get(dtype) if type(dtype) is str else None
        if interned is None:
            raise ShapeError(
                f"unknown dtype {dtype!r}: expected one of {', '.join(sorted(DTYPES))}")
        if type(dims) is not tuple:
            if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
                raise ShapeError(f"dims must be a sequence of ints, got {dims!r}")
            dims = tuple(dims)
        cdef list fixed = None
        for k, d in enumerate(<tuple>dims):
            if type(d) is not int:
                d = _dim_as_int(d, k, dims)
                if fixed is None:
                    fixed = list(dims)
                fixed[k] = d
            if d < 0 or d > INT64_MAX:
                raise ShapeError(f"dim {k} of {dims!r} is {d}; dims must be in [0, 2**63)")
        if fixed is not None:
            dims = tuple(fixed)
        self.dtype = <str>interned
        self.dims = <tuple>dims
        cdef Buf b
        buf_init(&b)
        try:
            # Exactly put_value((dtype, dims)), without building that tuple.
            put_tag_len(&b, c't', 2)
            put_str(&b, self.dtype)
            put_tag_len(&b, c't', len(self.dims))
            for d in self.dims:
                put_tag_u64(&b, c'i', <uint64_t>(<long long>d))
            self._enc = b.data[:b.size]
            self._hash = <Py_hash_t>XXH3_128bits(b.data, b.size).low64
        finally:
            buf_free(&b)
        if self._hash == -1:
            self._hash = -2

    @property
    def rank(self):
        return len(self.dims)

    @property
    def numel(self):
        cdef object n = 1
        for d in self.dims:
            n *= d
        return n

    def __eq__(self, other):
        if type(other) is not Shape:
            return NotImplemented
        return self.dtype is (<Shape>other).dtype and self.dims == (<Shape>other).dims

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"Shape({self.dtype!r}, {self.dims!r})"

    def __str__(self):
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"

    def __reduce__(self):
        return Shape, (self.dtype, self.dims)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


@cython.no_gc
cdef class Node:
    """An immutable IR node. Build a ``Generic`` or a ``DeviceData``; ``Node`` is their base.

    Every field is read-only, and so are both hashes, computed once when the node is built.
    ``node.clone(**changes)`` is how a node "changes": it returns a new node.

    ``Node`` is for ``isinstance`` checks. It has no constructor of its own (one would cost every
    node a second argument parse); an instance made by calling it is empty, and ``Value`` and the
    traversals refuse it.
    """

    @property
    def kind(self):
        """The node kind's name: ``"Generic"`` or ``"DeviceData"``; hashed."""
        return type(self).__name__

    @property
    def op(self):
        return self._op

    @property
    def operands(self):
        """The inputs, a tuple of ``Value``."""
        return self._operands

    @property
    def shapes(self):
        """One ``Shape`` per output."""
        return self._shapes

    @property
    def attrs(self):
        """A read-only mapping of attribute name to value, in code-point order of the names."""
        cdef tuple a = self._attrs
        if self._attrs_view is None:
            self._attrs_view = MappingProxyType(
                {a[k]: a[k + 1] for k in range(0, len(a), 2)}) if a else _EMPTY_ATTRS_VIEW
        return self._attrs_view

    @property
    def sharding(self):
        """The sharding annotation, or ``None`` when unsharded."""
        return self._sharding

    @property
    def origin(self):
        """Where the node was recorded, as its recorder gave it (``Generic(..., origin=...)``),
        or None. Not hashed and not compared: it does not change what the node computes.
        ``clone`` and ``relink`` keep it; pickling drops it."""
        return self._origin

    @property
    def node_hash(self):
        """XXH3-128 of the node itself: kind, op, shapes, attrs, sharding (a 128-bit int)."""
        return u128(self._nh_lo, self._nh_hi)

    @property
    def dag_hash(self):
        """XXH3-128 of ``node_hash`` and each operand's ``dag_hash`` and output index, in order."""
        return u128(self._dh_lo, self._dh_hi)

    @property
    def outputs(self):
        """A ``Value`` for each output."""
        return tuple([Value(self, k) for k in range(len(self._shapes))])

    # Equality and hashing are by identity, as for any Python object: two nodes with equal
    # dag_hash may still differ (which leaves they read), and identity keeps dicts keyed by nodes
    # fast even when thousands of leaves share one shape. Compare graphs with graph_hash.

    def __copy__(self):
        return self

    def __reduce__(self):
        # Pickled as the flat, post-order list of its whole subgraph, so a deep chain pickles
        # without recursion and shared operands stay shared.
        from ir_core._graph import _reduce_node
        return _reduce_node(self)

    def __repr__(self):
        if self._op is None:
            return "<empty Node: build a Generic or a DeviceData>"
        shapes = ", ".join(map(str, self._shapes))
        return f"<{self.kind} {self._op} -> ({shapes}) dag_hash={self.dag_hash:032x}>"


cdef int _seal(Node self, Buf* b) except -1:
    """Append the sharding to the node record in ``b``, then set both hashes."""
    cdef XXH128_hash_t h
    if self._sharding_bytes is None:
        put_byte(b, c'N')
    else:
        put_tag_len(b, c'y', len(self._sharding_bytes))
        put_raw(b, self._sharding_bytes, len(self._sharding_bytes))
    h = XXH3_128bits(b.data, b.size)
    self._nh_lo = h.low64
    self._nh_hi = h.high64
    return _seal_dag(self, b)


cdef int _seal_dag(Node self, Buf* b) except -1:
    """Set dag_hash from node_hash and the operands: (node_hash, ((dag_hash, index), ...))."""
    cdef XXH128_hash_t h
    cdef Value v
    cdef Py_ssize_t k, n = PyTuple_GET_SIZE(self._operands)
    cdef char* p
    b.size = 0
    if 31 + 35 * n > b.cap:
        buf_grow(b, 31 + 35 * n)
    p = ir_put_len(b.data, c't', 2)
    p = ir_put_hash(p, self._nh_lo, self._nh_hi)
    p = ir_put_len(p, c't', <uint32_t>n)
    for k in range(n):
        v = <Value>PyTuple_GET_ITEM(self._operands, k)
        p = ir_put_len(p, c't', 2)
        p = ir_put_hash(p, v.node._dh_lo, v.node._dh_hi)
        p = ir_put_u64(p, c'i', <uint64_t>v.index)
    h = XXH3_128bits(b.data, p - b.data)
    self._dh_lo = h.low64
    self._dh_hi = h.high64
    return 0


cdef int _put_head(Buf* b, bytes kind_prefix, str op, tuple shapes) except -1:
    """Open the node record: a 5-tuple of kind, op, shapes, (attrs and sharding follow)."""
    cdef Py_ssize_t k, n = PyTuple_GET_SIZE(shapes)
    cdef bytes enc
    put_raw(b, kind_prefix, len(kind_prefix))
    put_str(b, op)
    put_tag_len(b, c't', n)
    for k in range(n):
        enc = (<Shape>PyTuple_GET_ITEM(shapes, k))._enc
        put_raw(b, enc, len(enc))
    return 0


cdef bytes _kind_prefix(str kind):
    cdef Buf b
    buf_init(&b)
    try:
        put_tag_len(&b, c't', 5)
        put_str(&b, kind)
        return b.data[:b.size]
    finally:
        buf_free(&b)


cdef bytes _GENERIC_PREFIX = _kind_prefix("Generic")
cdef bytes _DEVICE_DATA_PREFIX = _kind_prefix("DeviceData")
cdef tuple _NO_OPERANDS = ()


cdef tuple _check_operands(object operands, str op):
    cdef tuple ops
    if type(operands) is tuple:
        ops = <tuple>operands
    else:
        if isinstance(operands, Value) or not hasattr(operands, "__iter__"):
            raise OperandError(
                f"operands of {op!r} must be a sequence of Value, got {operands!r}")
        ops = tuple(operands)
    for k in range(PyTuple_GET_SIZE(ops)):
        v = <object>PyTuple_GET_ITEM(ops, k)
        if type(v) is not Value:
            raise OperandError(
                f"operand {k} of {op!r} is {v!r} ({type(v).__name__}); operands must be "
                f"ir_core.Value: wrap a node as Value(node, output_index)")
    return ops


cdef tuple _check_shapes(object shapes, str op):
    cdef tuple out
    if type(shapes) is tuple:
        out = <tuple>shapes
    else:
        if type(shapes) is Shape or not hasattr(shapes, "__iter__"):
            raise NodeSpecError(
                f"shapes of {op!r} must be a sequence of Shape, one per output, got "
                f"{shapes!r}; for one output write (shape,)")
        out = tuple(shapes)
    for k in range(PyTuple_GET_SIZE(out)):
        s = <object>PyTuple_GET_ITEM(out, k)
        if type(s) is not Shape:
            raise NodeSpecError(
                f"shape {k} of {op!r} is {s!r} ({type(s).__name__}); expected ir_core.Shape")
    return out


cdef str _check_op(object op):
    if type(op) is not str or len(<str>op) == 0:
        raise NodeSpecError(f"op must be a non-empty str, got {op!r}")
    return <str>op


cdef dict _take_changes(dict changes, tuple fields, str kind):
    unknown = sorted(set(changes) - set(fields))
    if unknown:
        raise NodeSpecError(
            f"{kind}.clone() got unknown field(s) {', '.join(unknown)}; "
            f"{kind} fields are {', '.join(fields)}")
    return changes


@cython.final
@cython.no_gc
cdef class Generic(Node):
    """An operation: ``Generic(op, operands, shapes, attrs=None, sharding=None, origin=None)``.

    Args:
        op: the operation's name, e.g. ``"aten::add.Tensor"``.
        operands: the inputs, a sequence of ``Value``.
        shapes: one ``Shape`` per output.
        attrs: a mapping of str to None, bool, int, float, str, bytes or nested tuples of those.
        sharding: ``None``, or an annotation that defines ``canonical_bytes() -> bytes``.
        origin: where the node was recorded, any object that refers to no node (a front end's
            source location); neither hashed nor compared.
    """

    def __cinit__(self, op, operands, shapes, attrs=None, sharding=None, origin=None):
        cdef Buf b
        if op is _REBUILD:
            _init_with_operands(self, <Generic?>shapes, operands)
            return
        self._op = _check_op(op)
        self._operands = _untracked(_check_operands(operands, self._op))
        self._shapes = _untracked(_check_shapes(shapes, self._op))
        if sharding is not None:  # else None already: both fields start as None
            self._sharding_bytes = _sharding_bytes(sharding)
            self._sharding = sharding
        self._origin = origin
        buf_init(&b)
        try:
            _put_head(&b, _GENERIC_PREFIX, self._op, self._shapes)
            self._attrs = put_attrs(&b, attrs, self._op)
            _seal(self, &b)
        finally:
            buf_free(&b)

    def clone(self, **changes):
        """A new ``Generic`` with the given fields replaced; this node is left as it is.

        Fields: ``op``, ``operands``, ``shapes``, ``attrs``, ``sharding``, ``origin``.
        """
        _take_changes(changes, _GENERIC_FIELDS, "Generic")
        if len(changes) == 1 and "operands" in changes:
            return Generic(_REBUILD, changes["operands"], self)
        return Generic(
            changes.get("op", self._op),
            changes.get("operands", self._operands),
            changes.get("shapes", self._shapes),
            changes.get("attrs", self.attrs),
            changes.get("sharding", self._sharding),
            changes.get("origin", self._origin),
        )


cdef tuple _GENERIC_FIELDS = ("op", "operands", "shapes", "attrs", "sharding", "origin")

# Passed as ``op`` to build a Generic that copies everything but its operands from another one:
# the node record does not include operands, so node_hash is copied and only dag_hash is
# computed. Private to this package (clone(operands=...) and relink).
cdef object _REBUILD = object()


cdef int _copy_record(Node self, Node src) except -1:
    """``self``, a new node, takes ``src``'s record (every field node_hash hashes, the
    annotation's object, the origin) and node_hash; operands and dag_hash are the caller's."""
    self._op = src._op
    self._shapes = src._shapes
    self._attrs = src._attrs
    self._attrs_view = src._attrs_view
    self._sharding = src._sharding
    self._sharding_bytes = src._sharding_bytes
    self._origin = src._origin
    self._nh_lo = src._nh_lo
    self._nh_hi = src._nh_hi
    return 0


cdef int _init_with_operands(Generic self, Generic src, object operands) except -1:
    cdef Buf b
    _copy_record(self, src)
    self._operands = _untracked(_check_operands(operands, src._op))
    buf_init(&b)
    try:
        _seal_dag(self, &b)
    finally:
        buf_free(&b)
    return 0


cdef int _put_record(Buf* b, Node n) except -1:
    """Re-encode the node record that node_hash hashes, from the node's fields."""
    cdef Py_ssize_t k, m = PyTuple_GET_SIZE(n._attrs) // 2
    _put_head(b, _GENERIC_PREFIX if type(n) is Generic else _DEVICE_DATA_PREFIX, n._op, n._shapes)
    put_tag_len(b, c'm', m)
    for k in range(m):
        name = <str>PyTuple_GET_ITEM(n._attrs, 2 * k)
        put_str(b, name)
        put_value(b, <object>PyTuple_GET_ITEM(n._attrs, 2 * k + 1), 0, name, n._op)
    if n._sharding_bytes is None:
        put_byte(b, c'N')
    else:
        put_tag_len(b, c'y', len(n._sharding_bytes))
        put_raw(b, n._sharding_bytes, len(n._sharding_bytes))
    return 0


cdef inline int _put_ref(Buf* b, Py_ssize_t pos, Py_ssize_t index) except -1:
    put_tag_len(b, c't', 2)
    put_tag_u64(b, c'i', <uint64_t>pos)
    put_tag_u64(b, c'i', <uint64_t>index)
    return 0


cdef bytes _fingerprint(PyObject** nodes, Py_ssize_t count, tuple roots, tuple indices):
    cdef Buf b
    cdef Node n
    cdef Value v
    cdef Py_ssize_t k, j, m
    buf_init(&b)
    try:
        put_tag_len(&b, c't', 3)
        put_tag_u64(&b, c'i', <uint64_t>count)
        put_tag_len(&b, c't', count)
        for k in range(count):
            n = <Node>nodes[k]
            put_tag_len(&b, c't', 2)
            _put_record(&b, n)
            m = PyTuple_GET_SIZE(n._operands)
            put_tag_len(&b, c't', m)
            for j in range(m):
                v = <Value>PyTuple_GET_ITEM(n._operands, j)
                _put_ref(&b, v.node._pos, v.index)
        m = PyTuple_GET_SIZE(roots)
        put_tag_len(&b, c't', m)
        for k in range(m):
            _put_ref(&b, (<Node>PyTuple_GET_ITEM(roots, k))._pos,
                     <Py_ssize_t><object>PyTuple_GET_ITEM(indices, k))
        return b.data[:b.size]
    finally:
        buf_free(&b)


cdef int _init_holding(DeviceData self, DeviceData src, object handle) except -1:
    """``self``, a new DeviceData, as ``src`` (every field, both hashes) but holding ``handle``."""
    _copy_record(self, src)
    self._operands = src._operands
    self._dh_lo, self._dh_hi = src._dh_lo, src._dh_hi
    self.handle = handle
    return 0


cdef Node _with_operands(Node src, tuple operands):
    return Generic(_REBUILD, operands, src)
cdef tuple _DEVICE_DATA_FIELDS = ("shape", "handle", "sharding")


@cython.final
@cython.no_gc
cdef class DeviceData(Node):
    """A leaf that holds a backend data handle: ``DeviceData(shape, handle=None, sharding=None)``.

    The handle is never hashed: the same program runs on new data. Its op is ``"device_data"``,
    it has no operands and no attributes.
    """

    cdef readonly object handle

    def __cinit__(self, shape, handle=None, sharding=None):
        cdef Buf b
        if shape is _REBUILD:  # (holding: a copy of ``sharding``, a DeviceData, but its handle)
            _init_holding(self, <DeviceData?>sharding, handle)
            return
        if type(shape) is not Shape:
            raise NodeSpecError(
                f"shape of a DeviceData must be an ir_core.Shape, got {shape!r} "
                f"({type(shape).__name__})")
        self._op = "device_data"
        self._operands = _NO_OPERANDS
        self._shapes = _untracked((shape,))
        self._attrs = _NO_ATTRS
        self._attrs_view = _EMPTY_ATTRS_VIEW
        self._sharding_bytes = _sharding_bytes(sharding)
        self._sharding = sharding
        self.handle = handle
        buf_init(&b)
        try:
            _put_head(&b, _DEVICE_DATA_PREFIX, self._op, self._shapes)
            put_tag_len(&b, c'm', 0)
            _seal(self, &b)
        finally:
            buf_free(&b)

    @property
    def shape(self):
        return self._shapes[0]

    def holding(self, handle):
        """A new ``DeviceData`` with this one's shape and sharding, holding ``handle``: its
        hashes are this node's, copied (the handle is never hashed), so nothing is encoded or
        hashed again. ``clone(handle=h)`` is the same node."""
        return DeviceData(_REBUILD, handle, self)

    def clone(self, **changes):
        """A new ``DeviceData`` with the given fields replaced; this node is left as it is.

        Fields: ``shape``, ``handle``, ``sharding``.
        """
        _take_changes(changes, _DEVICE_DATA_FIELDS, "DeviceData")
        if len(changes) == 1 and "handle" in changes:
            return DeviceData(_REBUILD, changes["handle"], self)
        return DeviceData(
            changes.get("shape", self._shapes[0]),
            changes.get("handle", self.handle),
            changes.get("sharding", self._sharding),
        )


@cython.final
@cython.no_gc
@cython.freelist(64)
cdef class Value:
    """One output of a node: ``Value(node, index=0)``."""

    def __cinit__(self, node, Py_ssize_t index=0):
        if type(node) is not Generic and type(node) is not DeviceData:
            raise OperandError(
                f"Value(node, index) needs an ir_core Generic or DeviceData, got {node!r} "
                f"({type(node).__name__})")
        cdef Py_ssize_t n = PyTuple_GET_SIZE((<Node>node)._shapes)
        if index < 0 or index >= n:
            raise OutputIndexError(
                f"output index {index} is out of range for {(<Node>node)._op!r}, which has "
                f"{n} output(s)")
        self.node = <Node>node
        self.index = index

    @property
    def shape(self):
        """The ``Shape`` of this output."""
        return self.node._shapes[self.index]

    def __eq__(self, other):
        if type(other) is not Value:
            return NotImplemented
        return self.node is (<Value>other).node and self.index == (<Value>other).index

    def __hash__(self):
        return hash((id(self.node), self.index))

    def __repr__(self):
        return f"Value({self.node!r}, {self.index})"

    def __reduce__(self):
        return Value, (self.node, self.index)

    def __copy__(self):
        return self
