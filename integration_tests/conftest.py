import os

import ir_runtime
from ir_runtime import _check

# Every graph a test compiles is checked against the IR dialect first (on a cache miss), here
# and in the processes tests start; IR_RUNTIME_CHECK=0 turns it off.
_check.ALWAYS[0] = os.environ.setdefault("IR_RUNTIME_CHECK", "1") != "0"

# Eight virtual CPU devices for every integration test.
ir_runtime.init(cpu_devices=8)
