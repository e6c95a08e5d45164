# Temporary: the old module name, while _frontend/_capture.py is being rewritten.
from ir_runtime._execute import place as _place  # noqa: F401
