"""MLflow at the edge: where runs are recorded and what every run carries.

The tracking store is a local SQLite file unless told otherwise, so a run
needs no server and the records sit next to the results:

1. an explicit URI or path (the ``--tracking-uri`` option);
2. ``$MLFLOW_TRACKING_URI`` (MLflow's own variable);
3. ``sqlite:///<cwd>/runs/mlflow.db``.

A plain path is accepted wherever a URI is: a directory gets ``mlflow.db``
inside it, a file path is used as the SQLite file. Anything with a scheme
(``sqlite://``, ``postgresql://``, ``http://``) is passed to MLflow as is.

Runs are written through `bench.stores.mlflow_runs.MlflowWriter` (one way
for `dmlbench train` and sweeps); what every run is tagged with, to rerun
it, is `bench.stores.provenance`. MLflow is imported lazily (it costs seconds).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from bench.errors import BenchError
from bench.stores.urls import (
    CONNECT_TIMEOUT_S,
    default_url,
    parse,
    redact,
    sqlite_url,
    with_connect_timeout,
)

DEFAULT_FILE = "mlflow.db"
TRACKING_SCHEMES = frozenset(
    {"sqlite", "postgresql", "postgres", "mysql", "mssql", "http", "https", "file", "databricks", "databricks-uc", "uc"}
)


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
    scheme = parse(text).scheme
    if scheme or "://" in text:
        if scheme not in TRACKING_SCHEMES:
            raise BenchError(
                f"tracking URI {redact(text)!r}: unknown scheme {scheme or text.partition('://')[0]!r}: "
                "expected one of "
                f"{', '.join(sorted(TRACKING_SCHEMES))}, or a path"
            )
        return with_connect_timeout(text)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", text):  # 'sqlite:/x', 'http:host': a scheme missing its '//'
        raise BenchError(
            f"tracking URI {text!r} looks like a URI without '://' (read as a folder it would "
            "create one named after the scheme): write scheme://..., or a path"
        )
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
    if uri in _REACHED:
        return
    store = parse(uri)
    if store.is_http:
        _check_http(uri)
        _REACHED.add(uri)
        return
    if store.scheme not in ("postgresql", "postgres", "mysql"):
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
        raise BenchError(
            f"cannot reach MLflow tracking server {redact(uri)!r}: {type(e).__name__}: "
            f"{str(e).strip().splitlines()[0][:200]}"
        ) from None


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
