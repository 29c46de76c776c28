"""Imports inside functions only where they keep the command line fast (docs/ARCHITECTURE.md, "Lazy imports").

`bench.cli` imports a command's module only when that command runs, and a module defers an import only to keep
a slow library out of its own import: `dmlbench --help`, `dmlbench list` and each command's option parsing
load none of torch, PML, torchvision, MLflow, Optuna, pandas, scipy or scikit-learn. Everything else belongs
at the top of its module. Checked here:

* the command line: `import bench.cli`, `dmlbench --help`, and each cheap command's ``--help`` in a fresh
  interpreter, by what is in ``sys.modules`` afterwards;
* every function-level import defers something: not the standard library nor a cheap package (click, PyYAML),
  not what the module's own top-level imports load anyway (directly or through other bench modules), and a
  bench module only when its import loads a slow library the importing module does not, or when it imports
  the importing module back (a cycle).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
SLOW = ("torch", "torchvision", "pytorch_metric_learning", "mlflow", "optuna", "pandas", "scipy", "sklearn")
CHEAP = {"click", "yaml"}  # third-party packages that import in milliseconds
SLOW_STDLIB = {"importlib.metadata"}  # tens of milliseconds: `bench.cli` loads it only for --plugin
# Commands whose module loads torch or pandas to parse its options (their defaults come from those layers).
HEAVY_COMMANDS = {"train", "regress"}


def _loaded_after(code: str, modules: tuple[str, ...] = ()) -> list[str]:
    """The slow libraries (and which of ``modules``) a fresh interpreter has loaded after running ``code``."""
    probe = (
        f"{code}\nimport sys\n"
        f"print(sorted(({{m.split('.')[0] for m in sys.modules}} & set({SLOW!r})) | (set(sys.modules) & set({modules!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def _help(args: list[str]) -> str:
    return f"from bench.cli import main\ntry:\n    main({args!r})\nexcept SystemExit:\n    pass\n"


def test_importing_the_cli_loads_no_slow_library():
    assert _loaded_after("import bench.cli", tuple(SLOW_STDLIB)) == []


def test_help_loads_no_slow_library():
    assert _loaded_after(_help(["--help"]), tuple(SLOW_STDLIB)) == []


def test_each_cheap_commands_option_parsing_loads_no_slow_library():
    """`dmlbench CMD --help` imports CMD's module and builds its options: that stays free of slow libraries."""
    from bench.cli import COMMANDS

    commands = [c for c in COMMANDS if c not in HEAVY_COMMANDS]
    code = "\n".join(_help([c, "--help"]) for c in commands)
    assert len(commands) >= 10
    assert _loaded_after(code) == []


def test_the_probe_sees_a_slow_library():
    """The probe above is live: importing a module that needs torch shows torch."""
    assert "torch" in _loaded_after("import bench.training")


# --- the function-level imports -------------------------------------------------------------------------


def _modules() -> dict[str, Path]:
    out = {}
    for path in BENCH.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}


def _module_of(name: str) -> str:
    """The bench module a dotted name lives in (``bench.x.y`` may be a name inside ``bench.x``)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _packages(module: str) -> list[str]:
    """The packages Python imports before ``module``: ``bench``, ``bench.x`` for ``bench.x.y``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _loads(node: ast.Import | ast.ImportFrom) -> tuple[set[str], set[str]]:
    """(bench modules, other top-level packages) one import statement loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        assert node.level == 0 and node.module, "bench/ uses absolute imports"
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    bench, other = set(), set()
    for name in names:
        if name.split(".")[0] == "bench":
            module = _module_of(name)
            bench.update([module, *_packages(module)])
        else:
            other.add(name if name in SLOW_STDLIB else name.split(".")[0])
    return bench, other


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _top_level(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported (inside top-level ``try``/``if``, not ``TYPE_CHECKING``)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.If) and not _is_type_checking(node):
                visit(node.body)
                visit(node.orelse)

    visit(tree.body)
    return found


def _edges() -> dict[str, tuple[set[str], set[str]]]:
    out = {}
    for name, tree in TREES.items():
        bench, other = set(_packages(name)), set()
        for node in _top_level(tree):
            b, o = _loads(node)
            bench |= b
            other |= o
        bench.discard(name)
        out[name] = (bench, other - set(sys.stdlib_module_names))
    return out


EDGES = _edges()


def _closure(start: set[str]) -> tuple[set[str], set[str]]:
    """(bench modules, other packages) importing ``start`` loads, following top-level imports."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module not in seen and module in EDGES:
            seen.add(module)
            todo.extend(EDGES[module][0])
    return seen, {p for m in seen for p in EDGES[m][1]}


def _function_level(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Each import inside a function, with whether it sits in a ``try`` there (an optional dependency)."""
    found = []

    def visit(node: ast.AST, in_function: bool, in_try: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, in_try))
            function = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, function, in_try or (in_function and isinstance(child, ast.Try)))

    visit(tree, False, False)
    return found


def _needless(module: str) -> list[str]:
    """The function-level imports of ``module`` that defer nothing, each as ``path:line statement (why)``."""
    top_bench, top_other = _closure({module})
    found = []
    for node, in_try in _function_level(TREES[module]):
        bench, other = _loads(node)
        why = None
        stdlib = {p for p in other if p in sys.stdlib_module_names}
        if stdlib:
            why = "standard library"
        elif other & CHEAP:
            why = "cheap package"
        elif other and other <= top_other and not in_try:
            why = "the module's imports load it anyway"
        elif bench:
            target = {b for b in bench if b not in _packages(module)}
            loads_bench, loads_other = _closure(target)
            if target <= top_bench:
                why = "the module's imports load it anyway"
            elif module not in loads_bench and not (loads_other - CHEAP - top_other):
                why = "loads no slow library the module lacks, and no cycle"
        if why:
            found.append(f"{MODULES[module].relative_to(REPO)}:{node.lineno} {ast.unparse(node)} ({why})")
    return found


def _checked() -> list[str]:
    return sorted(MODULES)


def test_the_scan_sees_deferred_imports():
    """The scan is live: the CLI defers MLflow and Optuna, and the PML-backed losses defer PML."""
    cli = {ast.unparse(node) for node, _ in _function_level(TREES["bench.cli"])}
    assert "import optuna" in cli
    pml = [
        n for n, _ in _function_level(TREES["bench.losses.pml_backed"]) if "pytorch_metric_learning" in ast.unparse(n)
    ]
    assert len(pml) > 5
    assert len(_checked()) > 100


def test_the_check_catches_a_needless_import():
    """A standard-library import, and a slow one the module already loads at its top, are both reported."""
    tree = ast.parse("import torch\n\ndef f():\n    import json\n    import torch\n")
    TREES["bench.fake_probe"], MODULES["bench.fake_probe"] = tree, BENCH / "fake_probe.py"
    EDGES["bench.fake_probe"] = ({"bench"}, {"torch"})
    try:
        found = _needless("bench.fake_probe")
    finally:
        del TREES["bench.fake_probe"], MODULES["bench.fake_probe"], EDGES["bench.fake_probe"]
    assert [line.split(" (")[1] for line in found] == ["standard library)", "the module's imports load it anyway)"]


def test_every_function_level_import_defers_something():
    """Each import inside a function keeps a slow library (or a cycle) out of its module's import."""
    assert [line for module in _checked() for line in _needless(module)] == []
