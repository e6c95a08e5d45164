"""Why did it compile again? ``IR_RUNTIME_DEBUG=1`` (or ``set_debug(True)``).

While debugging is on, every compile keeps a summary of its graph (``Summary``: each node's
op, shapes, attributes, sharding and origin, plus what else keyed the program), and every
compile after the first says, in one block on stderr, what differs from the closest graph
compiled before: the first node that differs (op, the torch file and line that recorded it, and
which input, attribute, sharding or output changed, with a guess at the usual cause), how many
others differ after it, and what else changed (donated buffers, pinned outputs, devices). A read
of a pending tensor to the host in the middle of a step gets a one-line note with its line.

Summaries hold no data and no node: shapes, attribute values and origins (code objects) only.
The last ``KEEP`` are kept, and nothing at all while debugging is off, which costs nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter, deque
from difflib import SequenceMatcher

from ir_core import DeviceData
from ir_runtime import _metrics

DEBUG = [os.environ.get("IR_RUNTIME_DEBUG", "0") not in ("", "0")]
KEEP = 32  # summaries of the last graphs compiled, to compare the next one with
_SUMMARIES: deque = deque(maxlen=KEEP)
_COMPILES = [0]  # compiles seen while debugging
_LOCK = threading.Lock()  # (graphs may be compiled from several threads)
_ALIGN_LIMIT = 20_000  # nodes beyond which graphs are compared position by position


def set_debug(on: bool = True) -> None:
    """Explain every recompile, and note host reads mid-step, on stderr (module docstring).
    ``IR_RUNTIME_DEBUG=1`` turns it on from the start."""
    DEBUG[0] = bool(on)
    if not on:
        _SUMMARIES.clear()


def note(text: str) -> None:
    """One message from the debugger: on stderr, and counted (``DebugNotes``)."""
    _metrics.count("DebugNotes")
    sys.stderr.write(f"[ir_runtime] {text}\n")
    sys.stderr.flush()


def where(origin) -> str:
    """An origin as text: ``file.py:41`` for the front end's, ``str()`` of any other."""
    if origin is None:
        return "an unknown line"
    short = getattr(origin, "short", None)
    return short() if short is not None else str(origin)


class Summary:
    """What identifies a compiled graph, without its data: per node (post-order) its op,
    output shapes, attributes, sharding, operand positions and origin; and the other parts of
    the program's key (``extra``: name -> value)."""

    __slots__ = ("count", "extra", "nodes", "number", "roots")

    def __init__(self, order, roots, extra: dict, number: int):
        position = {id(n): k for k, n in enumerate(order)}
        self.roots = tuple((position[id(r.node)], r.index) for r in roots)
        self.nodes = [
            (
                n.op,
                tuple(shape_text(s) for s in n.shapes),
                _attrs(n),
                None if n.sharding is None else spec_text(n.sharding),
                tuple((position[id(v.node)], v.index) for v in n.operands),
                n.origin,
            )
            for n in order
        ]
        self.extra = extra
        self.number = number
        self.count = Counter(_key(rec) for rec in self.nodes)


def _attrs(n) -> tuple:
    if type(n) is DeviceData:
        h = n.handle
        # A lifted Python number is a leaf whose value is the point: say which.
        if n.shape.dims == () and h is not None and type(h).__module__ == "numpy":
            return (("value", h.item()),)
        return ()
    return tuple((k, v) for k, v in n.attrs.items() if k != "__lifted__")


def shape_text(s) -> str:
    return f"{s.dtype}[{', '.join(map(str, s.dims))}]"


def spec_text(spec) -> str:
    try:
        return f"{spec.partition_spec} {spec.to_hlo_text()}"
    except Exception:  # a tuple sharding or an annotation of the user's
        return repr(spec)


def _key(rec) -> tuple:
    """What aligns two graphs' nodes: the op and where it was recorded (not its shapes, which
    are what a recompile usually changes)."""
    op, _, _, _, _, origin = rec
    if op == "device_data":
        return (op,)
    return (op, getattr(origin, "code", None), getattr(origin, "lasti", None))


def compiling(order, roots, extra: dict):
    """A graph is about to be compiled (a cache miss): explain it against the closest one
    compiled before; returns its summary, for ``compiled`` once it is."""
    if not DEBUG[0]:
        return None
    with _LOCK:
        _COMPILES[0] += 1
        number = _COMPILES[0]
        before = list(_SUMMARIES)
    new = Summary(order, roots, extra, number)
    best, score = None, 0.0
    for old in before:
        common = sum((old.count & new.count).values())
        s = common / max(len(old.nodes), len(new.nodes))
        if s > score:
            best, score = old, s
    if before:
        if best is None or score < 0.5:
            note(
                f"compile {new.number}: a new graph of {len(new.nodes)} nodes{_caller()}; no "
                f"graph compiled before resembles it (the first of its step?)"
            )
        else:
            note(explain(best, new))
    return new


def compiled(summary) -> None:
    """The graph of ``summary`` compiled: later compiles are compared with it."""
    if summary is not None and DEBUG[0]:
        with _LOCK:
            _SUMMARIES.append(summary)


def _caller() -> str:
    """`` for the call at train.py:60``: the innermost frame outside torch and this project."""
    f = sys._getframe(1)
    skip = ("/torch/", "/ir_runtime/", "/ir_core/", "/ir_sharding/", "/jax/", "/jaxlib/")
    while f is not None:
        name = f.f_code.co_filename
        if not any(s in name for s in skip) and not name.startswith("<frozen"):
            return f" for the call at {name.rsplit('/', 1)[-1]}:{f.f_lineno}"
        f = f.f_back
    return ""


def explain(old: Summary, new: Summary) -> str:
    """The block that says how ``new`` differs from ``old``."""
    diffs = _differences(old, new)
    head = (
        f"compile {new.number} ({len(new.nodes)} nodes){_caller()} differs from compile "
        f"{old.number} ({len(old.nodes)} nodes)"
    )
    lines = []
    made = _state_made(old, new)
    if made is not None:  # the expected second compile: say so, not what it looks like
        head = f"compile {new.number} ({len(new.nodes)} nodes){_caller()}: a step's second"
        lines = [
            f"compile {old.number} made tensors that are inputs now ({made})",
            "optimizer state, or other state a first step creates: expected once",
        ]
        return head + "".join(f"\n    {line}" for line in lines)
    roots = _roots_changed(old, new, diffs)
    if diffs:
        head += f" in {len(diffs)} node{'s' if len(diffs) != 1 else ''}; the first:"
        lines.append(diffs[0])
        if len(diffs) > 1:
            lines.append(f"then {len(diffs) - 1} more, downstream of it or elsewhere; the next:")
            lines.append(diffs[1])
    if roots:
        lines.append(roots)
    for name in sorted(set(old.extra) | set(new.extra)):
        a, b = old.extra.get(name), new.extra.get(name)
        if a != b:
            lines.append(_extra_changed(name, a, b))
    if not lines:
        head += ": in nothing this debugger sees (a cache that was cleared, or a full cache)"
    return head + "".join(f"\n    {line}" for line in lines)


# Ops that make a tensor of their own (zeros, a copy's shape): on a first step, optimizer
# state (``exp_avg = torch.zeros_like(p)``), momentum buffers, a step count.
_FACTORIES = {
    "aten::zeros", "aten::zeros_like", "aten::ones", "aten::ones_like", "aten::full",
    "aten::full_like", "aten::empty", "aten::empty_like", "aten::new_zeros", "aten::new_full",
    "aten::new_empty", "aten::new_ones", "aten::scalar_tensor", "aten::clone",
}  # fmt: skip


def _state_made(old: Summary, new: Summary) -> str | None:
    """Whether ``new`` reads as inputs what ``old`` made (a step's second compile, once the
    first made the optimizer's state): it has more data inputs, and ``old`` had tensor-making
    ops that ``new`` has fewer of. Then where they were made, in a few words; else None."""
    inputs_old = sum(1 for rec in old.nodes if rec[0] == "device_data")
    inputs_new = sum(1 for rec in new.nodes if rec[0] == "device_data")
    if inputs_new <= inputs_old:
        return None
    gone = [
        rec
        for rec in old.nodes
        if rec[0].split(".")[0] in _FACTORIES and old.count[_key(rec)] > new.count[_key(rec)]
    ]
    if not gone:
        return None
    more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
    return f"{inputs_new - inputs_old} more: {_name(gone[0])}{more}"


_LONG = 100  # characters of a value beyond which a changed part of the key is summarized


def _extra_changed(name: str, a, b) -> str:
    """A line saying how a part of the program's key changed: in full when short; for long
    sequences, their lengths and the first element that differs."""
    line = f"{name} was {a}, now {b}"
    if len(line) <= 2 * _LONG:
        return line
    if not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))):
        return line[: 2 * _LONG] + " ..."
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if k is None:  # one is the other's beginning
        k = min(len(a), len(b))
    was = a[k] if k < len(a) else "nothing"
    now = b[k] if k < len(b) else "nothing"
    return f"{name} changed ({len(a)} entries, now {len(b)}); first at {k}: {was}, now {now}"


def _roots_changed(old: Summary, new: Summary, diffs) -> str | None:
    """What changed in the graph's outputs (the live tensors the step computes), if anything."""
    a, b = len(old.roots), len(new.roots)
    if a != b:
        return (
            f"the step computes {b} tensors, {a} before (a tensor kept alive on some steps only, "
            f"for logging or a check? or one no longer used)"
        )
    if diffs:
        return None
    for k, ((pa, ia), (pb, ib)) in enumerate(zip(old.roots, new.roots, strict=True)):
        if (pa, ia) != (pb, ib):
            return (
                f"output {k} is now {_name(new.nodes[pb])} (was {_name(old.nodes[pa])}): the "
                f"live tensors come in another order or another set"
            )
    return None


def _differences(old: Summary, new: Summary) -> list[str]:
    """A line per differing node of ``new``, in post-order (causes before their effects)."""
    a, b = old.nodes, new.nodes
    if len(a) == len(b) and [_key(r) for r in a] == [_key(r) for r in b]:
        pairs = [("equal", 0, len(a), 0, len(b))]
    elif max(len(a), len(b)) > _ALIGN_LIMIT:
        n = min(len(a), len(b))
        pairs = [("equal", 0, n, 0, n), ("replace", n, len(a), n, len(b))]
    else:
        pairs = SequenceMatcher(None, [_key(r) for r in a], [_key(r) for r in b], autojunk=False)
        pairs = pairs.get_opcodes()
    out = []  # (position in new, text)
    mapping = {}  # position in old -> its counterpart's in new
    for tag, i1, i2, j1, j2 in pairs:
        if tag == "equal":
            mapping.update(zip(range(i1, i2), range(j1, j2), strict=True))
    for tag, i1, i2, j1, j2 in pairs:
        if tag == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2), strict=True):
                text = _changed(a, b, i, j, mapping)
                if text is not None:
                    out.append((j, text))
            continue
        for j in range(j1, j2):
            if b[j][0] != "device_data":
                out.append((j, f"{_name(b[j])} is new: the graph compiled before has no such node"))
        for i in range(i1, i2):
            if a[i][0] != "device_data":
                out.append((j1, f"{_name(a[i])} is gone: this graph has no such node"))
    out.sort(key=lambda p: p[0])
    return [text for _, text in out]


def _name(rec) -> str:
    op, origin = rec[0], rec[5]
    return f"`{op}` at {where(origin)}" if origin is not None else f"`{op}`"


def _changed(a, b, i, j, mapping: dict) -> str | None:
    """How node ``b[j]`` differs from its counterpart ``a[i]`` (``mapping``: each node of
    ``a``'s counterpart in ``b``), or None."""
    op, shapes_a, attrs_a, sharding_a, operands_a, _ = a[i]
    _, shapes_b, attrs_b, sharding_b, operands_b, _ = b[j]
    if op == "device_data":
        return None  # said where it is read: at the first op that reads it
    name = _name(b[j])
    if len(operands_a) != len(operands_b):
        return f"{name}: has {len(operands_b)} inputs, had {len(operands_a)}"
    for k, ((pa, ia), (pb, ib)) in enumerate(zip(operands_a, operands_b, strict=True)):
        was, now = a[pa][1][ia], b[pb][1][ib]
        if was != now:
            return f"{name}: input {k} was {was}, now {now}{_hint(was, now)}"
        va, vb = dict(a[pa][2]).get("value"), dict(b[pb][2]).get("value")
        if a[pa][0] == "device_data" and va != vb and (va is None) != (vb is None):
            return f"{name}: input {k} was {_leaf(a[pa])}, now {_leaf(b[pb])}"
        if a[pa][3] != b[pb][3] and a[pa][0] == "device_data":
            return f"{name}: input {k} was placed {a[pa][3]}, now {b[pb][3]}"
        leaves = a[pa][0] == "device_data" and b[pb][0] == "device_data"
        if (
            (mapping.get(pa) != pb and not leaves)
            or ia != ib
            or (leaves and _ordinal(a, pa) != _ordinal(b, pb))
        ):
            return (
                f"{name}: input {k} is another value now: {_input(b, pb)} (was {_input(a, pa)}); "
                f"the same tensor passed twice, or tensors in another order?"
            )
    if attrs_a != attrs_b:
        da, db = dict(attrs_a), dict(attrs_b)
        for key in sorted(set(da) | set(db)):
            if da.get(key, "absent") != db.get(key, "absent"):
                return (
                    f"{name}: attribute {key!r} was {da.get(key, 'absent')!r}, now "
                    f"{db.get(key, 'absent')!r} (a Python value that changes between steps is "
                    f"a new program each time: pass it as a tensor)"
                )
    if sharding_a != sharding_b:
        return f"{name}: sharding was {sharding_a}, now {sharding_b}"
    if shapes_a != shapes_b:
        return f"{name}: output was {', '.join(shapes_a)}, now {', '.join(shapes_b)}"
    return None


def _ordinal(nodes, p) -> int:
    """Which of the graph's data inputs (in the order the graph first reads them) node ``p`` is."""
    return sum(1 for rec in nodes[:p] if rec[0] == "device_data")


def _input(nodes, p) -> str:
    rec = nodes[p]
    if rec[0] == "device_data":
        return f"data input {_ordinal(nodes, p)} ({rec[1][0]})"
    return _name(rec)


def _leaf(rec) -> str:
    value = dict(rec[2]).get("value")
    return rec[1][0] if value is None else f"the number {value!r} ({rec[1][0]})"


def _hint(was: str, now: str) -> str:
    """A guess at why a shape changed, from the two shapes' text."""
    da, ta = _dims(was)
    db, tb = _dims(now)
    if ta != tb:
        return " (another dtype)"
    if da is None or db is None or len(da) != len(db):
        return ""
    changed = [k for k in range(len(da)) if da[k] != db[k]]
    if changed == [0] and db[0] < da[0]:
        return " (a partial last batch? drop it, or pad it to the full size)"
    if len(changed) == 1 and db[changed[0]] == da[changed[0]] + 1:
        return " (a growing sequence? pad it to a fixed length, or use a static cache)"
    return ""


def _dims(text: str):
    """``float32[16, 32]`` -> ((16, 32), "float32")."""
    if "[" not in text or not text.endswith("]"):
        return None, text
    dtype, _, rest = text.partition("[")
    inner = rest[:-1].strip()
    try:
        return tuple(int(d) for d in inner.split(",") if d.strip()), dtype
    except ValueError:
        return None, dtype


def host_read(shape, origin, tensors: int) -> None:
    """A pending tensor is read to the host in the middle of a step."""
    if DEBUG[0]:
        note(
            f"host read of {shape} at {where(origin)}: ran its pending graph mid-step "
            f"({tensors} tensor{'s' if tensors != 1 else ''} computed)"
        )
