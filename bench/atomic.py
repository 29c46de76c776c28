"""Files written whole or not at all: a temp file beside the target, then a rename.

Results tables, report pages and artifacts are read while sweeps run (other
workers, a leaderboard refresh); a reader must never see half a file, and a
kill mid-write must leave the previous version in place. ``mkstemp`` creates
files readable by their owner only, so the mode is set to what a plain
``open`` would give (0666 minus the umask): results are meant to be shared.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """An exclusive lock on the file ``path`` (created if missing) for the block: one process at a time on one
    machine (flock; a network file system may not honour it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def atomic_file(path: str | Path, mode: str = "w", **open_kw: Any) -> Iterator[IO[Any]]:
    """Open a temp file beside ``path``; on a clean exit it is synced and renamed onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, **open_kw) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
