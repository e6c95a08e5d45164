# cython: language_level=3, boundscheck=False, wraparound=False
"""A compiled step's replay in C: from the call (``call``: its argument key, its plans) through
the guards, the program's inputs read from the tensors' current data and the launch, to its
results bound where the traced call put them, without a Python frame of its own.

Why in C: on a machine whose cores XLA's device threads share with the host, the host's work
between two programs finds its caches cold, so what it costs is the code and data it touches
more than the instructions it runs: each Python function a replay called cost microseconds
there. The first calls, a miss and a recorded profile take ``_capture``'s Python path.

``_replay.Replay`` owns the plan: it zips its sources and bindings with what the executable says
of each once (``_read_table``, ``_write_table``) and hands those tables here on every replay.
The common kinds (a tensor's data, a lazy argument, a constant, a number lent to an optimizer
and unchanged, a returned tensor, a tensor's new data) run as C loops; the rare ones (a host
tensor read afresh, a number that changed, a host argument written back, a read that fails)
call the same Python helpers the plan's tracing uses.

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
from libc.math cimport signbit

import jax
import torch

from ir_core import DeviceData, Value
from ir_runtime import _collectives, _donation, _metrics, _profile
from ir_runtime._data import put
from ir_runtime._execute import place, same_sharding
from ir_runtime._frontend.recording import _fast, _rng
from ir_runtime._frontend.recording._convert import host_numpy
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._frontend.recording._views import write_through
from ir_runtime._jaxapi import ArrayImpl
from ir_runtime._launch import refuse_deleted

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
cdef object _same = same_sharding, _refuse_deleted = refuse_deleted
cdef object _count = _metrics.count, _next_step = _fast.next_step, _write_through = write_through
cdef dict _RNG_STATE = _rng._state  # (_rng.next_step's state: _fast.next_step runs it in C)
cdef object _grad_enabled = torch.is_grad_enabled
cdef object _snapshot = _rng.snapshot, _put_back = _rng.put_back
cdef object _undo = None  # the random stream before this replay's reseed and draw (``launch``)
cdef dict _COUNTERS = _metrics._counters
cdef object _new = _fast.new, _bind_data = _fast.bind  # LazyTensor(value), t._bind(data)
cdef object _held = _fast.held  # a returned tensor holding data (made ahead, in batches)
cdef list _ACTIVE = _profile.ACTIVE
NESTED = (tuple, list, dict)  # arguments ``_replay.flatten`` takes apart
cdef tuple _NESTED = NESTED

SLOW = object()  # ``call``'s answer for a call it leaves to the Python path
cdef object _SLOW = SLOW
cdef long long _replays = 0  # replays since the metrics were last read (``flush``)

# The plan's Python helpers for what the loops leave to Python (``_replay`` sets them).
cdef object miss = None        # why -> a Miss
cdef object unreadable = None  # (kind, x, node, shape) -> why the data cannot be read
cdef object moved = None       # (kind, x, shape, now, traced) -> why it is placed otherwise
cdef object read_host = None   # (plan, kind, x, shape, sharding, k) -> an array, or a Miss
cdef object write_host = None  # (host tensor, DeviceData) -> None: the result copied into it
cdef object first_failure = None  # guards -> why the first that fails does
cdef object unflatten = None   # (structure, leaves) -> the return value
cdef object flat = None        # n -> the structure of n positional leaves
cdef object steps = None       # the _step module (mark_step)
cdef object data_nodes = None  # _capture._data_nodes: the arguments' nodes, pending work run


def configure(*, miss_, unreadable_, moved_, read_host_, write_host_, first_failure_,
              unflatten_, flat_, steps_):
    global miss, unreadable, moved, read_host, write_host, first_failure, unflatten, flat, steps
    miss, unreadable, moved = miss_, unreadable_, moved_
    read_host, write_host = read_host_, write_host_
    first_failure, unflatten, flat, steps = first_failure_, unflatten_, flat_, steps_


def configure_step(*, data_nodes_):
    global data_nodes
    data_nodes = data_nodes_


def step_call(step, /, *args, **kwargs):
    """``CompiledStep.__call__``: a positional call replayed here (``call``), with no Python
    frame of its own; any other call, and one ``call`` leaves, taken by ``step._call``."""
    if not kwargs:
        out = call(step, args)
        if out is not _SLOW:
            return out
    return step._call(args, kwargs)


def call(step, tuple args):
    """``step_call``'s replay, for positional arguments, none a tuple, list or dict: its
    key's plans replayed; ``SLOW`` when the call is not replayed here (no plan for its key, or a
    profile recorded), which the Python path then takes from the start: nothing here changed
    anything."""
    for a in args:
        if type(a) is not _LAZY and isinstance(a, _NESTED):
            return _SLOW
    if _ACTIVE[0]:
        return _SLOW
    structure = _flat(len(args))
    key = call_key(structure, args)
    plans = step._replay.get(key)
    if plans is None:
        return _SLOW
    step._key = key
    out = run_plans(plans, args)
    if type(out) is miss:
        return step._missed(key, args, structure, out)
    failures = step._failures
    if failures:  # (the usual replay has none to forget: no key to hash)
        failures.pop(key, None)
    return out


cdef list _FLATS = [None] * 16  # n -> flat(n), for the first few n


cdef inline object _flat(Py_ssize_t n):
    """``flat(n)``, kept here for small ``n`` (its cache is a call away)."""
    if n >= 16:
        return flat(n)
    s = _FLATS[n]
    if s is None:
        s = _FLATS[n] = flat(n)
    return s


cpdef object run_plans(list plans, leaves):
    """The first of ``plans`` whose guards hold, replayed (and moved to the front), or the
    ``Miss`` of the first."""
    nodes = _nodes(leaves)
    first = None
    cdef Py_ssize_t i
    for i in range(len(plans)):
        out = replay(plans[i], leaves, nodes)
        if type(out) is not miss:
            if i:
                plans.insert(0, plans.pop(i))
            return out
        if first is None:
            first = out
    return first


cdef list _nodes(leaves):
    """``_capture._data_nodes``: each argument's data node (None for a host value); that
    Python function, which runs it first, when one holds pending work. No local outlives it
    holding a node: a replay counts who references an argument's data."""
    cdef list nodes = []
    for leaf in leaves:
        if isinstance(leaf, _LAZY):
            n = leaf._ir.node
            if type(n) is not _DEVICE_DATA:
                n = nodes = None
                return data_nodes(leaves)
            nodes.append(n)
        else:
            nodes.append(None)
    return nodes


def replay(plan, leaves, list nodes):
    """``Replay.replay``: run the step on the current data (its return value), or a ``Miss``
    when a guard says to trace it. ``nodes``: each argument's data node (``_nodes``)."""
    for run in <tuple>plan.checks:
        if not (<tuple>run)[0]((<tuple>run)[1]):
            return miss(first_failure((<tuple>run)[2]))
    reads = plan._reads
    if reads is None:
        reads = plan._read_table()
    arrays = read_inputs(plan, reads, leaves, nodes, False)
    if arrays is None:
        steps.mark_step()  # (nothing placed so far is kept: read them all again)
        arrays = read_inputs(plan, reads, leaves, nodes, True)
    if type(arrays) is miss:
        return arrays
    exe = plan.exe
    if exe.checks is not None:  # a failed program check comes once the results are bound
        return plan._checked(exe, arrays, leaves)
    writes = plan._writes
    if writes is None:
        writes = plan._write_table()
    outputs = bind(plan, writes, launch(exe, arrays), leaves)
    structure = plan.structure
    if structure is None:  # one leaf (a step's usual return: its loss)
        return outputs[0]
    return unflatten(structure, outputs)


cpdef object launch(exe, list arrays):
    """``exe.run(arrays)`` (``_launch.run``). A launch that fails puts the random stream back
    as it was before ``read_inputs`` reseeded and drew for it: nothing ran, nothing changed."""
    global _undo
    try:
        raw = exe.run(arrays)
    except BaseException:
        _give_back()
        raise
    _undo = None
    return raw


cdef int _give_back() except -1:
    """The random streams as ``read_inputs`` found them before it reseeded and drew, if it did
    (``_undo``, set only for the launch that follows it)."""
    global _undo
    saved, _undo = _undo, None
    if saved is not None:
        _put_back(saved)
    return 0


def flush(dict counters, dict timers):
    """Fold the replays counted since the metrics were last read into ``_metrics``' tables."""
    global _replays
    cdef long long replays = _replays
    _replays = 0
    if replays:
        counters["StepReplay"] = counters.get("StepReplay", 0) + replays


_metrics.FLUSH.append(flush)


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


cpdef object read_inputs(plan, tuple reads, leaves, list replayable_args, bint ran):
    """The program's arguments (``replay``); a ``Miss`` when one cannot be read as
    traced; None when a tensor it reads holds pending work and ``ran`` is False (the caller
    runs it, then reads them all again, holding nothing read so far)."""
    global _undo
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
            got = _number(plan, x, len(arrays)) if kind is _HYPER else None
            if got is None:
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
        held = node.sharding  # (identical in the steady state: ``Replay._write_table``)
        if held is not spec and held != spec:  # (placed anew since: mark_sharding, a placement)
            return miss(moved(kind, x, shape, held, spec))
        if shared:  # donated, yet still read elsewhere: the program takes a copy
            if copies is None:
                copies = []
            copies.append(len(arrays))
        h = node.handle
        if type(h) is _ARRAY:  # (deleted, donated elsewhere: the launch names it, _launch.run)
            held = h._sharding  # (``_jaxapi.ArrayImpl``: its sharding, read without a frame)
            if held is sharding or _same(held, sharding):
                arrays.append(h)  # the steady state: a result of the last step, where it belongs
                continue
        arrays.append(_place(node, sharding))
    if copies is not None:
        _refuse_deleted(arrays, None)  # (a deleted array cannot be copied: named first)
        for k in copies:
            _count("DonationCopies")
            arrays[k] = jax.device_put(arrays[k], may_alias=False)
    if plan.reseed is not None or rng >= 0:  # (put back if this or the launch fails)
        _undo = _snapshot(plan.reseed is not None)
        try:
            if plan.reseed is not None:  # as the traced call did (CPU torch's generator too)
                torch.manual_seed(plan.reseed)
            if rng >= 0:
                arrays[rng] = _place(_rng.draw()[0].node, arrays[rng])
        except BaseException:
            _give_back()
            raise
    return arrays


cdef object _number(plan, tuple where, Py_ssize_t k):
    """``Replay._number``'s common case: the number ``where`` names in its optimizer's group
    (``(optimizer reference, group index, key, index in a tuple or None, dtype)``) is the float
    the last replay placed, sign included: that array. None otherwise (``read_host`` places
    it)."""
    ref, gi, key, j, _ = where
    v = ref().param_groups[gi][key]  # (its optimizer's guard saw it alive)
    if j is not None:
        v = v[j]
    last = plan._numbers.get(k)
    if last is None or type(v) is not float:
        return None
    was = (<tuple>last)[0]
    if type(was) is not float or <double>v != <double>was:
        return None
    if (signbit(<double>v) != 0) != (signbit(<double>was) != 0):
        return None
    return (<tuple>last)[1]


cpdef list bind(plan, tuple writes, raw, leaves):
    """Bind the step's results where the traced call put them; its outputs (``replay``)."""
    global _replays
    cdef list outputs = list(plan.statics)
    for item in writes:
        kind, x, node, k = <tuple>item
        data = node.holding(raw[k])  # as exe.results makes it (its hashes copied from node)
        if kind is _OUT:
            outputs[x] = _held(data)
        elif kind is _STATE:
            t = x()
            if t is not None:
                _bind_data(t, data)
                if t._views:  # views taken outside the step follow it, as in eager
                    _write_through(t)
        elif kind is _GRAD:
            t = x()
            if t is not None:
                t.grad = _new(_LAZY, _VALUE(data))
        elif kind is _PGRAD:  # written in place: whichever tensor p.grad is (guarded)
            t = x().grad
            _bind_data(t, data)
            if t._views:
                _write_through(t)
        elif kind is _ARG:  # the caller's lazy tensor, written by the step
            t = leaves[x]
            _bind_data(t, data)
            if t._views:
                _write_through(t)
        elif kind is _HOST:
            write_host(leaves[x], data)
    for ref in plan.cleared:  # zero_grad() in the step
        t = ref()
        if t is not None:
            t.grad = None
    _next_step(_RNG_STATE)
    if _replays == 0:  # the first since a read: its counter takes its place in order
        _COUNTERS.setdefault("StepReplay", 0)
    _replays += 1
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

cdef object _NONE = None, _TENSOR = None, _NUMBER = None, _FLOAT = None
cdef object _tensor_key = None, _number_key = None
cdef object _TENSOR_TYPE = torch.Tensor


def configure_guards(*, none, tensor, number, float_, tensor_key, number_key):
    global _NONE, _TENSOR, _NUMBER, _FLOAT, _tensor_key, _number_key
    _NONE, _TENSOR, _NUMBER, _FLOAT = none, tensor, number, float_
    _tensor_key, _number_key = tensor_key, number_key


def optimizers_hold(tuple packed):
    """``OptimizerGuard.all_hold``: ``optimizer_holds`` of each."""
    for guard in packed:
        if not optimizer_holds(guard):
            return False
    return True


def modules_hold(tuple packed):
    """``ModuleGuard.all_hold``: ``module_holds`` of each."""
    for guard in packed:
        if not module_holds(guard):
            return False
    return True


cpdef bint optimizer_holds(guard) except -1:
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
            elif v is _NUMBER:  # (a float keys as _FLOAT: _number_key's common case, in C)
                if type(now) is float:
                    if key is not _FLOAT:
                        return False
                elif _number_key(now) != key:
                    return False
            elif now is not v and (isinstance(now, _TENSOR_TYPE) or now != v):
                return False
    return True


cpdef bint module_holds(guard) except -1:
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
