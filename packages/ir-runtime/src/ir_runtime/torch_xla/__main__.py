"""``python -m ir_runtime.torch_xla [--shadow] SCRIPT [ARGS] | -m MODULE [ARGS]``: run an
unchanged torch_xla script or tool (``-m pytest test/spmd``) with ``torch_xla`` served by this
engine (``ir_runtime.torch_xla.install()`` first, then the script as ``python`` would run it:
``sys.argv`` is the script's, ``__name__`` is ``"__main__"``, its directory leads ``sys.path``).
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m ir_runtime.torch_xla [--shadow] SCRIPT [ARGS] | -m MODULE [ARGS]"


def main(argv: list[str]) -> None:
    shadow = False
    if argv[:1] == ["--shadow"]:
        shadow, argv = True, argv[1:]
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    import ir_runtime.torch_xla

    ir_runtime.torch_xla.install(shadow=shadow)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    if not os.path.isfile(script):
        print(f"python -m ir_runtime.torch_xla: can't open file {script!r}", file=sys.stderr)
        raise SystemExit(2)
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
