"""A new local SQLite MLflow store starts as a copy of an empty one, migrated once per MLflow version.

MLflow builds a new SQLite store by creating its first tables and then running every schema migration since
(dozens of Alembic scripts, loaded and applied one by one): 3-10 s on a two-core machine, paid by every new
store: each first ``dmlbench train`` or ``run`` with new stores, and the test suite, which makes hundreds.
A copy of a store that MLflow itself built, kept in the cache, is the same schema in milliseconds. MLflow
checks a store's schema revision whenever it opens one (a copy at another revision is refused there, not
used), and adds its default experiment on opening, with the artifact root of whoever opens it: the template
is made before that step, so it holds no experiment.

The template's name carries the versions of MLflow, SQLAlchemy and Alembic, so an upgrade makes a new one;
a template that is damaged or lacks a schema revision is made again. Where the cache cannot be written, or
MLflow's table builder is not where this module looks for it, a new store is built the usual way.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from bench.atomic import atomic_file, locked

__all__ = ["seed_new_store", "template_path"]


def template_path() -> Path:
    """The cached empty store for the MLflow, SQLAlchemy and Alembic installed here."""
    import alembic
    import mlflow
    import sqlalchemy

    from bench.data.cache import cache_dir  # the data package: torch, which a store of records does not need

    versions = f"{mlflow.__version__}-{sqlalchemy.__version__}-{alembic.__version__}"
    return cache_dir() / "mlflow" / f"empty-store-{versions}.db"


def _sound(path: Path) -> bool:
    """A whole SQLite file with a schema revision stamped."""
    if not path.is_file():
        return False
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            if db.execute("PRAGMA quick_check").fetchone() != ("ok",):
                return False
            return db.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
        finally:
            db.close()
    except sqlite3.Error:
        return False


def _build(path: Path) -> None:
    """An empty store as MLflow makes one (its own table builder, on its own engine), written to a temp file
    beside ``path`` and renamed onto it: a template is whole or absent."""
    from mlflow.store.db import utils

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.unlink(tmp)  # SQLite makes the file; an empty one it would take for a database already
    try:
        engine = utils.create_sqlalchemy_engine(f"sqlite:///{tmp}")
        try:
            utils._initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def seed_new_store(path: Path) -> None:
    """Copy the template to ``path`` where no store is yet (making the template first if needed); leave an
    existing file alone, and a path whose folder is missing (MLflow's to refuse, as without a template). The
    caller holds the store's creation lock, so no other worker here is making it."""
    if path.exists() or not path.parent.is_dir():
        return
    try:
        from mlflow.store.db import utils

        if not hasattr(utils, "_initialize_tables"):
            return  # another MLflow than this was written against: it builds its own stores
        template = template_path()
        template.parent.mkdir(parents=True, exist_ok=True)
        with locked(template.with_name(template.name + ".lock")):
            if not _sound(template):
                _build(template)
        with open(template, "rb") as src, atomic_file(path, "wb") as out:
            shutil.copyfileobj(src, out)
    except Exception:  # the template only saves time: whatever stops it, MLflow builds the store as it would
        return
