"""The engine's import graph: which module of dflash_core imports which, its cycles, and any engine
module importing from training/ (both must be empty). Reads the source; imports nothing from it.

    python scripts/import_graph.py
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dflash_core"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of the package that `name` imports anywhere in its source (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - max(0, node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                deps.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            deps.update(alias.name for alias in node.names)
    return {d for d in deps if d in known and d != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, found = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def main() -> None:
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    for name in sorted(graph):
        print(name, "->", ", ".join(sorted(d.removeprefix("dflash_core.") for d in graph[name])))
    training = [(a, b) for a, deps in graph.items() if not a.startswith("dflash_core.training")
                for b in deps if b.startswith("dflash_core.training")]
    print("CYCLES:", cycles(graph))
    print("engine->training:", training)


if __name__ == "__main__":
    main()
