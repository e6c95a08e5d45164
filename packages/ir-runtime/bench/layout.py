"""The package's layout, in figures: module count and sizes, names a module reaches in another
module behind an underscore, and imports inside functions.

    python packages/ir-runtime/bench/layout.py [SRC]   (SRC: the ir_runtime folder to read;
                                                        by default this checkout's)

A cross-module private name is ``mod._name`` or ``from mod import _name`` where ``mod`` is
another module of the package (counted once per using module, target and name); the inside of
a private module is free to use its own. Reads the source only; imports nothing of it.
"""

import argparse
import ast
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "src" / "ir_runtime"


def module_names(root: Path) -> dict:
    """Dotted module name -> its source file (.py and .pyx)."""
    out = {}
    for p in sorted(root.rglob("*.py")) + sorted(root.rglob("*.pyx")):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(name: str, tree: ast.AST, modules: dict) -> set:
    """(using module, target module, name) for each private name ``name`` reaches elsewhere."""
    package = name.split(".")[0]
    aliases, uses = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in modules:
                    aliases[a.asname or a.name] = full
                elif private(a.name) and node.module != name:
                    uses.add((name, node.module, a.name))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(package) and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = aliases.get(node.value.id)
            if target and target != name and private(node.attr):
                uses.add((name, target, node.attr))
    return uses


def local_imports(tree: ast.AST) -> list:
    return [
        node
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", nargs="?", default=str(HERE))
    root = Path(parser.parse_args().src)
    modules = module_names(root)
    sizes, uses, local = {}, set(), 0
    for name, path in modules.items():
        text = path.read_text()
        sizes[name] = text.count("\n")
        if path.suffix == ".py":
            tree = ast.parse(text)
            uses |= private_uses(name, tree, modules)
            local += len(local_imports(tree))
    front = {k: v for k, v in sizes.items() if "._frontend" in k}
    print(f"modules: {len(sizes)}, {sum(sizes.values())} lines")
    print(f"  the front end (_frontend): {len(front)} modules, {sum(front.values())} lines")
    over = sorted(((v, k) for k, v in sizes.items() if v > 400), reverse=True)
    print("  over 400 lines: " + ", ".join(f"{k} {v}" for v, k in over))
    print(f"cross-module private names: {len(uses)}")
    for target, count in Counter(t for _, t, _ in uses).most_common(5):
        print(f"  names of {target}: {count}")
    print(f"function-local imports: {local}")


if __name__ == "__main__":
    main()
