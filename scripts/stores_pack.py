"""Bring a sweep's stores back from a lent machine whose returned files are limited in size and number.

A chunk on a lent GPU (`scripts/gpu_chunk.sh`) writes to a copy of the stores it was carried with: the Optuna
and MLflow databases and the results folder in STORES_DIR, and MLflow's artifacts wherever the experiment
keeps them (beside the database for a store made there, or the absolute folder recorded when the store was
made elsewhere). The machine returns at most a few files of at most 16 MiB each, no more than two folders
down, so the records come back packed:

    python3 scripts/stores_pack.py stamp STORES_DIR                 # on arrival, before the sweep runs
    python3 scripts/stores_pack.py pack STORES_DIR OUT              # after it: OUT/stores.tgz.00, ..., stores.sha256
    python3 scripts/stores_pack.py unpack PARTS_DIR STORES_DIR      # here, from the returned parts

`pack` takes every file of STORES_DIR but its artifact folders, and of each artifact folder the files
written since `stamp` (the run's earlier artifacts stayed here). `unpack` writes the artifacts to the
folders they were recorded in, then the results, then the databases, so no record ever names a missing
artifact; it refuses (exit 2, nothing written) when a database here is not the one that was carried, since
replacing it would drop the records written here meanwhile.

Exit: 0 done; 2 bad input or a refusal; 3 the pack would not fit the limits (--max-files, --max-mib):
nothing is written, and the chunk should be shorter.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sqlite3
import sys
import tarfile
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlparse

DATABASES = ("optuna.db", "mlflow.db")
STAMP = ".carried.json"  # the databases' digests and the time as the stores arrived
INDEX = "pack.json"  # inside the pack: the stamp, and where each artifact folder belongs
PART = "stores.tgz."
SUMS = "stores.sha256"  # beside the parts: each part's digest, so a missing or damaged one is named


class Refused(Exception):
    """A refusal: one line, exit 2."""


class TooLarge(Exception):
    """A pack that would not come back whole: one line, exit 3."""


def _digest(path: Path) -> str | None:
    if not path.exists():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def artifact_roots(stores: Path) -> list[Path]:
    """The local folders MLflow's experiments in STORES_DIR/mlflow.db keep their artifacts in."""
    db = stores / "mlflow.db"
    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT artifact_location FROM experiments").fetchall()
    roots = []
    for (location,) in rows:  # a relative one (MLflow's Default experiment: ./mlruns) names no folder of the run
        url = urlparse(location or "")
        path = Path(unquote(url.path))
        if url.scheme in ("", "file") and path.is_absolute():
            roots.append(path)
    return sorted(set(roots))


def stamp(stores: Path) -> dict:
    record = {"arrived": {name: _digest(stores / name) for name in DATABASES}, "time": time.time()}
    (stores / STAMP).write_text(json.dumps(record, indent=1))
    return record


class _Parts(io.RawIOBase):
    """A write-only stream cut into numbered files of at most ``size`` bytes."""

    def __init__(self, out: Path, size: int) -> None:
        self.out, self.size = out, size
        self.files: list[Path] = []
        self._file: BinaryIO | None = None
        self._left = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        while len(view):
            if self._left == 0:
                if self._file:
                    self._file.close()
                path = self.out / f"{PART}{len(self.files):02d}"
                self.files.append(path)
                self._file, self._left = path.open("wb"), self.size
            n = min(self._left, len(view))
            assert self._file is not None
            self._file.write(view[:n])
            view, self._left = view[n:], self._left - n
        return len(data)

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
        super().close()


def pack(stores: Path, out: Path, part_mib: int, max_files: int, max_mib: int) -> list[Path]:
    if not (stores / STAMP).exists():
        raise Refused(f"{stores}: no {STAMP}: run `stores_pack.py stamp` on arrival, before the sweep")
    record = json.loads((stores / STAMP).read_text())
    roots = artifact_roots(stores)
    members: list[tuple[Path, str]] = []
    for path in sorted(p for p in stores.rglob("*") if p.is_file() and p.name != STAMP):
        if not any(path.is_relative_to(r) for r in roots):
            members.append((path, f"stores/{path.relative_to(stores).as_posix()}"))
    for i, root in enumerate(roots):  # written since the stamp: the run's earlier artifacts never left
        for path in sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_mtime >= record["time"] - 1):
            members.append((path, f"roots/{i}/{path.relative_to(root).as_posix()}"))
    index = {**record, "roots": {str(i): str(r) for i, r in enumerate(roots)}}
    with tempfile.TemporaryDirectory() as tmp:  # built aside, so a pack too large leaves OUT untouched
        parts = _Parts(Path(tmp), part_mib << 20)
        with tarfile.open(fileobj=parts, mode="w|gz") as tar:
            data = json.dumps(index, indent=1).encode()
            info = tarfile.TarInfo(INDEX)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for path, name in members:
                tar.add(path, arcname=name, recursive=False)
        parts.close()
        total = sum(p.stat().st_size for p in parts.files)
        if len(parts.files) > max_files or total > max_mib << 20:
            raise TooLarge(
                f"{total / 2**20:.1f} MiB in {len(parts.files)} parts exceeds what comes back "
                f"({max_files} files, {max_mib} MiB): run shorter chunks"
            )
        out.mkdir(parents=True, exist_ok=True)
        sums = "".join(f"{_digest(p)}  {p.name}\n" for p in parts.files)
        done = []
        for p in parts.files:
            shutil.move(p, out / p.name)
            done.append(out / p.name)
        (out / SUMS).write_text(sums)
    print(f"stores_pack: {len(members)} files, {total / 2**20:.1f} MiB in {len(done)} part(s) in {out}")
    return done


def _replace(source: Path, target: Path) -> None:
    """``target`` becomes ``source``'s content in one rename (a copy beside it first)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def unpack(parts_dir: Path, stores: Path) -> int:
    if not (parts_dir / SUMS).exists():
        raise Refused(f"{parts_dir}: no {SUMS} (the list of the parts `pack` wrote): did it come back?")
    parts = []
    for line in (parts_dir / SUMS).read_text().splitlines():
        fields = line.split(maxsplit=1)
        if len(fields) != 2 or not fields[1].startswith(PART):
            raise Refused(f"{parts_dir / SUMS}: not the list `pack` writes ({line!r}): nothing unpacked")
        digest, name = fields
        if _digest(parts_dir / name) != digest:
            raise Refused(f"{parts_dir / name}: missing or not the part `pack` wrote: nothing unpacked")
        parts.append(parts_dir / name)
    with tempfile.TemporaryDirectory() as tmp:
        joined = Path(tmp) / "pack.tgz"
        with joined.open("wb") as f:
            for p in parts:
                f.write(p.read_bytes())
        unpacked = Path(tmp) / "x"
        try:
            with tarfile.open(joined, "r:gz") as tar:
                tar.extractall(unpacked, filter="data")
        except (tarfile.TarError, EOFError, zlib.error) as e:
            raise Refused(f"{parts_dir}: the parts do not make a whole pack ({e}): nothing unpacked") from None
        index = json.loads((unpacked / INDEX).read_text())
        for name in DATABASES:
            here, carried = _digest(stores / name), index["arrived"].get(name)
            if here is not None and here != carried:
                raise Refused(
                    f"{stores / name} is not the database that was carried (it changed here since, or another "
                    "run's): unpacking would drop its records; unpack into an empty folder and compare"
                )
        count = 0
        for i, root in index["roots"].items():  # artifacts first: every record then names files that exist
            source = unpacked / "roots" / i
            for path in sorted(p for p in source.rglob("*") if p.is_file()) if source.exists() else []:
                _replace(path, Path(root) / path.relative_to(source))
                count += 1
        source = unpacked / "stores"
        ordered = sorted(
            (p for p in source.rglob("*") if p.is_file()), key=lambda p: (p.name in DATABASES, p.as_posix())
        )
        for path in ordered:  # the results, then the databases
            _replace(path, stores / path.relative_to(source))
            count += 1
    print(f"stores_pack: {count} files unpacked into {stores} and {len(index['roots'])} artifact folder(s)")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("stamp").add_argument("stores", type=Path)
    p = sub.add_parser("pack")
    p.add_argument("stores", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--part-mib", type=int, default=15, help="the largest part (the machine returns files <= 16 MiB)")
    p.add_argument(
        "--max-files", type=int, default=6, help="the most parts (8 files come back, the sums and logs among them)"
    )
    p.add_argument("--max-mib", type=int, default=60, help="the most in all (64 MiB come back)")
    u = sub.add_parser("unpack")
    u.add_argument("parts", type=Path)
    u.add_argument("stores", type=Path)
    args = parser.parse_args(argv)
    try:
        if not args.stores.is_dir() and args.command != "unpack":
            raise Refused(f"{args.stores}: no such folder")
        if args.command == "stamp":
            stamp(args.stores)
        elif args.command == "pack":
            pack(args.stores, args.out, args.part_mib, args.max_files, args.max_mib)
        else:
            unpack(args.parts, args.stores)
    except Refused as e:
        print(f"stores_pack: {e}", file=sys.stderr)
        return 2
    except TooLarge as e:
        print(f"stores_pack: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
