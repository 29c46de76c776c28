"""Where methods from outside `bench/` come from: installed entry points and `--plugin` files.

A protocol names registry entries, never code, so loading a protocol can
never import anything the user did not choose. Code from outside arrives in
two explicit ways only:

* an installed package declares entries in its own ``pyproject.toml``
  (``[project.entry-points."dmlbench.losses"]``, ``dmlbench.miners``,
  ``dmlbench.trunks``): installing it is the opt-in, and an entry point is
  imported on the first lookup of its name (`registry.get`), not before;
* a module or ``.py`` file named on the command line, ``dmlbench --plugin
  mymodule ...``, imported before the command runs.

Both run `bench.registry.register` decorators, or an entry point names the
class itself (`bench.registry.get` takes it under the entry point's name,
its tuple kind from its ``tuples`` class attribute); while they import, the
origin (package and version, or file) is held here so that the entries
they register carry it, and with it the sha256 of their module's file, which
every run records and a protocol using them folds into its hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.errors import BenchError

GROUPS = {"loss": "dmlbench.losses", "miner": "dmlbench.miners", "trunk": "dmlbench.trunks"}


@dataclass(frozen=True)
class Origin:
    """Where registered code came from: ``source`` as `dmlbench list` shows it, and its version."""

    source: str  # "entry point <dist>", "--plugin <file>", "register() in <module>"
    version: str = ""


_loading: list[Origin] = []  # the origin of the plugin being imported now (innermost last)


@contextlib.contextmanager
def _origin(origin: Origin) -> Iterator[None]:
    _loading.append(origin)
    try:
        yield
    finally:
        _loading.pop()


def current_origin(module: str) -> Origin:
    """The origin of code registering now: the plugin being loaded, else the registering module itself."""
    return _loading[-1] if _loading else Origin(f"register() in {module}")


def file_sha256(obj: Any) -> str:
    """sha256 of the file that defines ``obj``'s module ("" when it has none, e.g. built in a REPL)."""
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def entry_points(kind: str) -> dict[str, metadata.EntryPoint]:
    """The installed entry points of one kind, by name (read afresh: a package installed meanwhile counts)."""
    return {ep.name: ep for ep in metadata.entry_points(group=GROUPS[kind])}


def entry_point_package(ep: metadata.EntryPoint) -> tuple[str, str]:
    """The name and version of the package that declares ``ep``."""
    return _dist(ep)


def _dist(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?", ""
    return str(dist.metadata["Name"] or dist.name), str(dist.version or "")


def load_entry_point(kind: str, ep: metadata.EntryPoint) -> Any:
    """Import one entry point; a failure is one line naming the plugin and its package."""
    name, version = _dist(ep)
    with _origin(Origin(f"entry point {name}", version)):
        try:
            return ep.load()
        except Exception as e:  # noqa: BLE001 - any import failure of foreign code is the plugin's, one line
            raise BenchError(
                f"plugin {ep.value!r} ({GROUPS[kind]} entry point {ep.name!r} of package {name}) "
                f"failed to import: {type(e).__name__}: {e}"
            ) from None


def load_plugin(spec: str) -> None:
    """Import a ``--plugin``: a ``.py`` file path, or a module name importable from the current directory.

    The module runs its `register` decorators; importing it twice (a second
    ``--plugin`` of the same file) does nothing more.
    """
    path = Path(spec)
    is_file = spec.endswith(".py") or "/" in spec or "\\" in spec
    origin = Origin(f"--plugin {path.resolve() if is_file else spec}")
    with _origin(origin):
        try:
            if is_file:
                _import_file(path)
            else:
                if "" not in sys.path and str(Path.cwd()) not in sys.path:
                    sys.path.insert(0, str(Path.cwd()))
                importlib.import_module(spec)
        except BenchError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of foreign code is one line naming it
            raise BenchError(f"plugin {spec!r} failed to import: {type(e).__name__}: {e}") from None


def _import_file(path: Path) -> None:
    if not path.is_file():
        raise BenchError(f"plugin {str(path)!r}: no such file")
    module_name = f"dmlbench_plugin_{path.stem}"
    existing = sys.modules.get(module_name)
    if existing is not None and Path(getattr(existing, "__file__", "")).resolve() == path.resolve():
        return
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BenchError(f"plugin {str(path)!r}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so that `registry.Entry.resolve` and pickle find it by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
