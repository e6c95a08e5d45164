"""Runs torch_xla 2.9's SPMD suite (``test/``, vendored unchanged under its LICENSE) on this
engine: ``python -m ir_runtime.torch_xla -m pytest integration_tests/torch_xla_suite``."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "test"), os.path.join(HERE, "test", "spmd")]
