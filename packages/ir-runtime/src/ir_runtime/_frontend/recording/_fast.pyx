# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Tracing's hot path in C: argument preparation, the lifted-scalar leaves, and the lazy
tensor's ``__torch_dispatch__`` for an op it has seen.

Per ATen overload, a ``Positional`` preparation turns a call's arguments into the
shape-inference memo key, the operands and the attributes. It is the only preparation: a call
with keyword arguments is first laid out by position (``_record.prepare``), absent arguments as
``MISSING``. Python numbers become lifted 0-d leaves, one per (type, value, dtype), kept here
(``scalar_leaf``, ``number_leaf``): one key format, one cache. ``torch_dispatch`` then finds the
memoized output layout, builds the wrapper tensor and its node, and registers it among the live
tensors; anything else (a first sighting, several outputs, views, in-place ops) goes to the
Python dispatch it was configured with.

The live-tensor registry holds weak references without callbacks. Such a reference holds no
strong reference to anything, so it cannot be part of a reference cycle, and it is taken out
of the cyclic garbage collector: a traced graph of ten thousand live tensors then costs the
collector nothing.

Longer than 400 lines, as one extension module: ``torch_dispatch`` reaches the preparation, the
leaf cache, the origin walk and the live registry C to C (``cdef`` functions and module-level C
state), which splitting would turn into Python calls across modules on every recorded op.
"""

cimport cython
from cpython.object cimport PyObject, PyObject_Call
from cpython.weakref cimport PyWeakref_GetObject, PyWeakref_NewRef
from libc.math cimport copysign

import torch

from ir_core import DeviceData, Generic, Value
from ir_runtime._frontend.recording import _convert
from ir_runtime._frontend.recording._convert import IR_TO_TORCH

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void* op)
    void PyObject_GC_Track(void* op)
    int PyObject_GC_IsTracked(object op)
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL
    ctypedef struct PyFrameObject
    PyFrameObject* PyEval_GetFrame()                  # borrowed
    PyFrameObject* PyFrame_GetBack(PyFrameObject* f)  # new reference
    PyObject* PyFrame_GetCode(PyFrameObject* f)       # new reference
    int PyFrame_GetLasti(PyFrameObject* f)
    void Py_INCREF(PyObject* o)
    void Py_DECREF(PyObject* o)

# Argument kinds of an op's plan, defined here once: _record takes them from KINDS.
cdef enum:
    TENSOR = 0
    TENSOR_LIST = 1
    OPT_TENSOR = 2
    SCALAR = 3
    OTHER = 4

KINDS = (TENSOR, TENSOR_LIST, OPT_TENSOR, SCALAR, OTHER)


class _Missing:
    """An argument the call does not give (its schema default applies)."""

    def __repr__(self):
        return "MISSING"


MISSING = _Missing()
FLOATS = frozenset(("float16", "bfloat16", "float32", "float64"))
# Scalars XLA programs keep as constants (as torch_xla does); any other float in a Scalar
# argument becomes a 0-d input, so a learning rate or a bias correction that changes every step
# does not change the program.
SPECIAL = frozenset((0.0, 1.0, -1.0, 2.0, 0.5))

cdef object MAKE = torch.Tensor._make_wrapper_subclass
cdef object GENERIC = Generic
cdef object DEVICE_DATA = DeviceData
cdef object VALUE = Value
cdef object _MISSING = MISSING
cdef frozenset _FLOATS = FLOATS
cdef frozenset _SPECIAL = SPECIAL

# What configure() hands over from the Python side of the front end.
cdef object LAZY = None          # the LazyTensor class
cdef object META = None          # _meta.MEMO: memo key -> output layout (a bounded dict)
cdef object LEAVES = None        # (type, number, dtype) -> lifted leaf (a bounded dict)
cdef object make_leaf = None     # (number, dtype) -> a new lifted leaf
cdef object default_float = None  # () -> torch's default float dtype, as an ir-core name
cdef object float_dtype = None
cdef object attr_value = None
cdef object as_value = None
cdef object slow = None          # the Python __torch_dispatch__ body
cdef object record = None
cdef object checked = None       # while set: every op goes through it (``check_devices``)
cdef list LIVE = []              # weak references to every lazy tensor, in creation order
cdef Py_ssize_t compact_at = 10_000
cdef int UNTRACKED = 0           # > 0 while a region is traced: its tensors are not live
cdef dict PLANS = {}             # id(OpOverload) -> Positional, for recordable non-view ops
cdef dict NO_KWARGS = {}


# Source lines. A node recorded for the user keeps an ``Origin``: the code object and the
# instruction of the innermost frame that is the user's (not torch's, not this project's, not
# the standard library's), found by walking up from the dispatch. Holding the code object, never
# the frame, keeps the user's locals (their tensors) as free as they were; the text (file, line,
# function) is worked out only when something asks for it.
cdef bint ORIGINS = True
cdef dict LIBRARY = {}  # co_filename -> whether it is a library's (a frame to walk past)
cdef tuple LIBRARY_DIRS = ()  # packages whose frames are walked past
cdef tuple STDLIB_DIRS = ()  # the standard library's, walked past too...
cdef tuple USER_DIRS = ()  # ...but for what under them is the user's (site-packages)


@cython.final
@cython.freelist(256)
cdef class Origin:
    """Where a node was recorded: ``code`` and ``lasti`` of the user's frame; ``filename``,
    ``lineno``, ``function`` and ``str()`` (``file.py:41 (fn)``) worked out when read."""

    cdef readonly object code
    cdef readonly int lasti

    @property
    def filename(self):
        return self.code.co_filename

    @property
    def function(self):
        return self.code.co_qualname

    @property
    def lineno(self):
        return self.position()[0]

    def position(self):
        """``(line, column)`` of the instruction (column None where Python has none)."""
        k = 0
        for line, _, column, _ in self.code.co_positions():
            if k == self.lasti // 2:
                return (line if line is not None else self.code.co_firstlineno), column
            k += 1
        return self.code.co_firstlineno, None

    def short(self):
        """``file.py:41``: the file's base name and the line."""
        return f"{self.filename.rpartition('/')[2]}:{self.lineno}"  # (no negative index here)

    def __str__(self):
        return f"{self.filename}:{self.lineno} ({self.function})"

    def __repr__(self):
        return f"<Origin {self}>"

    def __reduce__(self):
        raise TypeError("an Origin refers to a code object and is not pickled")


cdef bint is_library(object filename):
    cdef PyObject* p = PyDict_GetItemWithError(LIBRARY, filename)
    if p is not NULL:
        return <object>p is True
    lib = (<str>filename).startswith(LIBRARY_DIRS) or (
        (<str>filename).startswith(STDLIB_DIRS) and not (<str>filename).startswith(USER_DIRS))
    if len(LIBRARY) > 65536:  # a program that makes code from endless new file names
        LIBRARY.clear()
    LIBRARY[filename] = lib
    return lib


cdef object origin_():
    """The innermost user frame's ``Origin``, or None (none within 64 frames)."""
    cdef PyFrameObject* f = PyEval_GetFrame()
    cdef PyFrameObject* back
    cdef PyObject* code
    cdef int depth = 0
    cdef Origin o
    if f is NULL:
        return None
    back = f
    Py_INCREF(<PyObject*>back)  # (borrowed: each frame the loop holds, it holds a reference to)
    while back is not NULL and depth < 64:
        code = PyFrame_GetCode(back)
        if not is_library((<object>code).co_filename):
            o = Origin.__new__(Origin)
            o.code = <object>code
            o.lasti = PyFrame_GetLasti(back)
            Py_DECREF(code)
            Py_DECREF(<PyObject*>back)
            return o
        Py_DECREF(code)
        f = PyFrame_GetBack(back)
        Py_DECREF(<PyObject*>back)
        back = f
        depth += 1
    if back is not NULL:
        Py_DECREF(<PyObject*>back)
    return None


def origin():
    """The caller's ``Origin`` (the innermost user frame), or None when source lines are off."""
    return origin_() if ORIGINS else None


def set_origins(bint on, library_dirs=None, stdlib_dirs=(), user_dirs=()):
    """Record source lines (``on``); ``library_dirs``: the packages whose frames are walked
    past; ``stdlib_dirs``: the standard library's, walked past but for ``user_dirs`` inside
    them (the site-packages of a Python whose packages live under its standard library)."""
    global ORIGINS, LIBRARY_DIRS, STDLIB_DIRS, USER_DIRS
    ORIGINS = on
    if library_dirs is not None:
        LIBRARY_DIRS = tuple(library_dirs)
        STDLIB_DIRS = tuple(stdlib_dirs)
        USER_DIRS = tuple(user_dirs)
        LIBRARY.clear()


def configure(*, lazy, meta, leaves, make_leaf_, default_float_, float_dtype_, attr_value_,
              as_value_, dispatch, record_):
    """Hand the Python side's class, memo tables and fallbacks over (once, at import)."""
    global LAZY, META, LEAVES, make_leaf, default_float, float_dtype, attr_value, as_value
    global slow, record
    LAZY, META, LEAVES = lazy, meta, leaves
    make_leaf, default_float, float_dtype = make_leaf_, default_float_, float_dtype_
    attr_value, as_value, slow, record = attr_value_, as_value_, dispatch, record_


# -- lifted scalars ------------------------------------------------------------------------

cdef inline object leaf_key(object value, object dtype):
    """A leaf's cache key: (type, value, dtype), with -0.0 apart from 0.0 (equal as numbers,
    not as leaves: 1 / -0.0 is -inf)."""
    if type(value) is float and value == 0 and copysign(1.0, <double>value) < 0:
        return (float, "-0.0", dtype)
    return (type(value), value, dtype)


cdef object scalar_leaf_(object value, object dtype):
    key = leaf_key(value, dtype)
    cdef PyObject* p = PyDict_GetItemWithError(LEAVES, key)
    if p is not NULL:
        return <object>p
    leaf = make_leaf(value, dtype)
    LEAVES[key] = leaf  # through the bounded dict's __setitem__
    return leaf


cdef inline object number_dtype(object value, object float_dtype_):
    t = type(value)
    if t is bool:
        return "bool"
    if t is int:
        return "int64"
    if t is complex:  # the complex type of the op's float precision
        return "complex128" if float_dtype_ in ("float64", "complex128") else "complex64"
    return float_dtype_


cdef object number_leaf_(object value, object fd):
    if fd is None and type(value) is float:
        fd = default_float()
    return scalar_leaf_(value, number_dtype(value, fd))


def scalar_leaf(value, dtype):
    """A lifted scalar: a 0-d parameter holding ``value`` as ``dtype``, one per (value,
    dtype)."""
    return scalar_leaf_(value, dtype)


def number_leaf(value, args):
    """A Python number passed for a Tensor argument: a lifted 0-d leaf, floats in the dtype of
    the op's first floating tensor (``args``), or beside none in torch's default dtype (as
    torch promotes a Python float)."""
    return number_leaf_(value, float_dtype(args))


# -- the live registry -----------------------------------------------------------------------

def live():
    """The lazy tensors still alive, oldest first; drops the dead references."""
    cdef list alive = [], refs = []
    for r in LIVE:
        t = <object>PyWeakref_GetObject(r)
        if t is not None:
            alive.append(t)
            refs.append(r)
    LIVE[:] = refs
    return alive


def untracked(bint on):
    """While on (nested: counted), new lazy tensors are not registered as live: what a manual
    region's trace records on placeholders is never a step's to compute."""
    global UNTRACKED
    UNTRACKED += 1 if on else -1


def untrack(ids):
    """Take the tensors whose ids are in ``ids`` out of the registry: no step computes them."""
    cdef list refs = []
    for r in LIVE:
        t = <object>PyWeakref_GetObject(r)
        if t is not None and id(t) not in ids:
            refs.append(r)
    LIVE[:] = refs


def live_references():
    """The registry itself (weak references, oldest first): for tests of its invariants."""
    return LIVE


cdef inline int track_(object t) except -1:
    global compact_at
    if UNTRACKED:
        return 0
    r = PyWeakref_NewRef(t, None)
    PyObject_GC_UnTrack(<PyObject*>r)
    LIVE.append(r)
    if len(LIVE) > compact_at:
        # Drop the dead references; the next threshold is twice what is left (at least
        # 10,000), so compaction stays amortized O(1) per tensor.
        compact_at = max(10_000, 2 * len(live()))
    return 0


def next_step(dict state):
    """``_rng.next_step`` on its ``state``: the step counter moves on, the next draw takes a new
    key from offset 0. In C: a compiled step's replay calls it on every call."""
    state["step"] += 1
    state["base"] = 0
    state["offset"] = 0
    state["key"] = None


def track(t):
    """Register a new lazy tensor among the live ones (weakly)."""
    track_(t)


# -- a lazy tensor made, and bound to data (LazyTensor.__new__ and _bind: a replay's results) --

# (ir-core dtype, requires_grad, device) -> _make_wrapper_subclass's keywords. The device is
# read at every call: it is named "lazy", or "xla" under torch_xla's API (``_install``).
cdef dict MAKE_KWARGS = {}
cdef object CONVERT = _convert


cdef object make_kwargs(object dtype, object requires_grad, object device):
    """``_make_wrapper_subclass``'s keywords for a tensor of ``dtype`` on ``device``."""
    key = (dtype, bool(requires_grad), device)
    cdef PyObject* p = PyDict_GetItemWithError(MAKE_KWARGS, key)
    if p is not NULL:
        return <object>p
    kwargs = {"dtype": IR_TO_TORCH[dtype], "device": device}
    if requires_grad:
        kwargs["requires_grad"] = True
    MAKE_KWARGS[key] = kwargs
    return kwargs


def new(cls, value, requires_grad=False):
    """``LazyTensor.__new__``: a lazy tensor whose value is ``value``, registered among the live
    ones; holding data when ``value`` is a ``DeviceData``'s."""
    s = value.shape
    t = PyObject_Call(MAKE, (cls, s.dims), make_kwargs(s.dtype, requires_grad, CONVERT.DEVICE))
    t._ir = value
    node = value.node
    if type(node) is DEVICE_DATA:
        t._placed = node.sharding
        t._held = id(node)
    track_(t)
    return t


# A compiled step's returned tensors (its loss), made ahead in batches of one shape. Where the
# device threads share the host's cores (XLA's CPU devices), they leave its caches cold between
# two replays, and torch's tensor creation, run once per replay, cost about 15 us of it; made
# sixteen at a time, the next fifteen cost about 1 us each. A spare holds no value yet: it is
# in no registry and out of the cyclic collector's sight (``gc.get_objects()`` lists no tensor
# that cannot print) until handed out, as a tensor made then would be; the key holds what torch
# reads as it makes one (inference mode makes an inference tensor). At most SPARE_KEYS shapes
# have spares, the first asked for; a tensor of any other is made when asked for.
cdef dict SPARES = {}  # (dims, dtype, device, inference mode) -> lazy tensors not handed out
cdef Py_ssize_t SPARE_BATCH = 16, SPARE_KEYS = 64
cdef object INFERENCE = torch.is_inference_mode_enabled


def held(data):
    """A new lazy tensor holding ``data`` (a ``DeviceData``), not requiring grad, registered
    among the live ones: a compiled step's returned tensor, taken from ``SPARES``."""
    s = data.shape
    device = CONVERT.DEVICE
    key = (s.dims, s.dtype, device, INFERENCE())
    cdef PyObject* p = PyDict_GetItemWithError(SPARES, key)
    cdef list spares = <list>p if p is not NULL else None
    if not spares:
        kwargs = make_kwargs(s.dtype, False, device)
        if spares is None and len(SPARES) >= SPARE_KEYS:  # (a shape past the table's bound)
            t = PyObject_Call(MAKE, (LAZY, s.dims), kwargs)
        else:
            spares = [_spare(kwargs, s.dims) for _ in range(SPARE_BATCH)]
            SPARES[key] = spares
            t = spares.pop()
    else:
        t = spares.pop()
    if not PyObject_GC_IsTracked(t):  # (a spare: in the collector's sight from now on)
        PyObject_GC_Track(<void*>t)
    _hold(t, data)
    track_(t)
    return t


cdef object _spare(dict kwargs, tuple dims):
    t = PyObject_Call(MAKE, (LAZY, dims), kwargs)
    PyObject_GC_UnTrack(<void*>t)
    return t


def spares():
    """The spare tensors' table itself: for tests of its bound."""
    return SPARES


def bind(t, data):
    """``LazyTensor._bind``: the tensor now holds ``data`` (a step's result, or data placed
    for it), placed as that data is, its buffer one a step may take over (``_held``)."""
    _hold(t, data)
    if "_order" in t.__dict__:  # (_device_orders' note of the value before)
        del t._order


cdef inline int _hold(object t, object data) except -1:
    """``t``'s value is now ``data``'s (a ``DeviceData``), held where that data is placed."""
    t._ir = VALUE(data, 0)
    t._placed = data.sharding
    t._held = id(data)
    return 0


cdef inline bint is_plain(object v):
    t = type(v)
    return v is None or t is bool or t is int or t is float or t is str


cdef inline bint is_number(object v):
    t = type(v)
    return t is float or t is int or t is bool or t is complex


@cython.final
cdef class Positional:
    """One overload's argument preparation: ``prepare(args)``, for the arguments laid out by
    position (an absent one ``MISSING``), gives ``(key, operands, attributes)``: the
    shape-inference memo key (tensors by Shape, lifted floats by name only), the operands
    (lifted scalars last) and the attributes (every argument the schema has, defaults
    included). None for more arguments than the schema takes."""

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
            if (k < n and args[k] is not _MISSING) or self.defaults[k] is not _MISSING:
                size += 1
        key = [None] * size
        key[0] = self.op
        size = 1
        for k in range(self.nargs):
            name = self.names[k]
            v = args[k] if k < n else _MISSING
            if v is _MISSING:
                v = self.defaults[k]
                if v is _MISSING:
                    continue
                a = self.const_attrs[k]
                if a is not _MISSING:
                    attrs[name] = a
                    key[size] = self.const_keys[k]
                    size += 1
                    continue
            kind = self.kinds[k]
            if kind == TENSOR:
                if type(v) is LAZY:
                    v = v._ir
                elif is_number(v):
                    # Beside a lazy floating first operand, its dtype is the float dtype.
                    if k > 0 and shape0 is not None and type(args[0]) is LAZY:
                        fd = shape0.dtype
                        v = number_leaf_(v, fd if fd in _FLOATS else float_dtype(args))
                    else:
                        v = number_leaf_(v, float_dtype(args))
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
                if self.lift and type(v) is float and v not in _SPECIAL:
                    fd = float_dtype(args)
                    if fd is not None:
                        leaf = scalar_leaf_(v, fd)
                elif type(v) is complex:  # no attribute encoding: always a lifted leaf
                    leaf = number_leaf_(v, float_dtype(args))
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


def check_devices(check):
    """Route every op through ``check(cls, func, types, args, kwargs)`` (None: stop), which
    checks the devices its tensors live on and calls ``dispatch``: once tensors live over two
    device orders (``_devices``), no op may combine them."""
    global checked
    checked = check


def checking_devices():
    """Whether ops go through the device check (``check_devices``)."""
    return checked is not None


class ForeignTensor(Exception):
    """An argument is a tensor of another ``__torch_dispatch__`` subclass (a wrapper such as
    torch_xla's ``XLAShardedTensor``): this dispatch gives way to that class's."""


def torch_dispatch(cls, func, types, args=(), kwargs=None):
    """``LazyTensor.__torch_dispatch__``; ``NotImplemented`` (torch's protocol: the next
    subclass's ``__torch_dispatch__`` is asked) when an argument is a ``ForeignTensor``."""
    try:
        if checked is not None:
            return checked(cls, func, types, args, kwargs)
        return dispatch_(cls, func, types, args, kwargs)
    except ForeignTensor:
        return NotImplemented


def dispatch(cls, func, types, args=(), kwargs=None):
    """``torch_dispatch`` unchecked."""
    return dispatch_(cls, func, types, args, kwargs)


cdef object dispatch_(object cls, object func, object types, object args, object kwargs):
    """A seen op with one output, recorded here; the rest to the Python dispatch."""
    cdef PyObject* p
    cdef Positional plan
    if not kwargs and type(args) is tuple:  # torch passes a tuple
        p = PyDict_GetItemWithError(PLANS, id(func))
        if p is not NULL:
            plan = <Positional>p
            prepared = plan.prepare(<tuple>args)
            if prepared is not None:
                p = PyDict_GetItemWithError(META, (<tuple>prepared)[0])
                layout = <object>p if p is not NULL else None
                if layout is not None and (<tuple>layout)[0] == "one":
                    out = PyObject_Call(MAKE, (LAZY, (<tuple>layout)[2]), (<tuple>layout)[4])
                    out._ir = VALUE(
                        GENERIC(plan.op, (<tuple>prepared)[1], (<tuple>layout)[1],
                                (<tuple>prepared)[2], None, origin_() if ORIGINS else None),
                        0,
                    )
                    track_(out)
                    return out
                return record(func, args, NO_KWARGS, plan.plan, prepared)
    return slow(cls, func, types, args, kwargs)
