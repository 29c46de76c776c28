"""The house rules of bench/, checked on its import graph (module-level, function-level and TYPE_CHECKING
imports alike).

* no import cycle between modules;
* no import from a lower layer to a higher one (`LAYERS`, lowest first);
* no import of another package's private (``_name``) module;
* every package states its public names in ``__all__``;
* the top of ``bench/`` stays small, and no module is over ``MAX_MODULE_LINES``.

docs/ARCHITECTURE.md draws the same layers; a new module must be placed in
`LAYERS` (the test fails on a module it does not know).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"

# Lowest first. A module may import its own layer (without a cycle) and the layers below it.
LAYERS: list[list[str]] = [
    [
        "bench",
        "bench.errors",
        "bench.devices",
        "bench.atomic",
        "bench.clock",
        "bench.vision",
        "bench.tuples",
        "bench.stats",
        "bench.spec",
    ],
    ["bench.distances", "bench.reducers", "bench.metrics", "bench.data"],
    ["bench.losses", "bench.miners", "bench.models"],
    ["bench.plugins", "bench.registry"],
    ["bench.trunks", "bench.cell"],
    ["bench.training", "bench.evaluation"],
    ["bench.protocol"],
    ["bench.plan"],
    ["bench.stores"],
    ["bench.sweep", "bench.single_run"],
    ["bench.reports", "bench.crosscheck"],
    ["bench.commands", "bench.cli", "bench.__main__"],
]
MAX_TOP_LEVEL_MODULES = 16  # bench/*.py besides __init__ and __main__
MAX_MODULE_LINES = 600  # a module past this holds several jobs: split it along them


def _modules() -> dict[str, Path]:
    out = {}
    for path in BENCH.rglob("*.py"):
        parts = list(path.relative_to(BENCH.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _target(name: str) -> str:
    """The module an imported dotted name lives in (``bench.x.y`` may be a name inside ``bench.x``)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: Path) -> set[str]:
    """Every bench module ``module`` imports, anywhere in the file: at the top, inside a function, or under
    ``TYPE_CHECKING`` (a type named in a signature is a dependency too)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(_target(a.name) for a in child.names if a.name.startswith("bench"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([base] if base else []))
                if base.startswith("bench"):
                    for a in child.names:
                        full = f"{base}.{a.name}"
                        found.add(_target(full if full in MODULES else base))
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(module)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> int:
    best, index = "", -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    return index


def test_every_module_has_a_layer():
    assert [m for m in MODULES if _layer(m) < 0] == []


def test_no_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            connect(v)
    assert cycles == []


def test_no_import_from_a_lower_layer_up():
    upward = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets if _layer(t) > _layer(m))
    assert upward == []


def test_no_import_of_another_packages_private_module():
    def package(module: str) -> str:
        return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]

    reach_ins = sorted(
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if t.rsplit(".", 1)[-1].startswith("_") and t.rsplit(".", 1)[0] != package(m) and not t.endswith("__main__")
    )
    assert reach_ins == []


def test_every_package_declares_its_public_names():
    missing = []
    for module, path in MODULES.items():
        if path.name != "__init__.py" or module == "bench":
            continue
        tree = ast.parse(path.read_text())
        names = {
            t.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)
        }
        if "__all__" not in names:
            missing.append(module)
    assert missing == []


def test_the_top_of_bench_stays_small():
    top = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_module_is_over_the_size_of_one_job():
    sizes = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_graph_sees_function_level_imports():
    """The rules above hold for imports inside functions too: the graph is built from every import node."""
    assert "bench.sweep.floor" in GRAPH["bench.sweep.runner"] or any(
        "bench.sweep" in t for t in GRAPH["bench.commands.run"]
    ), "a lazy import was not seen"
    # bench.commands.run names SweepResult only under TYPE_CHECKING: a type dependency is an edge too
    assert "bench.sweep.result" in GRAPH["bench.commands.run"], "a TYPE_CHECKING import was not seen"
    importers = defaultdict(set)
    for m, targets in GRAPH.items():
        for t in targets:
            importers[t].add(m)
    assert importers["bench.registry"], "nothing imports the registry?"
