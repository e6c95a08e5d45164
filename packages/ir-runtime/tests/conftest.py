import os
import sys

import ir_runtime

sys.path.insert(0, os.path.dirname(__file__))

# Eight virtual CPU devices for every test in this process.
ir_runtime.init(cpu_devices=8)
