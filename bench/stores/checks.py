"""Refusals about where a sweep records, made before any record is written.

A sweep keeps its state in two stores, the Optuna storage (trials, the
truth the tables are rebuilt from) and the MLflow tracking store (a
browsable copy). Three mistakes with them are refused, since each would
otherwise pass silently:

* ``--storage ""``: it would read as "not given", and the sweep would write
  to the default database the user meant to avoid;
* the two pointed at one SQLite file, or each at the other's: Optuna and
  MLflow would create their tables side by side in one database (both have
  a ``trials``-like schema and an ``alembic_version`` table), and the next
  version migration of either would break the other;
* an emptied or replaced Optuna database beside results that say cells were
  done: the sweep would retrain everything and overwrite the tables.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from bench.errors import BenchError
from bench.stores.urls import sqlite_path

OPTUNA_TABLES = frozenset({"studies", "trials", "version_info"})
MLFLOW_TABLES = frozenset({"experiments", "runs", "metrics", "params"})


def check_given(storage: str | None, tracking_uri: str | None) -> None:
    """An option given empty is a mistake (an unset variable in a script), not a request for the default."""
    if storage is not None and not storage.strip():
        raise BenchError(
            "--storage is empty: give a database URL, or leave the option out for sqlite:///./runs/optuna.db"
        )
    if tracking_uri is not None and not str(tracking_uri).strip():
        raise BenchError("--tracking-uri is empty: give a URI or a path, or leave the option out for ./runs/mlflow.db")


def _tables(path: Path) -> set[str]:
    """Table names of an existing SQLite file (only read; nothing is created).

    Opened read-write, not with ``mode=ro``: a worker killed mid-write leaves a hot journal, which only a
    writable connection can roll back; read-only, resuming a killed sweep fails ("attempt to write a
    readonly database"; `scripts/kill_resume.py` checks the resume)."""
    if not path.is_file() or path.stat().st_size == 0:
        return set()
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as db:
            return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise BenchError(f"{path}: not a readable SQLite database ({e})") from None


def check_separate(storage_url: str, tracking_uri: str) -> None:
    """The Optuna storage and the MLflow store are two databases, each holding only its own tables."""
    optuna_db, mlflow_db = sqlite_path(storage_url), sqlite_path(tracking_uri)
    if optuna_db is not None and optuna_db == mlflow_db:
        raise BenchError(f"--storage and --tracking-uri name the same database {optuna_db}: give each its own file")
    if optuna_db is not None and MLFLOW_TABLES <= _tables(optuna_db):
        raise BenchError(
            f"--storage {optuna_db} is an MLflow tracking database, not an Optuna storage: "
            "were --storage and --tracking-uri swapped?"
        )
    if mlflow_db is not None and OPTUNA_TABLES <= _tables(mlflow_db):
        raise BenchError(
            f"--tracking-uri {mlflow_db} is an Optuna storage, not an MLflow tracking database: "
            "were --storage and --tracking-uri swapped?"
        )


def check_not_emptied(
    manifest: dict[str, Any] | None,
    protocol_hash: str,
    shared_hash: str,
    results: Path,
    storage_url: str,
    label: str,
    name: str,
) -> None:
    """Results of this protocol's shared settings (`Protocol.shared_hash`) say cells were done, yet the
    storage knows none of the studies of the cells its manifest lists (``<name>:<cell key>:...``, on any
    data): the storage was emptied, replaced or mistyped, and running on would retrain every cell and then
    overwrite those tables with new numbers. A manifest written before cells had keys (no ``shared_hash``)
    counts when it names this very protocol, and then any study of the protocol's name will do. Checked
    before the storage is opened (opening creates it)."""
    if not manifest:
        return
    keys = manifest.get("cell_keys")
    if manifest.get("shared_hash") == shared_hash:
        prefixes = tuple(f"{name}:{str(k).split('.')[0]}." for k in keys.values()) if isinstance(keys, dict) else ()
    elif "shared_hash" not in manifest and manifest.get("protocol_hash") == protocol_hash:
        prefixes = (f"{name}:",)
    else:
        return
    if not prefixes:
        return
    finals = results / "finals.csv"
    if not finals.is_file() or len(finals.read_text(errors="replace").splitlines()) <= 1:
        return  # no finals or a header only: nothing was done
    db = sqlite_path(storage_url)
    if db is not None and "studies" not in _tables(db):
        known: set[str] = set()
    else:
        import optuna

        try:
            known = set(optuna.get_all_study_names(storage_url))
        except Exception:  # noqa: BLE001 - unreachable storage: opening it says why, with one line
            return
    if not any(study.startswith(prefixes) for study in known):  # on any data: changed data move results aside
        raise BenchError(
            f"{results} holds results of this protocol, but the Optuna storage {label} has none of "
            "its studies: point --storage at the sweep's database (manifest.json names it), or move "
            f"{results} aside to start afresh"
        )
