"""The import graph of dflash_core and app, read from the source (nothing is imported): no cycle,
no engine module importing the app, training, the benchmarks or the diagnostics, and an app that
imports only the engine (its Space ships without training/ and bench/, see app/hosting/space.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dflash_core", "app")
# Above the engine: they may import it, it never imports them.
TOOLS = ("dflash_core.training", "dflash_core.bench", "dflash_core.diagnostics")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of the packages that `name` imports anywhere in its source (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    deps = set()
    tree = ast.parse(path.read_text())
    # Imports under `if TYPE_CHECKING:` never run: annotations may name a module that imports this one.
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        elif isinstance(node, ast.ImportFrom):
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


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_reads_relative_imports():
    g = graph()
    assert {"dflash_core.events", "dflash_core.explain"} <= g["dflash_core.decoding"]
    assert "dflash_core.bench.run" in g["dflash_core.bench.cycle"]
    assert "app.view.tips" in g["app.view.cycle_view"]


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_the_engine_imports_neither_the_app_nor_what_stands_above_it():
    wrong = sorted((a, b) for a, deps in graph().items() if within(a, ("dflash_core",)) for b in deps
                   if within(b, ("app",)) or (within(b, TOOLS) and not within(a, TOOLS)))
    assert wrong == []


def test_the_app_imports_only_the_engine():
    wrong = sorted((a, b) for a, deps in graph().items() if within(a, ("app",)) for b in deps if within(b, TOOLS))
    assert wrong == []


# The engine as the app sees it: the public API, the events and the trace it renders and records,
# the lossless verdict, the errors' words, loading a pair, the doctor, and vLLM as a peer.
APP_ENGINE_SURFACE = ("dflash_core", "dflash_core.events", "dflash_core.trace", "dflash_core.lossless",
                      "dflash_core.errors", "dflash_core.loading", "dflash_core.doctor", "dflash_core.vllm")


def engine_modules_imported_by(source: str, package: str) -> set[str]:
    """The dflash_core modules (packages included) that `source` names in its imports, lazy ones too."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if within(name, ("dflash_core",))}


def test_the_app_reaches_the_engine_through_its_surface():
    sources = {name: path.read_text() for name, path in modules().items() if within(name, ("app",))}
    sources["app.py"] = (ROOT / "app.py").read_text()
    used = {name: engine_modules_imported_by(text, name) for name, text in sources.items()}
    outside = sorted((name, mod) for name, mods in used.items() for mod in mods if mod not in APP_ENGINE_SURFACE)
    assert outside == []
    assert len(APP_ENGINE_SURFACE) <= 8 and set().union(*used.values()) == set(APP_ENGINE_SURFACE)


# The engine in layers, each importing only the ones before it: the base (errors, sampling, events);
# speed and numerics, kernels included; the models and their formats; loading a pair and its prompts;
# the decoding loop and the trace; then what stands on the engine (its CLI, vLLM, the tools).
ENGINE_BASE = ("dflash_core.errors", "dflash_core.sampling", "dflash_core.events")
ENGINE_LAYERS = (ENGINE_BASE, ("dflash_core.speed",), ("dflash_core.models",), ("dflash_core.loading",))
ENGINE_ABOVE_THE_LOOP = ("dflash_core.__main__", "dflash_core.vllm", "dflash_core.doctor", *TOOLS)


def engine_layer(name: str) -> int | None:
    if not within(name, ("dflash_core",)) or name == "dflash_core":
        return None
    for rank, layer in enumerate(ENGINE_LAYERS):
        if within(name, layer):
            return rank
    return len(ENGINE_LAYERS) + within(name, ENGINE_ABOVE_THE_LOOP)  # the loop, or above it


def test_the_engine_folders_import_only_the_layers_below_them():
    g = graph()
    ranks = {name: engine_layer(name) for name in g if engine_layer(name) is not None}
    assert set(ranks.values()) == set(range(len(ENGINE_LAYERS) + 2))  # every layer has modules
    wrong = sorted((a, b) for a, deps in g.items() if a in ranks for b in deps
                   if b in ranks and ranks[b] > ranks[a])
    assert wrong == []


def test_the_engine_keeps_its_loop_at_the_top_level():
    top = sorted(name for name, path in modules().items()
                 if within(name, ("dflash_core",)) and path.parent.name == "dflash_core" and path.name != "__init__.py")
    assert top == ["dflash_core.__main__", "dflash_core.decoding", "dflash_core.drafting", "dflash_core.errors",
                   "dflash_core.events", "dflash_core.explain", "dflash_core.lossless", "dflash_core.ngram",
                   "dflash_core.precompile", "dflash_core.prompt_lookup",
                   "dflash_core.sampling", "dflash_core.schedule", "dflash_core.trace", "dflash_core.tree",
                   "dflash_core.verify"]


# The app's sub-packages in layers: each imports only the ones before it (app/__init__.py).
APP_LAYERS = ("app.race", "app.view", "app.guard", "app.pairs", "app.hosting", "app.serve")


def test_the_app_packages_import_only_the_layers_below_them():
    rank = {layer: i for i, layer in enumerate(APP_LAYERS)}

    def layer(name):
        return next((lay for lay in APP_LAYERS if within(name, (lay,))), None)

    modules_of = {lay: [m for m in graph() if layer(m) == lay] for lay in APP_LAYERS}
    assert all(modules_of.values()), modules_of  # every layer exists, so the check below has something to check
    wrong = sorted((a, b) for a, deps in graph().items() if layer(a) for b in deps
                   if within(b, ("app",)) and (layer(b) is None or rank[layer(b)] > rank[layer(a)]))
    assert wrong == []


def test_the_race_layer_holds_no_page_code():
    imported = {name: {alias.name.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                       for alias in getattr(node, "names", []) if isinstance(node, ast.Import)}
                | {node.module.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.ImportFrom) and node.module and not node.level}
                for name, path in modules().items() if within(name, ("app.race",))}
    assert imported and not [name for name, mods in imported.items() if mods & {"gradio", "plotly"}]
