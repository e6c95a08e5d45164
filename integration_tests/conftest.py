import os

import ir_runtime
from ir_runtime import _check
from ir_runtime import torch_xla as _torch_xla

# torch_xla's own suite (vendored under torch_xla_suite/) imports torch_xla: it is collected only
# in a process the torch_xla layer serves (``python -m ir_runtime.torch_xla -m pytest
# integration_tests/torch_xla_suite``, which ``nox -s torch_xla_suite`` runs).
collect_ignore = [] if _torch_xla.installed() else ["torch_xla_suite"]

# Every graph a test compiles is checked against the IR dialect first (on a cache miss), here
# and in the processes tests start; IR_RUNTIME_CHECK=0 turns it off.
_check.ALWAYS[0] = os.environ.setdefault("IR_RUNTIME_CHECK", "1") != "0"

# Eight virtual CPU devices for every integration test.
ir_runtime.init(cpu_devices=8)
