"""The one-collective-in-flight rule on CPU, and waiting for launched programs.

XLA's CPU collectives deadlock when several executions of collective programs overlap (README,
collectives): at most one may be in flight. Its first result is kept (``_launch``, in C, where
every launch is noted and ``settle`` waits); the next collective program, a reshard, or a
cross-process gather waits for it before it starts. One execution's results become ready
together, so waiting on one is enough. The host meanwhile traces the next step.
"""

from __future__ import annotations

from ir_runtime import _distributed

# The rule's state and its wait, in C (``_launch``, which every launch goes through): the first
# result of the collective program still running on CPU, and of the last program launched.
from ir_runtime._launch import IN_FLIGHT as _IN_FLIGHT
from ir_runtime._launch import LAST as _LAST
from ir_runtime._launch import settle


def references(a) -> int:
    """How many references this module keeps to the array ``a`` (0, 1 or 2)."""
    return (a is _IN_FLIGHT[0]) + (a is _LAST[0])


def wait_device_ops() -> None:
    """Wait until the programs launched so far have finished (torch_xla's
    ``xm.wait_device_ops``): programs run in launch order, so waiting for the last is enough.
    ``mark_step`` returns once its program is launched; time a loop with this at its end."""
    settle()
    a = _LAST[0]
    _LAST[0] = None
    if a is not None and not a.is_deleted():
        try:
            a.block_until_ready()
        except Exception as e:
            raise _distributed.device_failure(e, "a program launched earlier") from e
