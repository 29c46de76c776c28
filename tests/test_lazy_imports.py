"""Imports inside functions are kept only where they keep the command line fast (docs/ARCHITECTURE.md).

A deferred import is worth its cost to the reader only when it keeps a heavy library (torch, PML, MLflow,
Optuna, pandas, scipy, scikit-learn, ...) out of a module that does not otherwise load it, or breaks a
cycle through a package's ``__init__``. So: no function-level import of the standard library, none of
what the module already imports at its top, and `dmlbench --help` loads none of the heavy libraries.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
HEAVY = ("torch", "torchvision", "pytorch_metric_learning", "mlflow", "optuna", "pandas", "scipy", "sklearn", "numpy")


def _function_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, top-level name) of every absolute import inside a function, each statement once."""
    found: dict[tuple[int, str], None] = {}
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        found[(node.lineno, alias.name)] = None
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    # `from bench import data` imports the module bench.data, not only the package
                    subs = [
                        f"{node.module}.{a.name}" for a in node.names if _is_bench_module(f"{node.module}.{a.name}")
                    ]
                    for name in subs or [node.module]:
                        found[(node.lineno, name)] = None
    return list(found)


def _is_bench_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return name.startswith("bench.") and (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file())


def _module_level_imports(tree: ast.Module) -> set[str]:
    """Dotted names imported at module level, outside ``if TYPE_CHECKING:`` blocks."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names if _is_bench_module(f"{node.module}.{a.name}"))
    return names


def _deferred() -> dict[str, list[tuple[int, str]]]:
    return {
        str(path.relative_to(REPO)): _function_imports(ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(BENCH.rglob("*.py"))
    }


def test_the_counter_sees_deferred_imports():
    """The scan is live: the CLI defers its commands' heavy imports, so some function-level imports exist."""
    deferred = _deferred()
    assert sum(len(v) for v in deferred.values()) > 20
    assert any(name == "torch" or name.startswith("torch.") for v in deferred.values() for _, name in v)


def test_no_function_level_import_of_the_standard_library():
    stdlib = [
        f"{path}:{line} {name}"
        for path, found in _deferred().items()
        for line, name in found
        if name.split(".")[0] in sys.stdlib_module_names
    ]
    assert stdlib == []


def test_no_function_level_import_of_what_the_module_already_imports():
    """Importing inside a function what the module's top imports anyway defers nothing."""
    redundant = []
    for path in sorted(BENCH.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = _module_level_imports(tree)
        top_roots = {name.split(".")[0] for name in top if not name.startswith("bench")}
        for line, name in _function_imports(tree):
            root = name.split(".")[0]
            if name in top or (root != "bench" and root in top_roots):
                redundant.append(f"{path.relative_to(REPO)}:{line} {name}")
    assert redundant == []


def test_help_loads_no_heavy_library():
    """`dmlbench --help` stays fast: none of torch, PML, MLflow, Optuna, pandas, scipy, sklearn, numpy."""
    code = (
        "import sys\n"
        "from bench.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
