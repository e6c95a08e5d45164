# cython: language_level=3, boundscheck=False, wraparound=False
"""A compiled step's replay in C: the call's argument key, the program's inputs read from the
tensors' current data, and its results bound where the traced call put them.

``_replay.Replay`` owns the plan: it zips its sources and bindings with what the executable says
of each once (``_reads``, ``_writes``) and hands those tables here on every replay. The common
kinds (a tensor's data, a lazy argument, a constant, a returned tensor, a tensor's new data) run
as C loops; the rare ones (a host tensor read afresh, a number lent to an optimizer, a host
argument written back, a read that fails) call the same Python helpers the plan's tracing uses.

Donation decides by reference counts: ``_donation.sole``'s rule, counted here in C (``sole``)
where the interpreter's counts are trusted (``_donation.CALIBRATION``; on a free-threaded build
the Python rule is called instead). Cython's own references are exact: a local holds one
reference, an argument of a ``cdef`` function none, and no temporary is kept, so each count
below names every holder it expects. Each call is made holding what the loop always held (the
tensor in a local, no temporary of its value or node). A count that came out high would only
keep a buffer from being donated (a copy), never donate one that is read elsewhere.
"""
from cpython.ref cimport Py_INCREF, Py_REFCNT
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM

import jax
import torch

from ir_core import DeviceData, Value
from ir_runtime import _collectives, _donation, _metrics
from ir_runtime._data import put
from ir_runtime._execute import place, same_sharding
from ir_runtime._frontend.recording import _rng
from ir_runtime._frontend.recording._convert import host_numpy
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._frontend.recording._views import write_through
from ir_runtime._jaxapi import ArrayImpl

# Where a program parameter's data comes from, and what a result binds to (``_replay`` says
# what each means). Compared by identity.
ARG, STATE, CONST, RNG = "arg", "state", "const", "rng"
HOSTREAD = "host read"
HYPER = "hyperparameter"
PGRAD = "p.grad"
OUT, GRAD, DROP, HOST = "out", "grad", "drop", "host"

cdef object _ARG = ARG, _STATE = STATE, _CONST = CONST, _HOSTREAD = HOSTREAD
cdef object _HYPER = HYPER, _PGRAD = PGRAD, _OUT = OUT, _GRAD = GRAD, _HOST = HOST
cdef object _DEVICE_DATA = DeviceData, _VALUE = Value, _LAZY = LazyTensor, _ARRAY = ArrayImpl
cdef object _sole = _donation.sole, _refs = _donation.refs, _place = place
cdef bint _COUNTS = _donation.CALIBRATION.trusted  # (else the Python rule: _sole, _refs)
cdef list _IN_FLIGHT = _collectives._IN_FLIGHT, _LAST = _collectives._LAST
cdef object _same = same_sharding
cdef object _count = _metrics.count, _next_step = _rng.next_step, _write_through = write_through
cdef object _grad_enabled = torch.is_grad_enabled

# The plan's Python helpers for what the loops leave to Python (``_replay`` sets them).
cdef object miss = None        # why -> a Miss
cdef object unreadable = None  # (kind, x, node, shape) -> why the data cannot be read
cdef object moved = None       # (kind, x, shape, now, traced) -> why it is placed otherwise
cdef object read_host = None   # (plan, kind, x, shape, sharding, k) -> an array, or a Miss
cdef object write_host = None  # (host tensor, DeviceData) -> None: the result copied into it


def configure(*, miss_, unreadable_, moved_, read_host_, write_host_):
    global miss, unreadable, moved, read_host, write_host
    miss, unreadable, moved = miss_, unreadable_, moved_
    read_host, write_host = read_host_, write_host_


cdef object _leaf_key(Py_ssize_t k, object x):
    """One argument leaf's part of the call's key: a lazy tensor's Shape (dims and dtype) and
    whether it requires grad; a host tensor's dims, dtype and requires_grad; a Python value
    itself (it must hash)."""
    if type(x) is _LAZY:
        return (True, x._ir.shape, x.requires_grad)
    if isinstance(x, torch.Tensor):
        return (False, tuple(x.shape), x.dtype, x.requires_grad)
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"argument leaf {k} of a compiled step is a {type(x).__name__}, which is neither a "
            f"tensor nor hashable; a compiled step's Python arguments are part of its key "
            f"(pass tensors, numbers, strings, or tuples, lists and dicts of them)"
        ) from None
    return (type(x), x)


def call_key(structure, leaves):
    """The call's key: its arguments' structure, the grad mode, and each leaf's ``_leaf_key``."""
    cdef Py_ssize_t k, n = len(leaves)
    cdef tuple key = PyTuple_New(n + 2)
    _set(key, 0, structure)
    _set(key, 1, _grad_enabled())
    for k in range(n):
        _set(key, k + 2, _leaf_key(k, leaves[k]))
    return key


def read_inputs(plan, tuple reads, leaves, list replayable_args, bint ran):
    """``Replay._inputs``: the program's arguments; a ``Miss`` when one cannot be read as
    traced; None when a tensor it reads holds pending work and ``ran`` is False (the caller
    runs it, then reads them all again, holding nothing read so far)."""
    cdef list arrays = []
    cdef list copies = None
    cdef Py_ssize_t rng = -1
    cdef bint shared
    for item in reads:
        kind, x, shape, sharding, donated, spec = <tuple>item
        if kind is _CONST:
            arrays.append(x)
            continue
        if kind is _HOSTREAD or kind is _HYPER:
            got = read_host(plan, kind, x, shape, sharding, len(arrays))
            if type(got) is miss:
                return got
            arrays.append(got)
            continue
        if kind is _STATE:
            t = alive(x)
            if t is None:
                return miss(unreadable(kind, x, None, shape))
            shared = donated and not sole(t, 0)
            node = t._ir.node
        elif kind is _PGRAD:  # (a guard saw p alive, its .grad a lazy tensor)
            t = x().grad
            # The step may drop p.grad (zero_grad()) without rebinding it: its buffer is
            # donated only if nothing but p.grad holds the tensor (the local t; p.grad).
            shared = donated and not (_held_by(t, 2) and sole(t, 0))
            node = t._ir.node
        elif kind is _ARG:
            leaf = leaves[x]
            if replayable_args[x] is None:  # a host tensor: placed straight from its memory
                _count("TransferToDevice")
                arrays.append(put(host_numpy(leaf), sharding))
                continue
            shared = donated and not sole(leaf, 1)  # (replayable_args holds its node)
            node = replayable_args[x]
        else:  # RNG: drawn last, once nothing can send the call back to tracing
            rng = len(arrays)
            arrays.append(sharding)
            continue
        if type(node) is not _DEVICE_DATA:
            if kind is not _ARG and not ran:
                return None
            return miss(unreadable(kind, x, node, shape))
        if node.shape != shape:
            return miss(unreadable(kind, x, node, shape))
        if node.sharding != spec:  # (placed anew since: mark_sharding, a placement)
            return miss(moved(kind, x, shape, node.sharding, spec))
        if shared:  # donated, yet still read elsewhere: the program takes a copy
            if copies is None:
                copies = []
            copies.append(len(arrays))
        h = node.handle
        if type(h) is _ARRAY and not h.is_deleted():
            held = h.sharding
            if held is sharding or _same(held, sharding):
                arrays.append(h)  # the steady state: a result of the last step, where it belongs
                continue
        arrays.append(_place(node, sharding))
    if copies is not None:
        for k in copies:
            _count("DonationCopies")
            arrays[k] = jax.device_put(arrays[k], may_alias=False)
    if plan.reseed is not None:  # as the traced call did (CPU torch's generator too)
        torch.manual_seed(plan.reseed)
    if rng >= 0:
        arrays[rng] = _place(_rng.draw()[0].node, arrays[rng])
    return arrays


def bind(plan, tuple writes, raw, leaves):
    """``Replay._bind``: bind the step's results where the traced call put them; its outputs."""
    cdef list outputs = list(plan.statics)
    for item in writes:
        kind, x, shape, spec, k = <tuple>item
        data = _DEVICE_DATA(shape, raw[k], spec)  # as exe.results makes it, for the bound only
        if kind is _OUT:
            outputs[x] = _LAZY(_VALUE(data))
        elif kind is _STATE:
            t = x()
            if t is not None:
                t._bind(data)
                if t._views:  # views taken outside the step follow it, as in eager
                    _write_through(t)
        elif kind is _GRAD:
            t = x()
            if t is not None:
                t.grad = _LAZY(_VALUE(data))
        elif kind is _PGRAD:  # written in place: whichever tensor p.grad is (guarded)
            t = x().grad
            t._bind(data)
            if t._views:
                _write_through(t)
        elif kind is _ARG:  # the caller's lazy tensor, written by the step
            t = leaves[x]
            t._bind(data)
            if t._views:
                _write_through(t)
        elif kind is _HOST:
            write_host(leaves[x], data)
    for ref in plan.cleared:  # zero_grad() in the step
        t = ref()
        if t is not None:
            t.grad = None
    _next_step()
    _count("StepReplay")
    for ref in plan.schedulers:  # (a scheduler freed since: nothing can step it)
        scheduler = ref()
        if scheduler is not None:
            scheduler.step()
    return outputs


cdef bint _held_by(object t, Py_ssize_t n) except -1:
    """Whether exactly ``n`` references hold ``t``, the caller's local among them (``_refs``:
    the caller holds it in a local, and this argument holds none)."""
    if _COUNTS:
        return Py_REFCNT(t) == n
    return _refs(t) == n


cpdef bint sole(object t, Py_ssize_t extra) except -1:
    """``_donation.sole(t, extra)``: whether the lazy tensor ``t`` alone holds its data (its
    value, that value's node, the node's array), ``extra`` references to the node being the
    caller's own. The same rule, each count naming its holders."""
    if not _COUNTS:
        return _sole(t, extra)
    v = t._ir
    if Py_REFCNT(v) != 2:  # the tensor's slot; the local v
        return False
    n = v.node
    if type(n) is not _DEVICE_DATA or Py_REFCNT(n) != 2 + extra:  # v's slot; the local n
        return False
    h = n.handle
    # n's slot and the local h, besides the runtime's note of the last program's result
    return Py_REFCNT(h) - 2 == (h is _IN_FLIGHT[0]) + (h is _LAST[0])


cpdef object alive(object refs):
    """The first of ``refs`` (weak references) whose tensor is alive, or None."""
    for r in refs:
        t = r()
        if t is not None:
            return t
    return None


cdef inline void _set(tuple t, Py_ssize_t k, object v):
    Py_INCREF(v)
    PyTuple_SET_ITEM(t, k, v)


# ---------------------------------------------------------------------------------------------
# Guards' checks (``_guards``: each class's capture and explanation stay there; what a replay
# runs before every call is here). ``_guards`` hands over its markers and keys.

cdef object _NONE = None, _TENSOR = None, _NUMBER = None
cdef object _tensor_key = None, _number_key = None
cdef object _TENSOR_TYPE = torch.Tensor


def configure_guards(*, none, tensor, number, tensor_key, number_key):
    global _NONE, _TENSOR, _NUMBER, _tensor_key, _number_key
    _NONE, _TENSOR, _NUMBER = none, tensor, number
    _tensor_key, _number_key = tensor_key, number_key


def optimizer_holds(guard):
    """``OptimizerGuard.holds``: the optimizer alive, its state table the same and as large,
    each group's parameter list and size, and each hyperparameter as traced."""
    opt = guard.ref()
    state = guard.state
    if opt is None or opt.state is not state or len(state) != guard.size:
        return False  # gone, or its state loaded (load_state_dict replaces the table)
    groups = opt.param_groups
    cdef tuple saved = guard.groups
    if len(groups) != len(saved):
        return False
    cdef Py_ssize_t i
    for i in range(len(saved)):
        group = groups[i]
        table, n, size, items = <tuple>saved[i]
        if len(group) != size or group.get("params") is not table or len(table) != n:
            return False
        for item in <tuple>items:
            k, v, key = <tuple>item
            now = group.get(k, _NONE)
            if v is _TENSOR:
                if not isinstance(now, _TENSOR_TYPE) or _tensor_key(now, guard.inputs) != key:
                    return False
            elif v is _NUMBER:
                if _number_key(now) != key:
                    return False
            elif now is not v and (isinstance(now, _TENSOR_TYPE) or now != v):
                return False
    return True


def module_holds(guard):
    """``ModuleGuard.holds``: the module alive, in the same mode, with the same parameters
    (each requiring grad as traced), buffers and submodules."""
    m = guard.ref()
    if m is None or m.training is not guard.training:
        return False
    table = m._parameters
    cdef tuple params = guard.params
    if len(table) != len(params):
        return False
    for item in params:
        k, ref, requires_grad = <tuple>item
        p = table.get(k)
        if ref is None:
            if p is not None:
                return False
        elif p is not ref() or p.requires_grad is not requires_grad:
            return False
    return _same_entries(m._buffers, guard.buffers) and _same_entries(m._modules, guard.children)


cdef bint _same_entries(object table, tuple saved) except -1:
    """Each name of ``saved`` holds the object its weak reference names (None: nothing)."""
    if len(table) != len(saved):
        return False
    for item in saved:
        k, ref = <tuple>item
        v = table.get(k)
        if ref is None:
            if v is not None:
                return False
        elif v is not ref():
            return False
    return True


def grad_all_hold(tuple packed):
    """``GradGuard.all_hold``: each tensor alive, its ``.grad`` None as it was when traced."""
    for item in packed:
        ref, was_none = <tuple>item
        t = ref()
        if t is None or (t.grad is None) is not was_none:
            return False
    return True


def unset_grad_all_hold(tuple packed):
    """``UnsetGradGuard.all_hold``: each tensor freed, or its ``.grad`` still None."""
    for ref in packed:
        t = ref()
        if t is not None and t.grad is not None:
            return False
    return True


def grad_read_all_hold(tuple packed):
    """``GradReadGuard.all_hold``: each tensor alive, its ``.grad`` a lazy tensor."""
    for ref in packed:
        t = ref()
        if t is None or type(t.grad) is not _LAZY:
            return False
    return True


def requires_grad_all_hold(tuple packed):
    """``RequiresGradGuard.all_hold``: each tensor alive, requiring grad as traced."""
    for item in packed:
        ref, flag = <tuple>item
        t = ref()
        if t is None or t.requires_grad is not flag:
            return False
    return True
