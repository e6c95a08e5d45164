"""Exceptions ir_runtime raises. Each names the bad value, the rule and the fix."""


class RuntimeIRError(Exception):
    """Base class of every error ir_runtime raises."""


class DeviceCountError(RuntimeIRError, RuntimeError):
    """A device count asked for after the backend started with another one."""


class UnsupportedOpError(RuntimeIRError, NotImplementedError):
    """An op with no lowering rule."""


class LoweringError(RuntimeIRError, ValueError):
    """A graph that cannot be lowered: a rule rejected a node, or a bad parameter."""


class CompileError(RuntimeIRError, RuntimeError):
    """XLA failed to compile a lowered graph."""


class ExecutionError(RuntimeIRError, RuntimeError):
    """A compiled program failed on the device."""


class DTypeError(RuntimeIRError, TypeError):
    """A dtype XLA cannot take on this backend."""


class DistributedError(RuntimeIRError, RuntimeError):
    """Bad arguments for a run across processes, or joining one at the wrong time."""


class CheckpointError(RuntimeIRError, RuntimeError):
    """A checkpointed function the lazy device cannot recompute as it ran (a host read)."""
