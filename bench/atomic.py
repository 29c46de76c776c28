"""Files written whole or not at all: a temp file beside the target, then a rename. The one place that does it.

Results tables, report pages, caches and artifacts are read while sweeps run
(other workers, a leaderboard refresh); a reader must never see half a file,
and a kill mid-write must leave the previous version in place. ``mkstemp``
creates files readable by their owner only, so the mode is set to what a
plain ``open`` would give (0666 minus the umask): results are meant to be shared.

* `atomic_file`: the primitive, a file object to write into;
* `write_with`: ``write(file)`` for writers that take a file (``df.to_csv``, ``json.dump``);
* `write_text`, `write_json`: text and JSON, a folder problem as one `BenchError` line;
* `write_npz`: numpy arrays by name;
* `locked`: an exclusive lock file, one process at a time on one machine.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from bench.errors import BenchError

__all__ = ["atomic_file", "locked", "write_json", "write_npz", "write_text", "write_with"]


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
    """Open a temp file beside ``path``; on a clean exit it is synced and renamed onto ``path``.

    On any failure the temp file is removed and ``path`` is left as it was; an ``OSError`` that names no
    file (a full disk, a file-size limit, raised by a write or the sync) is raised again naming ``path``."""
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
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:  # a failed write or sync (a full disk, a file size limit) names no file: name it
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_with(path: str | Path, write: Any, mode: str = "w", **open_kw: Any) -> None:
    """``write(file)`` into a temp file beside ``path``, then rename (text files with ``newline=""`` by
    default, as the csv module and pandas expect)."""
    if "b" not in mode:
        open_kw.setdefault("newline", "")
    with atomic_file(path, mode, **open_kw) as f:
        write(f)


def write_text(path: str | Path, text: str) -> None:
    """``text`` as UTF-8, atomically; a folder that cannot be written is one `BenchError` line."""
    path = Path(path)
    try:
        with atomic_file(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise BenchError(f"cannot write {path}: {e.strerror or e}") from None


def write_json(path: str | Path, data: Any) -> None:
    """Indented JSON, atomically; NaN is refused (strict JSON), other objects are written as strings."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False, default=str) + "\n")


def write_npz(path: str | Path, **arrays: Any) -> None:
    """`numpy.savez` of ``arrays`` (by name), atomically; read back with ``allow_pickle=False``."""
    import numpy as np

    with atomic_file(path, "wb") as f:
        np.savez(f, allow_pickle=False, **arrays)
