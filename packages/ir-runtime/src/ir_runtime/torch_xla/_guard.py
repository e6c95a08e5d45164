"""The XLA device type's C++ guard (``_xla_guard.cpp``), built once per torch version with the
system's C++ compiler (a few seconds, torch's own headers only) and cached, then loaded: torch
needs one for autograd on ``xla`` tensors, and offers no way to register it from Python."""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

SOURCE = pathlib.Path(__file__).with_name("_xla_guard.cpp")
_LOADED: list = []


def _cache_dir() -> pathlib.Path:
    base = os.environ.get("IR_RUNTIME_BUILD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ir_runtime"
    )
    return pathlib.Path(base)


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise RuntimeError(
        "ir_runtime.torch_xla needs a C++ compiler once, to build the xla device's guard for "
        "torch (torch has no Python hook for it): install g++ or clang++, or set CXX"
    )


def library() -> pathlib.Path:
    """The built guard for this torch, built now if not cached."""
    import torch

    root = pathlib.Path(torch.__file__).parent
    key = hashlib.sha256(
        SOURCE.read_bytes() + torch.__version__.encode() + str(root).encode()
    ).hexdigest()[:16]
    out = _cache_dir() / f"xla_guard-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = pathlib.Path(tmp) / out.name
        cmd = [
            _compiler(),
            "-O2",
            "-shared",
            "-fPIC",
            "-std=c++17",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            "-I",
            str(root / "include"),
            str(SOURCE),
            "-L",
            str(root / "lib"),
            "-lc10",
            f"-Wl,-rpath,{root / 'lib'}",
            "-o",
            str(built),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"building the xla device guard failed ({' '.join(cmd)}):\n{done.stderr}"
            )
        os.replace(built, out)  # atomic: another process may build the same at once
    return out


def load() -> None:
    """Register the guard with torch (once per process)."""
    if _LOADED:
        return
    import torch  # noqa: F401  (libc10 first: the library registers into it)

    _LOADED.append(ctypes.CDLL(str(library()), mode=ctypes.RTLD_GLOBAL))


if __name__ == "__main__":
    print(library(), file=sys.stdout)
