"""The store checks run before a sweep opens its stores; they must read what a killed worker left."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from bench.stores.checks import check_separate


def _killed_mid_write(db: Path) -> None:
    """A database with a hot journal: a process began rewriting it and died (as under kill -9)."""
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE studies (study_id INTEGER, study_name TEXT, pad TEXT)")
        c.executemany("INSERT INTO studies VALUES (?, ?, ?)", [(i, f"s{i}", "x" * 500) for i in range(200)])
    code = (
        f"import os, sqlite3\nc = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "c.execute('PRAGMA cache_size=1'); c.execute('BEGIN')\n"
        "c.execute(\"UPDATE studies SET pad = 'y'\")\nos._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_hot_journal_left_by_a_killed_worker_does_not_stop_the_resume(tmp_path: Path) -> None:
    """A read-only connection cannot roll a hot journal back ("attempt to write a readonly database"):
    the resume after a kill -9 failed in these checks until they opened the file read-write."""
    db = tmp_path / "optuna.db"
    _killed_mid_write(db)
    assert (tmp_path / "optuna.db-journal").exists()  # the case is real: the journal is there
    check_separate(f"sqlite:///{db}", f"sqlite:///{tmp_path / 'mlflow.db'}")  # no error
    with sqlite3.connect(db) as c:  # and the rewrite the killed process began was rolled back
        assert c.execute("SELECT DISTINCT pad FROM studies").fetchall() == [("x" * 500,)]
