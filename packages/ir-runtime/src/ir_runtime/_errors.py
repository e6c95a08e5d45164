"""Exceptions ir_runtime raises. Each names the bad value, the rule and the fix."""


class RuntimeIRError(Exception):
    """Base class of every error ir_runtime raises."""


class DeviceCountError(RuntimeIRError, RuntimeError):
    """A device count asked for after the backend started with another one."""


class UnsupportedOpError(RuntimeIRError, NotImplementedError):
    """An op with no lowering rule."""


class LoweringError(RuntimeIRError, ValueError):
    """A graph that cannot be lowered: a rule rejected a node, or a bad parameter."""


class GraphError(LoweringError):
    """A graph that breaks the IR dialect (``check_graph``, ``docs/dialect.md``): every
    violation in one error, each naming its node's op and source line (``violations``)."""

    def __init__(self, message: str, violations=()):
        super().__init__(message)
        self.violations = list(violations)


class CompileError(RuntimeIRError, RuntimeError):
    """XLA failed to compile a lowered graph."""


class ExecutionError(RuntimeIRError, RuntimeError):
    """A compiled program failed on the device."""


class OutOfMemoryError(RuntimeIRError, MemoryError):
    """A program whose buffers do not fit in its devices' memory: found before it runs, from
    XLA's memory analysis of the compiled program, or reported by the device when it ran.
    The message names the program's largest buffers (shape, dtype, the op and line that made
    each)."""


class DeviceMismatchError(RuntimeIRError, RuntimeError):
    """Tensors on different devices combined in one op: a lazy tensor with a CPU model's
    parameter, or tensors placed over two meshes whose devices differ (in set or in order).
    Eager torch says "Expected all tensors to be on the same device"; so does this, naming
    both tensors and where each lives."""


class ProgramCheckError(RuntimeIRError, RuntimeError):
    """A check the program made on its own values failed: under ``IR_RUNTIME_PROGRAM_CHECKS=1``, an
    index out of range or an integer division by zero, which XLA cannot raise inside a
    program (it clamps the index, the quotient is undefined). Raised after the step that ran
    it, naming the op and its source line, as the error eager raises at that op."""


class CheckedIndexError(ProgramCheckError, IndexError):
    """An index out of range, found by ``IR_RUNTIME_PROGRAM_CHECKS=1`` (eager raises IndexError)."""


class CheckedDivisionError(ProgramCheckError, ZeroDivisionError):
    """An integer division by zero, found by ``IR_RUNTIME_PROGRAM_CHECKS=1`` (eager raises
    ``RuntimeError: ZeroDivisionError``)."""


class DTypeError(RuntimeIRError, TypeError):
    """A dtype XLA cannot take on this backend."""


class DistributedError(RuntimeIRError, RuntimeError):
    """Bad arguments for a run across processes, or joining one at the wrong time."""


class CheckpointError(RuntimeIRError):
    """Base class of ``CheckpointManager``'s errors (sharded checkpoints saved with orbax).

    Each subclass is also the builtin exception that site raised before this family existed,
    so an ``except KeyError`` (``ValueError``, ``TypeError``, ``FileNotFoundError``, ...)
    written against those still catches it. ``RecomputeError`` is a subclass too, for the
    code that caught activation recompute's errors as ``CheckpointError`` (its docstring).
    """


class CheckpointArgumentError(CheckpointError, ValueError):
    """A bad ``CheckpointManager`` argument: a ``save_interval`` or ``max_to_keep`` that is not
    a positive int, a step that is not a non-negative int."""


class CheckpointDirectoryError(CheckpointError, NotADirectoryError):
    """A checkpoint directory that is a file."""


class CheckpointExistsError(CheckpointError, ValueError):
    """A save of a step that the directory already holds a checkpoint of."""


class CheckpointStateError(CheckpointError, TypeError):
    """A state to save that is not a dict of str names to modules, optimizers, tensors and
    plain values (None, bool, int, float, str, lists, tuples, dicts with str keys)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A restore of a step the directory holds no complete checkpoint of (or of the latest
    step, where it holds none)."""


class CheckpointKeyError(CheckpointError, KeyError):
    """A restore whose names or keys differ from the checkpoint's: a part of the state, an
    optimizer or a ``state_dict`` key on one side only."""

    def __str__(self) -> str:
        return Exception.__str__(self)  # the message as written, not quoted as KeyError's


class CheckpointMismatchError(CheckpointError, ValueError):
    """A restore into something the checkpoint does not fit: a tensor of another shape or
    dtype, an optimizer with other parameter groups."""


class CheckpointReadError(CheckpointError, ValueError):
    """A checkpoint orbax cannot read (a file damaged or missing), or whose meta file is
    missing, not JSON, or not shaped as ``save`` writes it (named with its step and path)."""


class CheckpointSaveError(CheckpointError, RuntimeError):
    """A ``save_async`` that failed in the background: reported once, at ``join()`` or at the
    next ``save``/``save_async`` that saves a step (one the interval skips neither waits nor
    reports) or ``restore``, whichever comes first, with orbax's error as its cause. The call
    that reports it does nothing else; the steps saved before it are untouched."""


class RecomputeError(CheckpointError, RuntimeError):
    """A checkpointed function (``torch.utils.checkpoint``, activation recompute) the lazy
    device cannot recompute as it ran: it reads a lazy tensor's value to the host.

    A subclass of ``CheckpointError`` only for compatibility: this error was a
    ``CheckpointError`` before ``CheckpointManager``'s errors took that name, and Python's
    ``except`` matches by subclass alone, so this is the one way an ``except CheckpointError``
    around activation recompute keeps catching it. Catch ``RecomputeError`` in new code; an
    ``except CheckpointError`` meant for ``CheckpointManager`` alone sees it only when a
    recompute fails inside the same ``try``. Also a ``RuntimeError``, as before.
    """
