"""Checksums of published files and the cache of converted arrays (``$DMLBENCH_CACHE``).

A conversion (decoding, resizing) is done once and kept as an ``.npz`` keyed
by everything it depends on; a cache file that is truncated or altered fails
its digest and is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bench.atomic import write_npz
from bench.errors import BenchError


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes: a few ms for Omniglot's files, and immune to copied mtimes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str) -> str:
    """Return the file's sha256, or a BenchError when it is not the published one."""
    actual = file_sha256(path)
    if actual != expected:
        raise BenchError(
            f"{path}: sha256 {actual[:16]}... differs from the published {expected[:16]}...; "
            "the file is corrupt or another version: download it again"
        )
    return actual


# --------------------------------------------------------------------------- cache

RACY_NS = 2_000_000_000  # FAT keeps times to 2 s, ext3 and HFS+ to 1 s: a file's facts are kept once it is older


def stat_key(st: os.stat_result) -> list[int]:
    """What a file's cached facts are keyed by: size, modification time, and the change time, inode and device
    that a rewrite cannot keep (restoring the modification time is itself a change of the change time)."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def settled(st: os.stat_result) -> bool:
    """Whether the file's times are older than `RACY_NS`: a file changed within a coarse file system's clock
    tick of being read could be changed again in that tick with every time kept (git's racy-clean rule)."""
    return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS


def cache_dir() -> Path:
    """``$DMLBENCH_CACHE``, else ``$XDG_CACHE_HOME/dmlbench``, else ``~/.cache/dmlbench``."""
    env = os.environ.get("DMLBENCH_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dmlbench"


def cache_path(name: str, key: Mapping[str, Any]) -> Path:
    """The cache file for `key`: any change of source hash or setting gives another file."""
    blob = json.dumps(dict(key), sort_keys=True, default=str).encode()
    return cache_dir() / f"{name}-{hashlib.sha256(blob).hexdigest()[:20]}.npz"


def _digest(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """crc32 over names, shapes, dtypes and bytes: catches truncation and bit rot, cheaply next to reading them."""
    crc = 0
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        crc = zlib.crc32(f"{name}:{a.dtype.str}:{a.shape};".encode(), crc)
        crc = zlib.crc32(a.reshape(-1).view(np.uint8).data, crc)
    return np.array([crc], dtype=np.uint32)


def read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays stored at `path`, or None when absent or damaged in any way."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        stored = arrays.pop("__digest__")
        if not np.array_equal(stored, _digest(arrays)):
            return None
        return arrays
    except Exception:  # any unreadable file is simply rebuilt
        return None


def write_cache(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write atomically (temp file in the same folder, fsync, rename): a killed process leaves no half file."""
    write_npz(path, __digest__=_digest(arrays), **arrays)  # read back without pickle too


def cached_arrays(
    name: str, key: Mapping[str, Any], build: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Return the cached arrays for `key`, building and storing them on a miss or a damaged file.

    A cache that cannot be written (read-only home, full disk) costs speed,
    never correctness: the built arrays are returned with a warning.
    """
    path = cache_path(name, key)
    arrays = read_cache(path)
    if arrays is not None:
        return arrays
    arrays = build()
    try:
        write_cache(path, arrays)
    except OSError as err:
        logging.getLogger("dmlbench.data").warning(
            f"cache not written: {path}: {err.strerror or err} (the data are used uncached; nothing half-written)"
        )
    return arrays
