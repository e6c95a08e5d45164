# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Tracing's hot path in C: the lazy tensor's ``__torch_dispatch__`` for an op it has seen.

Per ATen overload, a ``Positional`` preparation turns a call's positional arguments into the
shape-inference memo key, the operands and the attributes: exactly what ``_record.prepare``
gives (tests hold the two together). ``torch_dispatch`` then finds the memoized output layout,
builds the wrapper tensor and its node, and registers it among the live tensors; anything else
(keyword arguments, a first sighting, several outputs, views, in-place ops) goes to the Python
dispatch it was configured with.

The live-tensor registry holds weak references without callbacks. Such a reference holds no
strong reference to anything, so it cannot be part of a reference cycle, and it is taken out
of the cyclic garbage collector: a traced graph of ten thousand live tensors then costs the
collector nothing.
"""

cimport cython
from cpython.object cimport PyObject, PyObject_Call
from cpython.weakref cimport PyWeakref_NewRef

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void* op)
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL

# Argument kinds of an op's plan, defined here once: _record takes them from KINDS.
cdef enum:
    TENSOR = 0
    TENSOR_LIST = 1
    OPT_TENSOR = 2
    SCALAR = 3
    OTHER = 4

KINDS = (TENSOR, TENSOR_LIST, OPT_TENSOR, SCALAR, OTHER)

# What configure() hands over from the Python side of the front end.
cdef object LAZY = None          # the LazyTensor class
cdef object MAKE = None          # torch.Tensor._make_wrapper_subclass
cdef object GENERIC = None       # ir_core.Generic
cdef object VALUE = None         # ir_core.Value
cdef dict META = None            # _record._META: memo key -> output layout
cdef dict LEAVES = None          # _record._NUMBER_LEAVES: (type, number, float dtype) -> leaf
cdef frozenset FLOATS = None
cdef frozenset SPECIAL = None    # floats kept as constants, never lifted
cdef object number_leaf = None
cdef object float_dtype = None
cdef object scalar_leaf = None
cdef object attr_value = None
cdef object as_value = None
cdef object slow = None          # the Python __torch_dispatch__ body
cdef object record = None
cdef list LIVE = None            # weak references to every lazy tensor, in creation order
cdef Py_ssize_t compact_at = 10_000
cdef object compact = None       # drops the dead references and sets the next threshold
cdef dict PLANS = {}             # id(OpOverload) -> Positional, for recordable non-view ops
cdef dict NO_KWARGS = {}
cdef object MISSING = None


def configure(**parts):
    """Hand the Python side's classes, tables and fallbacks over (once, at import)."""
    global LAZY, MAKE, GENERIC, VALUE, META, LEAVES, FLOATS, SPECIAL, number_leaf, float_dtype
    global scalar_leaf, attr_value, as_value, slow, record, LIVE, compact, MISSING
    LAZY = parts["lazy"]
    MAKE = parts["make"]
    GENERIC = parts["generic"]
    VALUE = parts["value"]
    META = parts["meta"]
    LEAVES = parts["leaves"]
    FLOATS = parts["floats"]
    SPECIAL = parts["special"]
    number_leaf = parts["number_leaf"]
    float_dtype = parts["float_dtype"]
    scalar_leaf = parts["scalar_leaf"]
    attr_value = parts["attr_value"]
    as_value = parts["as_value"]
    slow = parts["slow"]
    record = parts["record"]
    LIVE = parts["live"]
    compact = parts["compact"]
    MISSING = parts["missing"]


def set_compact_at(Py_ssize_t n):
    global compact_at
    compact_at = n


cdef inline int track_(object t) except -1:
    r = PyWeakref_NewRef(t, None)
    PyObject_GC_UnTrack(<PyObject*>r)
    LIVE.append(r)
    if len(LIVE) > compact_at:
        compact()
    return 0


def track(t):
    """Register a new lazy tensor among the live ones (weakly)."""
    track_(t)


cdef inline bint is_plain(object v):
    t = type(v)
    return v is None or t is bool or t is int or t is float or t is str


cdef inline bint is_number(object v):
    t = type(v)
    return t is float or t is int or t is bool or t is complex


@cython.final
cdef class Positional:
    """One overload's preparation for calls without keyword arguments: ``prepare(args)`` gives
    ``(key, operands, attributes)``, or None for more arguments than the schema takes (torch's
    own argument parser rejects such a call before it reaches dispatch; the caller falls back
    to the general preparation)."""

    cdef readonly str op
    cdef Py_ssize_t nargs
    cdef tuple names, kinds, defaults, const_attrs, const_keys
    cdef bint lift
    cdef readonly bint view
    cdef object plan

    def __init__(self, plan, const_attrs, const_keys):
        """``plan``: the overload's ``_record.Plan``; ``const_attrs`` / ``const_keys``: per
        argument, the attribute and key part its absent default always gives, or MISSING."""
        self.plan = plan
        self.op = plan.op
        self.nargs = len(plan.args)
        self.names = tuple(a[0] for a in plan.args)
        self.kinds = tuple(a[1] for a in plan.args)
        self.defaults = tuple(a[2] for a in plan.args)
        self.const_attrs = tuple(const_attrs)
        self.const_keys = tuple(const_keys)
        self.lift = plan.lift
        self.view = plan.view

    def __call__(self, args):
        return self.prepare(tuple(args))

    cdef object prepare(self, tuple args):
        cdef Py_ssize_t n = len(args), k, size = 1
        cdef int kind
        cdef list operands = []
        cdef dict attrs = {}
        cdef list lifted_names = None, lifted_leaves = None
        cdef object v, a, part, shape0 = None, fd, leaf, name
        if n > self.nargs:
            return None
        for k in range(self.nargs):
            if k < n or self.defaults[k] is not MISSING:
                size += 1
        key = [None] * size
        key[0] = self.op
        size = 1
        for k in range(self.nargs):
            name = self.names[k]
            if k >= n:
                v = self.defaults[k]
                if v is MISSING:
                    continue
                a = self.const_attrs[k]
                if a is not MISSING:
                    attrs[name] = a
                    key[size] = self.const_keys[k]
                    size += 1
                    continue
            else:
                v = args[k]
            kind = self.kinds[k]
            if kind == TENSOR:
                if type(v) is LAZY:
                    v = v._ir
                elif is_number(v):
                    leaf = None
                    # Beside a lazy floating first operand, a number seen before is one lookup
                    # (a zero is left to number_leaf, which keeps -0.0 apart from 0.0).
                    if k > 0 and shape0 is not None and type(args[0]) is LAZY and v != 0:
                        fd = shape0.dtype
                        if fd in FLOATS:
                            leaf = LEAVES.get((type(v), v, fd))
                    v = leaf if leaf is not None else number_leaf(v, args)
                else:
                    v = as_value(v)
                operands.append(v)
                part = v.shape
                if k == 0:
                    shape0 = part
            elif kind == OTHER:
                a = v if is_plain(v) else attr_value(v)
                attrs[name] = a
                part = (name, a)
            elif kind == SCALAR:
                leaf = None
                if self.lift and type(v) is float and v not in SPECIAL:
                    fd = float_dtype(args)
                    if fd is not None:
                        leaf = scalar_leaf(v, fd)
                elif type(v) is complex:  # no attribute encoding: always a lifted leaf
                    leaf = number_leaf(v, args)
                if leaf is not None:
                    if lifted_names is None:
                        lifted_names, lifted_leaves = [], []
                    lifted_names.append(name)
                    lifted_leaves.append(leaf)
                    part = name
                else:
                    a = v if is_plain(v) else attr_value(v)
                    attrs[name] = a
                    part = (name, a)
            elif kind == OPT_TENSOR:
                if v is None:
                    attrs[name] = None
                    part = None
                else:
                    v = as_value(v)
                    operands.append(v)
                    part = v.shape
            else:  # TENSOR_LIST
                present = []
                for t in v:
                    if t is None:
                        present.append(None)
                    else:
                        t = as_value(t)
                        operands.append(t)
                        present.append(t.shape)
                if None in present:
                    attrs["indexed"] = tuple([p is not None for p in present])
                part = tuple(present)
            key[size] = part
            size += 1
        if lifted_names is not None:
            attrs["__lifted__"] = tuple(lifted_names)
            operands.extend(lifted_leaves)
        return tuple(key), operands, attrs


def register(func, Positional positional not None):
    """Route ``func`` (a recordable op) through the C path."""
    if not positional.view:
        PLANS[id(func)] = positional


def forget():
    PLANS.clear()


def torch_dispatch(cls, func, types, args=(), kwargs=None):
    """``LazyTensor.__torch_dispatch__``: a seen op with one output, recorded here."""
    cdef PyObject* p
    cdef Positional plan
    if not kwargs and type(args) is tuple:  # torch passes a tuple
        p = PyDict_GetItemWithError(PLANS, id(func))
        if p is not NULL:
            plan = <Positional>p
            prepared = plan.prepare(<tuple>args)
            if prepared is not None:
                layout = META.get((<tuple>prepared)[0])
                if layout is not None and (<tuple>layout)[0] == "one":
                    out = PyObject_Call(MAKE, (LAZY, (<tuple>layout)[2]), (<tuple>layout)[4])
                    out._ir = VALUE(
                        GENERIC(plan.op, (<tuple>prepared)[1], (<tuple>layout)[1],
                                (<tuple>prepared)[2]),
                        0,
                    )
                    track_(out)
                    return out
                return record(func, args, NO_KWARGS, plan.plan, prepared)
    return slow(cls, func, types, args, kwargs)
