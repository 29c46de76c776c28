"""MLflow at the edge: where runs are recorded and what every run carries.

The tracking store is a local SQLite file unless told otherwise, so a run
needs no server and the records sit next to the results:

1. an explicit URI or path (the ``--tracking-uri`` option);
2. ``$MLFLOW_TRACKING_URI`` (MLflow's own variable);
3. ``sqlite:///<cwd>/runs/mlflow.db``.

A plain path is accepted wherever a URI is: a directory gets ``mlflow.db``
inside it, a file path is used as the SQLite file. Anything with a scheme
(``sqlite://``, ``postgresql://``, ``http://``) is passed to MLflow as is.

Every run is tagged with what is needed to rerun it: package versions (and
each loaded plugin's version and source hash), the git commit of the code and the fingerprint of the class split it trained on.
MLflow is imported lazily (it costs seconds) and kept quiet: its INFO logs
about creating tables and experiments are noise on a command line.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.errors import BenchError
from bench.stores.urls import CONNECT_TIMEOUT_S, default_url, redact, sqlite_url, with_connect_timeout

DEFAULT_FILE = "mlflow.db"
PACKAGES = {"torch": "torch", "pml": "pytorch-metric-learning", "optuna": "optuna", "mlflow": "mlflow",
            "dmlbench": "dmlbench"}
TRACKING_SCHEMES = frozenset({"sqlite", "postgresql", "postgres", "mysql", "mssql", "http", "https", "file",
                              "databricks", "databricks-uc", "uc"})
_MAX_PARAM_CHARS = 6000  # MLflow 3 refuses longer parameter values


def default_tracking_uri(root: str | Path | None = None, *, create: bool = True) -> str:
    """``sqlite:///<root>/mlflow.db`` with ``root`` defaulting to ``./runs`` (created if missing unless not
    ``create``)."""
    return default_url(DEFAULT_FILE, root, create=create)


def resolve_tracking_uri(uri: str | Path | None = None, *, create: bool = True) -> str:
    """The URI to record to, following the order in the module docstring; ``create=False`` makes no folder
    (a pre-flight check writes nothing)."""
    if uri is None or str(uri) == "":
        uri = os.environ.get("MLFLOW_TRACKING_URI") or None
        if uri is None:
            return default_tracking_uri(create=create)
    text = str(uri)
    if not text.strip():
        raise BenchError("tracking URI is blank: give a URI or a path, or leave the option out for ./runs/mlflow.db")
    if "://" in text:
        scheme = text.split("://", 1)[0].split("+", 1)[0].lower()
        if scheme not in TRACKING_SCHEMES:
            raise BenchError(f"tracking URI {text!r}: unknown scheme {scheme!r}: expected one of "
                             f"{', '.join(sorted(TRACKING_SCHEMES))}, or a path")
        return with_connect_timeout(text)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", text):  # 'sqlite:/x', 'http:host': a scheme missing its '//'
        raise BenchError(f"tracking URI {text!r} looks like a URI without '://' (read as a folder it would "
                         "create one named after the scheme): write scheme://..., or a path")
    path = Path(text).expanduser().resolve()
    if path.is_dir() or not path.suffix:
        return default_tracking_uri(path, create=create)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    return sqlite_url(path)


_REACHED: set[str] = set()


def check_reachable(uri: str) -> None:
    """Refuse an unreachable database server in seconds, once per URI and process.

    MLflow retries a database it cannot open 10 times with exponential
    back-off (about 100 s, a constant it does not let us set): one
    SQLAlchemy connection with ``connect_timeout`` first turns a closed
    PostgreSQL port into one line instead of minutes of waiting.
    """
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if uri in _REACHED:
        return
    if scheme in ("http", "https"):
        _check_http(uri)
        _REACHED.add(uri)
        return
    if scheme not in ("postgresql", "postgres", "mysql"):
        return
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(with_connect_timeout(uri))
        with engine.connect():
            pass
        engine.dispose()
    except Exception as e:  # any failure to connect is the user's URI, server or driver
        raise BenchError(f"cannot reach database {redact(uri)!r}: {str(e).strip().splitlines()[0]}") from None
    _REACHED.add(uri)


def _check_http(uri: str) -> None:
    """Any HTTP answer (even 401 or 404) means a server listens; no answer in seconds is one line."""
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=CONNECT_TIMEOUT_S)
    except requests.RequestException as e:
        raise BenchError(f"cannot reach MLflow tracking server {uri!r}: {type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0][:200]}") from None


def _mlflow() -> Any:
    """MLflow, imported on first use: listing or planning must not pay for it. Its logging is the
    embedding program's to set (the CLI quiets it at its edge, `bench.cli.quiet_libraries`)."""
    import mlflow

    return mlflow


@contextmanager
def start_run(experiment: str, run_name: str | None = None, tags: Mapping[str, Any] | None = None,
              nested: bool = False, tracking_uri: str | Path | None = None) -> Iterator[str]:
    """Open an MLflow run and yield its id; a run left by an exception is marked FAILED.

    ``nested=True`` opens a child of the run currently open (tuning trials
    under their cell); the tracking URI and experiment then come from the
    parent unless given.
    """
    mlflow = _mlflow()
    if not nested or tracking_uri is not None:
        uri = resolve_tracking_uri(tracking_uri)
        check_reachable(uri)
        mlflow.set_tracking_uri(uri)
    try:
        mlflow.set_experiment(experiment)
    except Exception as e:  # a store that cannot be opened is the user's path or URI
        raise BenchError(f"cannot open MLflow tracking store {mlflow.get_tracking_uri()!r}: "
                         f"{str(e).splitlines()[0]}") from e
    str_tags = {k: str(v) for k, v in (tags or {}).items()}
    with mlflow.start_run(run_name=run_name, nested=nested, tags=str_tags) as run:
        yield run.info.run_id


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts as dotted keys (``loss_params.margin``); values as MLflow stores them, strings."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            text = "{}" if isinstance(value, Mapping) else str(value)
            flat[name] = text[:_MAX_PARAM_CHARS]
    return flat


def search_all(client: Any, experiment_id: str, filter_string: str = "") -> list[Any]:
    """Every active run of an experiment that matches the filter, all pages read before returning
    (a caller that deletes runs while paging would shift the pages under itself)."""
    out, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def log_params(params: Mapping[str, Any]) -> None:
    """Log (possibly nested) parameters of the active run in one batch."""
    _mlflow().log_params(flatten(params))


def log_metrics(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Log numeric metrics of the active run; non-numeric values are skipped, NaN is kept."""
    numeric = {k: float(v) for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    numeric = {k: (v if not math.isinf(v) else math.copysign(1e308, v)) for k, v in numeric.items()}
    _mlflow().log_metrics(numeric, step=step)


def package_versions() -> dict[str, str]:
    """Versions of the packages a result depends on, by short name (``torch``, ``pml``, ...).

    Plugin entries loaded in this process (registered, from an entry point
    or a ``--plugin`` file) follow as ``plugin.<kind>.<name>``: their version,
    the sha256 of their source file and where they came from, so a result
    from a plugin says which code made it.
    """
    versions = {}
    for short, dist in PACKAGES.items():
        try:
            versions[short] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[short] = "absent"
    return {**versions, **plugin_versions()}


def plugin_versions() -> dict[str, str]:
    """``plugin.<kind>.<name>`` -> ``<version> sha256:<hash> (<source>)`` for every plugin entry loaded."""
    from bench import registry

    

    return {f"plugin.{e.kind}.{e.name}": f"{e.version or '-'} sha256:{e.source_hash or '-'} ({e.source})"
            for e in registry.loaded_plugins()}


def _git(args: list[str], path: str | Path | None) -> str | None:
    cwd = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit(path: str | Path | None = None) -> str:
    """The commit the code runs from (``git rev-parse HEAD``), or ``unknown`` outside a repository."""
    return _git(["rev-parse", "HEAD"], path) or "unknown"


def git_dirty(path: str | Path | None = None) -> bool | None:
    """Whether tracked files differ from that commit (None outside a repository): a result from
    uncommitted code cannot be rerun from the commit alone."""
    status = _git(["status", "--porcelain", "--untracked-files=no"], path)
    return None if status is None else bool(status)


def standard_tags(split_fingerprint: str | None = None, **extra: Any) -> dict[str, str]:
    """The tags every dmlbench run carries: versions, git commit, split fingerprint, plus ``extra``."""
    tags = {f"dmlbench.version.{k}": v for k, v in package_versions().items()}
    tags["dmlbench.git_commit"] = git_commit()
    tags["dmlbench.git_dirty"] = str(git_dirty()).lower()
    if split_fingerprint is not None:
        tags["dmlbench.split_fingerprint"] = split_fingerprint
    tags.update({f"dmlbench.{k}": str(v) for k, v in extra.items()})
    return tags
