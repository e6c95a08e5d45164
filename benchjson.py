"""What every benchmark script writes beside its table: its results and the machine, as JSON."""

import json
import os
import platform


def environment(**versions) -> dict:
    """The machine and the versions that matter to a figure."""
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        **versions,
    }


def write(path, results: dict) -> None:
    """Write ``results`` to ``path`` (if given) as indented JSON."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {path}")
