"""``torch.compile(model, backend="ir_runtime")``: XLA through PyTorch's own compiler entry point.

The design: Dynamo captures the Python program into FX graphs on fake tensors, AOTAutograd
turns each into a functional ATen forward graph and backward graph (input mutations as extra
outputs it applies itself, aliases it regenerates), and this backend compiles each ATen graph
with the one engine: the graph is run once per concrete input signature on placeholder lazy
tensors, so every ATen op goes through the front end's dispatch (the rule table keyed by
``aten::name.overload``, its decompositions), the recorded IR is compiled through the compile
cache, and each call runs that executable on the call's arrays, with no re-tracing.

Why not make ``LazyTensor`` a traceable subclass: its payload is an IR node, not an inner torch
tensor, so AOTAutograd could not trace through it; Dynamo fakes a lazy tensor as a plain tensor
of the lazy device instead (``_capture``). Why not re-run each graph on lazy tensors per call
for plain tensors too (torch_xla's bridge): that re-traces every call; here a call on plain
tensors costs a cache lookup and a launch.

A graph on lazy tensors (``_OnLazy``) is recorded on them at each call, through the same
dispatch, into the lazy graph: its results are pending until ``mark_step`` runs them as one
SPMD program with the tensors' shardings, or are part of the program of the ``compile_step``
tracing it, which then replays.

What a call on plain tensors does:

- A CPU tensor becomes a device array through DLPack (no copy where XLA takes the memory as
  it is) and is never donated: it is borrowed, and an eager optimizer may write it once the
  call returns. The call waits for its results before returning, so no
  program reads a borrowed buffer after that. A tensor not written since the last call
  (``_version``, the same storage) is not placed again where its device array is its own
  memory; a copied one (non-contiguous) is placed every call. An output that is a graph
  input is that tensor; a copy of an input is a new tensor.
- Ops that cannot run on the device are found before anything runs (``_probe``), and an op's
  second or later output never crosses between the device and the host (``_same_side``).
- Random ops (dropout) draw from a key that is an input of the program, two words drawn per
  call from torch's CPU generator: each call draws new numbers, and ``torch.manual_seed``,
  ``fork_rng``, ``set_rng_state`` and checkpointing's recompute replay them as eager's.
- Shapes: each ATen graph keeps one program per concrete signature (shapes, dtypes, the ints
  Dynamo passes for symbolic sizes), at most ``max_programs`` of them (the oldest dropped).
  With ``dynamic=False`` a new batch shape is a Dynamo recompile and one more program; with
  Dynamo's default (dynamic after the second shape) the graph is symbolic and each concrete
  shape compiles once here. ``DynamoGraphs`` counts the graphs Dynamo hands over,
  ``DynamoPrograms`` the programs traced for them; ``CompileCount`` counts XLA's compiles;
  ``DynamoInputsPlaced`` the tensors made device arrays (not those reused).
- An op the front end cannot record on the lazy device (no rule, no decomposition, a value
  read to the host) is found when the graph is first traced: the graph is split
  (``CapabilityBasedPartitioner``) into programs for the parts that can run and that op,
  run eagerly between them as torch would (``DynamoEagerOps::<op>`` counts each). Under
  ``torch.compile(..., fullgraph=True)`` such an op is an ``UnsupportedOpError`` naming it.
- Forward and backward are two programs (AOTAutograd's split: what the backward needs is
  saved by the forward); both are compiled by the same cache.

``mode=`` (torch's names): ``"default"``, ``"reduce-overhead"``, ``"max-autotune"`` and
``"max-autotune-no-cudagraphs"`` run the same programs: a call is already one launch of a
cached executable (what CUDA graphs buy inductor), and XLA tunes its own kernels. Any other
mode is refused by name. ``options=``: ``max_programs`` (an int >= 1, default 8) and
``partition`` (a bool, default True; False makes an op that cannot run on the device an error
as under ``fullgraph=True``); any other key is refused by name.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
import threading

import jax
import numpy as np
import torch
import torch.fx
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from ir_core import DeviceData, Shape, Value
from ir_runtime import _metrics
from ir_runtime._bounded import Bounded
from ir_runtime._cache import CACHE
from ir_runtime._errors import RuntimeIRError, UnsupportedOpError
from ir_runtime._execute import place
from ir_runtime._frontend.dynamo import _capture
from ir_runtime._frontend.dynamo._resident import device_array, host_array, plain, to_torch
from ir_runtime._frontend.recording import _convert, _rng
from ir_runtime._frontend.recording._convert import ir_dtype
from ir_runtime._frontend.recording._tensor import LazyTensor, base_of, wrap
from ir_runtime._frontend.steps import _step, _trace
from ir_sharding import ShardingError

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
OPTIONS = {"max_programs": 8, "partition": True}

_LOCK = threading.RLock()  # tracing changes the front end's state: one trace at a time
_KEY_BASE = 0xC0000000  # (offsets the lazy stream's own keys never reach)


def _settings(mode, options) -> dict:
    if mode is not None and mode not in MODES:
        raise ValueError(
            f"torch.compile(backend='ir_runtime'): mode {mode!r} is not one of {list(MODES)}"
        )
    settings = dict(OPTIONS)
    for k, v in (options or {}).items():
        if k not in OPTIONS:
            raise ValueError(
                f"torch.compile(backend='ir_runtime'): unknown option {k!r}; the options are "
                f"{sorted(OPTIONS)}"
            )
        if k == "max_programs" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"option max_programs must be an int of at least 1, got {v!r}")
        if k == "partition" and not isinstance(v, bool):
            raise ValueError(f"option partition must be a bool, got {v!r}")
        settings[k] = v
    return settings


def _saved_for_backward():
    """The forward graph's outputs that AOTAutograd saves for the backward (a slice), or None
    where its metadata does not say."""
    try:
        from torch._functorch import config
        from torch._guards import TracingContext

        meta = TracingContext.try_get().fw_metadata
        saved = meta.tensors_saved_for_backwards_slice
    except Exception:
        return None
    # The graph's outputs open with one token per effect (``_linalg_check_errors``: inv,
    # solve, cholesky), which the metadata's positions do not count.
    tokens = 0 if config.unlift_effect_tokens else len(meta.tokens)
    return slice(saved.start + tokens, saved.stop, saved.step)


def _current_tx():
    """Dynamo's translator making the graph handed over, or None (a direct call)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return InstructionTranslator.current_tx()
    except Exception:  # (not inside a capture)
        return None


def backend(gm, example_inputs, mode=None, options=None):
    """The backend torch.compile finds by the name ``"ir_runtime"`` (module docstring)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from ir_runtime._frontend._install import install

    install()
    install_capture()
    settings = _settings(mode, options)
    tx = _current_tx()
    if getattr(tx, "one_graph", False):  # (under fullgraph=True)
        settings["partition"] = False
    _metrics.count("DynamoGraphs")

    def compiler(graph, inputs, saved=None):
        run = _OnLazy(graph) if _on_lazy(graph) else _Partitioned(graph, settings, saved)
        return make_boxed_func(run)  # (AOTAutograd's convention)

    def forward(graph, inputs):
        return compiler(graph, inputs, _saved_for_backward())

    compiled = aot_autograd(fw_compiler=forward, bw_compiler=compiler, inference_compiler=compiler)(
        gm, example_inputs
    )
    return _Captured(gm, compiled, example_inputs, None if tx is None else tx.output)


class _Captured:
    """What Dynamo calls for one graph it captured for this backend: AOTAutograd's compiled
    function, with what that function cannot see.

    - A ``compile_step`` tracing the call guards the modules Dynamo read while capturing
      (their mode, parameters, submodules): the graph runs no module hooks, so the step's
      own hook sees none of them called.
    - On lazy tensors that share data (a tensor and its view or ``detach()``, which torch
      does not see as views of each other: the front end tracks them), a graph that writes
      an input would read each input as it was before the other's write: Dynamo's own graph
      runs on them instead, as lazy mode runs the model's code (``DynamoLazyAliasedCalls``).
    """

    def __init__(self, gm, compiled, example_inputs, output):
        self.gm, self.compiled = gm, compiled
        self.writes = any(map(_capture.on_lazy_device, example_inputs)) and _writes(gm)
        self.modules = _capture.modules_read(output)

    def __call__(self, *args):
        watchers = _trace.module_watchers()
        if watchers:
            for ref in self.modules:
                m = ref()
                if m is not None:
                    for fn in watchers:
                        fn(m, ())
        if self.writes and _shared(args):
            _metrics.count("DynamoLazyAliasedCalls")
            return self.gm.forward(*args)  # (not a module call: no hooks see it)
        return self.compiled(*args)


def _writes(gm) -> bool:
    """Whether Dynamo's graph may write a tensor in place (an in-place method or op, an
    ``out=``, an item assignment): conservatively, by name and schema."""
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method"):
            continue
        t = n.target
        name = t if isinstance(t, str) else getattr(t, "__name__", "")
        if name.endswith("_") and not name.endswith("__"):
            return True
        if t is operator.setitem or "out" in n.kwargs:
            return True
        schema = getattr(t, "_schema", None)
        if schema is not None and schema.is_mutable:
            return True
    return False


def _shared(args) -> bool:
    """Whether two of the lazy tensors in ``args`` share data (the same root of views and
    aliases)."""
    roots, count = set(), 0
    for a in args:
        if isinstance(a, LazyTensor):
            count += 1
            while a._view is not None:
                base = base_of(a._view[0])
                if base is None:
                    break
                a = base
            roots.add(id(a))
    return len(roots) < count


def install_capture() -> None:
    """Dynamo's hooks for lazy inputs (``_capture``), imported with Dynamo itself."""
    _capture.install(_ours)


def _on_lazy(gm) -> bool:
    """Whether an ATen graph computes on the lazy device: a value of it (an input, or a tensor
    it makes, such as positions from ``arange(..., device=ids.device)``) is a lazy tensor."""
    return any(
        _capture.on_lazy_device(v)
        for n in gm.graph.nodes
        for v in tree_flatten(n.meta.get("val"))[0]
    )


def _ours(fn) -> bool:
    """Whether Dynamo's compiler function ``fn`` is this backend (through the wrappers torch
    puts around a backend: mode and options, debugging, partial arguments)."""
    for _ in range(8):
        if fn is backend:
            return True
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        fn = (
            getattr(fn, "_torchdynamo_orig_backend", None)
            or getattr(fn, "compiler_fn", None)
            or getattr(fn, "__wrapped__", None)
        )
        if fn is None:
            return False
    return False


class _OnLazy:
    """One ATen graph whose inputs are lazy tensors: each call records the graph's ops on them
    into the lazy graph, as the model's own code would in lazy mode, through the same
    dispatch. The results are lazy tensors, pending until ``mark_step`` runs them (or a
    ``compile_step`` replays the step they are in), with the inputs' shardings; a changed
    sharding is a new program there. An op without a rule is the front end's own error
    naming it: lazy inputs are not split between programs and eager ops."""

    def __init__(self, gm):
        self.gm = gm
        self.effects = any(n.target is _WITH_EFFECTS for n in gm.graph.nodes)

    def __call__(self, *args):
        _metrics.count("DynamoLazyCalls")
        with torch.no_grad():  # (the graph is functional: AOTAutograd does the autograd)
            if self.effects:
                return _Runner(self.gm).run(*args)
            return self.gm.forward(*args)  # (not a module call: no hooks see it)


# -- running a graph ----------------------------------------------------------------------------


class _CannotRun(Exception):
    """A node the lazy device cannot run (``node``), with the error it raised."""

    def __init__(self, node, error):
        super().__init__(str(error))
        self.node, self.error = node, error


class _Runner(torch.fx.Interpreter):
    """Runs the graph node by node; an op with a side effect (``with_effects``, its token
    threaded through) is called as itself."""

    def call_function(self, target, args, kwargs):
        if target is _WITH_EFFECTS:
            token, op, *rest = args
            out = op(*rest, **kwargs)
            return (
                (token,) if out is None else (token, *out) if type(out) is tuple else (token, out)
            )
        return super().call_function(target, args, kwargs)


class _Tracer(_Runner):
    """Runs the graph on placeholder lazy tensors; names the node an op fails at. The graph
    was traced on CPU tensors, so the CPU device it names (``_to_copy(..., device=cpu)``,
    factories' ``device=``) is the device its program runs on: the lazy device here."""

    def fetch_args_kwargs_from_env(self, n):
        args, kwargs = super().fetch_args_kwargs_from_env(n)
        if any(_is_cpu(a) for a in args):
            args = tuple(_convert.DEVICE if _is_cpu(a) else a for a in args)
        if _is_cpu(kwargs.get("device")):
            kwargs = {**kwargs, "device": _convert.DEVICE}
        return args, kwargs

    def run_node(self, n):
        try:
            return super().run_node(n)
        except (RuntimeIRError, ShardingError) as e:  # (no rule; a value read to the host)
            raise _CannotRun(n, e) from e


_WITH_EFFECTS = torch.ops.higher_order.with_effects


class _Prober(_Tracer):
    """``_Tracer`` that goes on past a node that cannot run, with placeholders of the value
    AOTAutograd recorded for it (``node.meta["val"]``), naming each such op in ``failing``."""

    def __init__(self, gm):
        super().__init__(gm)
        self.failing: dict = {}

    def run_node(self, n):
        try:
            return super().run_node(n)
        except _CannotRun as e:
            if n.op != "call_function" or "val" not in n.meta:
                raise
            self.failing.setdefault(n.target, e)
            return tree_map(_stand_in, n.meta["val"])


def _stand_in(v):
    return wrap(Value(_placeholder(v))) if isinstance(v, torch.Tensor) else v


def _probe(gm, args) -> dict:
    """The ops of ``gm`` that cannot run on the device, for a call on ``args``: ``{target:
    the _CannotRun it raised}``."""
    prober = _Prober(gm)
    traced = [wrap(Value(_placeholder(a))) if isinstance(a, torch.Tensor) else a for a in args]
    with _tracing():
        prober.run(*traced)
    return prober.failing


def _is_cpu(d) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cpu"
    return isinstance(d, str) and d == "cpu"


class _Partitioned:
    """One ATen graph AOTAutograd hands over, as a callable: one ``_Programs`` for the whole
    graph, or, where ops cannot run on the device, the graph split into ``_Programs`` around
    those ops' eager calls. Which ops those are is found before anything runs: the first call
    traces the whole graph on placeholders, going on past a node that fails with a
    placeholder of the shape AOTAutograd recorded for it (``_probe``)."""

    def __init__(self, gm, settings, saved=None):
        self.gm, self.settings, self.saved = gm, settings, saved
        self.eager: set = set()  # op targets run eagerly
        self.run = None

    def __call__(self, *args):
        _trace.note_host_reads(args)  # (for a compile_step tracing around the call)
        if self.run is None:
            self._plan(_probe(self.gm, args))
        while True:
            try:
                return self.run(*args)
            except _CannotRun as e:  # (a later signature's own: split again, then rerun)
                self._plan({e.node.target: e})

    def _plan(self, failing: dict) -> None:
        if failing and not self.settings["partition"]:
            target, e = next(iter(failing.items()))
            raise UnsupportedOpError(
                f"torch.compile(backend='ir_runtime'): {target} cannot run on the lazy device "
                f"({e.error}); without fullgraph=True (and with options partition=True) it "
                f"would run eagerly between programs"
            ) from e.error
        eager = self.eager | set(failing)
        if eager == self.eager and self.run is not None:
            target, e = next(iter(failing.items()))
            raise UnsupportedOpError(
                f"torch.compile(backend='ir_runtime'): {target} cannot run on the lazy device "
                f"though it runs eagerly here ({e.error})"
            ) from e.error
        eager = _same_side(self.gm, eager)
        self.run = (
            _split_graph(self.gm, eager, self.settings)
            if eager
            else _Programs(self.gm, self.settings, self.saved)
        )
        self.eager = eager


def _same_side(gm, eager: set) -> set:
    """``eager`` grown until no op's second or later output crosses between the device and
    the host: such outputs (a log-sum-exp, saved statistics, indices) are the kernel's own on
    one side and a decomposition's on the other, and need not mean the same."""
    getitem = operator.getitem
    while True:
        grown = set(eager)
        for n in gm.graph.nodes:
            if n.op != "call_function" or n.target is not getitem or n.args[1] == 0:
                continue
            producer = n.args[0]
            if producer.op != "call_function":
                continue
            for user in n.users:
                if user.op != "call_function":
                    continue
                if (producer.target in grown) != (user.target in grown):
                    grown |= {producer.target, user.target}
        if grown == eager:
            return eager
        eager = grown


def _split_graph(gm, eager: set, settings):
    """``gm`` with every node whose op is in ``eager`` left to run as torch runs it, and the
    rest fused into submodules, each run as ``_Programs``."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupport

    class Support(OperatorSupport):
        def is_node_supported(self, submodules, node) -> bool:
            return node.op == "call_function" and node.target not in eager

    partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
    fused = partitioner.fuse_partitions(partitioner.propose_partitions())
    for name, sub in list(fused.named_children()):
        if name.startswith("fused_"):
            setattr(fused, name, _Submodule(_Programs(sub, settings)))
    for node in fused.graph.nodes:
        if node.op == "call_function" and node.target in eager:
            _metrics.count(f"DynamoEagerOps::{getattr(node.target, '__name__', node.target)}")
    fused.recompile()
    return fused


class _Submodule(torch.nn.Module):
    def __init__(self, programs):
        super().__init__()
        self.programs = programs

    def forward(self, *args):
        return self.programs(*args)


class _Programs:
    """The programs of one graph, one per concrete call signature (at most ``max_programs``)."""

    def __init__(self, gm, settings, saved=None):
        self.gm, self.saved = gm, saved  # (saved: the outputs the backward reads, a slice)
        self.programs = Bounded(settings["max_programs"])

    def __call__(self, *args):
        key = tuple(
            (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else (type(a), a) for a in args
        )
        program = self.programs.get(key)
        if program is None:
            program = self.programs[key] = _Program(self.gm, args, self.saved)
        return program(args)


@contextlib.contextmanager
def _tracing(key=None):
    """The context a graph is traced in: isolated (nothing recorded is live; a tensor from
    outside written in place is named in ``written``), no autograd, random ops drawing from
    ``key`` at offsets from 0 (the lazy stream's own place kept), one trace at a time."""
    with _LOCK:
        with (
            _step.Isolated("torch.compile(backend='ir_runtime')") as isolated,
            torch.no_grad(),
            _rng.own_key(Value(key if key is not None else DeviceData(Shape("uint32", (3,))))),
        ):
            yield isolated


def _placeholder(t: torch.Tensor) -> DeviceData:
    """A data node of ``t``'s shape and dtype (``t`` a tensor, or AOTAutograd's fake one)."""
    return DeviceData(Shape(ir_dtype(t.dtype), tuple(int(d) for d in t.shape)))


class _Program:
    """One graph traced on placeholders for one call signature, compiled."""

    def __init__(self, gm, args, saved=None):
        _metrics.count("DynamoPrograms")
        inputs = [_placeholder(a) if isinstance(a, torch.Tensor) else None for a in args]
        key = DeviceData(Shape("uint32", (3,)))
        traced = [wrap(Value(p)) if p is not None else a for p, a in zip(inputs, args, strict=True)]
        with _tracing(key) as isolated:
            out = _Tracer(gm).run(*traced)
        # The graph's outputs as nodes: one that is a graph input is that input (AOTAutograd
        # regenerates views of inputs itself); any other output is a new tensor, though the
        # device records a copy (clone) as the value it copies.
        output = next(n for n in gm.graph.nodes if n.op == "output")
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        out_nodes = tree_flatten(output.args[0])[0]
        if isolated.written:
            raise UnsupportedOpError(
                f"torch.compile(backend='ir_runtime'): the graph writes a tensor from outside "
                f"it in place ({isolated.written[0]})"
            )
        flat, self.spec = tree_flatten(out)
        where = {id(p): k for k, p in enumerate(inputs) if p is not None}
        # Each output: ("arg", k) an input as it is, ("root", j) a program result, or
        # ("value", v) a Python value the graph returns.
        self.outputs, roots = [], []
        for o, o_node in zip(flat, out_nodes, strict=True):
            if isinstance(o_node, torch.fx.Node) and o_node.op == "placeholder":
                self.outputs.append(("arg", placeholders.index(o_node)))
            elif isinstance(o, LazyTensor):
                node = o._ir.node
                if type(node) is DeviceData and o._ir.index == 0 and id(node) in where:
                    self.outputs.append(("copy", where[id(node)]))
                else:
                    self.outputs.append(("root", len(roots)))
                    roots.append(o._ir)
            else:
                self.outputs.append(("value", o))
        # The results the backward reads stay device arrays (``Resident``).
        kept = range(len(self.outputs))[saved] if saved is not None else ()
        self.resident = frozenset(self.outputs[k][1] for k in kept if self.outputs[k][0] == "root")
        self.exe = None
        if roots:
            self.exe, g = CACHE.get(roots)
            self.sources = []  # per program parameter: ("arg", k), ("key",) or ("data", node)
            for p in g.params:
                if id(p) in where:
                    self.sources.append(("arg", where[id(p)]))
                elif p is key:
                    self.sources.append(("key",))
                else:
                    self.sources.append(("data", p))

    def __call__(self, args):
        results = []
        if self.exe is not None:
            arrays, hosts = [], _Hosts()
            for (kind, *what), sharding in zip(self.sources, self.exe.in_shardings, strict=True):
                if kind == "arg":
                    arrays.append(_on_device(args[what[0]], sharding, hosts, len(arrays)))
                elif kind == "key":
                    arrays.append(hosts.add(len(arrays), _key(), sharding, tensor=False))
                else:
                    arrays.append(place(what[0], sharding))
            hosts.place(arrays)
            outs = self.exe.run(arrays)
            jax.block_until_ready(outs)  # (the inputs are borrowed: nothing reads them after)
            results = to_torch(outs, self.resident)
        flat = [
            plain(args[what])  # (a backward may return what the forward saved: a Resident)
            if kind == "arg"
            else results[what]
            if kind == "root"
            else args[what].clone()
            if kind == "copy"
            else what
            for kind, what in self.outputs
        ]
        return tree_unflatten(flat, self.spec)


def _key() -> np.ndarray:
    """A call's random key: two words drawn from torch's CPU generator, and a base of its own.
    So ``torch.manual_seed``, ``fork_rng``, ``set_rng_state`` and activation checkpointing's
    recompute (which restores the generator) replay a call's draws as they replay eager's."""
    with _LOCK:
        words = torch.randint(0, 2**32, (2,), dtype=torch.int64).tolist()
    return np.array([words[0], words[1], _KEY_BASE], np.uint32)


_BORROWED = WeakIdKeyDictionary()  # tensor -> (version, data pointer, array)


class _Hosts:
    """A call's host arrays still to place, placed together (their transfers overlap)."""

    def __init__(self):
        self.at, self.arrays, self.shardings, self.keep = [], [], [], []
        self.tensors = 0  # (DynamoInputsPlaced counts tensors: the random key is not one)

    def add(self, k: int, array, sharding, keep=None, tensor: bool = True):
        self.at.append(k)
        self.arrays.append(array)
        self.shardings.append(sharding)
        self.keep.append(keep)
        self.tensors += tensor
        return None

    def place(self, arrays: list) -> None:
        if not self.at:
            return
        placed = jax.device_put(self.arrays, self.shardings)
        _metrics.count("DynamoInputsPlaced", self.tensors)
        for k, a, keep in zip(self.at, placed, self.keep, strict=True):
            arrays[k] = a
            # Kept for the next call only where the array is the tensor's own memory: a write
            # the version counter does not see (``.data``, numpy) is then read as it is; a
            # copy is not kept.
            if keep is not None and _shares(a, keep[0]):
                _BORROWED[keep[0]] = (*keep[1:], a)


def _on_device(t: torch.Tensor, sharding, hosts: _Hosts, k: int):
    """A plain tensor's data as a device array: a ``Resident``'s own, the one made at an
    earlier call if the tensor was not written since, else (left to ``hosts``) its memory
    through DLPack (a copy only where XLA needs one)."""
    array = device_array(t, sharding)
    if array is not None:
        return array
    cacheable = not t.is_inference()  # (an inference tensor has no version counter)
    keep = None
    if cacheable:
        seen = _BORROWED.get(t)
        version, ptr = t._version, t.data_ptr()
        if seen is not None and seen[0] == version and seen[1] == ptr:
            return seen[2]
        keep = (t, version, ptr)
    src = t.detach()
    if src.device.type != "cpu":
        src = src.cpu()
    return hosts.add(k, host_array(src.contiguous()), sharding, keep)


def _shares(array, t: torch.Tensor) -> bool:
    try:
        return t.device.type == "cpu" and array.unsafe_buffer_pointer() == t.data_ptr()
    except Exception:  # (a sharded array: no one buffer)
        return False


# Dynamo takes lazy tensors in as tensors of the lazy device when it captures for this backend
# (``_capture``): the hooks are installed when torch's entry point loads the backend
# (``entry_point``), when ``ir_runtime.dynamo_backend`` is first read, or at this import if
# Dynamo is imported already. Importing this module alone imports no Dynamo.
if "torch._dynamo" in sys.modules:
    install_capture()


def __getattr__(name):
    if name == "entry_point":  # (what torch's torch_dynamo_backends entry point loads)
        install_capture()
        return backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The backend by its public name (``ir_runtime.dynamo_backend``): ``torch.compile(m,
# backend=ir_runtime.dynamo_backend)``, or ``torch._dynamo.register_backend`` under a name.
dynamo_backend = backend
