"""Bring a sweep's stores back from a lent machine whose returned files are limited in size and number.

A chunk on a lent GPU (`scripts/gpu_chunk.sh`) writes to a copy of the stores it was carried with: the Optuna
and MLflow databases and the results folder in STORES_DIR, and MLflow's artifacts wherever the experiment
keeps them (beside the database for a store made there, or the absolute folder recorded when the store was
made elsewhere). The machine returns at most a few files of at most 16 MiB each, no more than two folders
down, so the records come back packed:

    python3 scripts/stores_pack.py stamp STORES_DIR                 # on arrival, before the sweep runs
    python3 scripts/stores_pack.py pack STORES_DIR OUT              # after it: OUT/stores.tgz.00, ..., stores.sha256
    python3 scripts/stores_pack.py unpack PARTS_DIR STORES_DIR      # here, from the returned parts
    python3 scripts/stores_pack.py unpack --no-states PARTS_DIR STORES_DIR    # ... to go on on another device

`pack` takes every file of STORES_DIR but its artifact folders, and of each artifact folder the files
written since `stamp` (the run's earlier artifacts stayed here). `unpack` writes the artifacts to the
folders they were recorded in, then the results, then the databases, so no record ever names a missing
artifact; it refuses (exit 2, nothing written) when a database here is not the one that was carried, since
replacing it would drop the records written here meanwhile.

A long sweep whose sessions may each get another machine keeps its place in a checkpoint instead, a pack of
the same form taken whole, without a stamp, while its workers run:

    python3 scripts/stores_pack.py checkpoint STORES_DIR OUT [--pause PID ...]   # OUT/stores.tgz.NN, ..., checkpoint.json
    python3 scripts/stores_pack.py unpack OUT STORES_DIR                          # on the next machine: restore
    python3 scripts/stores_pack.py finished STORES_DIR [--check MULTIPLE]         # its results, once whole
    python3 scripts/stores_pack.py same STORES_DIR OUT                            # nothing run since restoring?

`checkpoint` copies each database through SQLite's backup API (a consistent copy of a database that workers
hold open), STORES_DIR/results, and the artifacts but the kept models and test embeddings (`final.keep_models`:
4 MB a final seed, which no later step of a sweep reads). The two databases are copied with the workers given by
--pause stopped (SIGSTOP, then SIGCONT), so the checkpoint is the stores as a kill -9 of every worker at that
moment would leave them, which the runner resumes; without --pause the workers must already be stopped.
`unpack` restores it as it unpacks a chunk: refused where a database is there that is not the checkpoint's.

`same` answers whether the stores are still what the checkpoint restores (their databases and results, file
for file), as `scripts/gpu_prepare.sh` asks before it copies them: exit 0 they are, 1 they are not (one line
naming a file that differs).

Exit: 0 done; 2 bad input or a refusal; 3 the pack would not fit the limits (--max-files, --max-mib):
nothing is written, and the chunk should be shorter.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import shutil
import signal
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
STATES = "resume"  # in a protocol's results folder: the saved states of unfinished runs (bench.resume.FOLDER)
SUMMARY = "checkpoint.json"  # beside a checkpoint's parts: when, what it holds, the sweep's progress
# bench.sweep.kept's files, a final seed's model and test embeddings for a user to reuse: left out of a checkpoint
KEPT = ("final_model.pt", "test_embeddings.npz")
LOCK_TRIES = 20  # a paused worker holding a database's write lock is let go on for a moment this often
LOCK_WAIT_S = 2.0  # how long each try waits for that lock


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


def _db_digest(path: Path) -> str | None:
    """A database's identity: a digest of its records, not of its file. A checkpoint copies a database through
    SQLite's backup API, whose file may differ in bytes (free pages, the change counter) but holds the same
    records; a store restored from it, or the one it was taken of, is then the database a lent machine was
    carried with, and the records that come back may replace it."""
    if not path.exists():
        return None
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _records_digest(con)
    finally:
        con.close()


def _records_digest(con: sqlite3.Connection) -> str:
    """Each table's name and schema, then its rows sorted. Not SQL's dump (``iterdump``): that lists a table's
    rows in the order its SELECT returns them, which the SQLite library's query planner decides (a covering index
    instead of the table), so the same database dumped by a lent machine's Python and this one's differed, and
    its records were refused on return."""
    h = hashlib.sha256()
    tables = con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
    for name, sql in tables:
        h.update(f"{name}\0{sql}\0".encode())
        quoted = name.replace('"', '""')
        for row in sorted(repr(r) for r in con.execute(f'SELECT * FROM "{quoted}"')):
            h.update(row.encode())
            h.update(b"\n")
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
    record = {"arrived": {name: _db_digest(stores / name) for name in DATABASES}, "time": time.time()}
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


def _write_pack(
    members: list[tuple[Path, str]],
    index: dict,
    out: Path,
    limits: tuple[float, int, int],
    hint: str,
) -> tuple[list[Path], int]:
    """``members`` (file, name in the pack) and ``index`` as parts in OUT with their sums; the parts of an earlier
    pack in OUT are replaced. ``limits``: the largest part and the most parts and MiB in all; ``hint``, what to do
    when they are passed. Returns the parts and their total size."""
    part_mib, max_files, max_mib = limits
    with tempfile.TemporaryDirectory() as tmp:  # built aside, so a pack too large leaves OUT untouched
        parts = _Parts(Path(tmp), int(part_mib * 2**20))
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
                f"{total / 2**20:.1f} MiB in {len(parts.files)} parts exceeds the limits "
                f"({max_files} files, {max_mib} MiB): {hint}"
            )
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(f"{PART}*"):
            old.unlink()
        sums = "".join(f"{_digest(p)}  {p.name}\n" for p in parts.files)
        done = []
        for p in parts.files:
            shutil.move(p, out / p.name)
            done.append(out / p.name)
        (out / SUMS).write_text(sums)
    return done, total


def pack(stores: Path, out: Path, part_mib: float, max_files: int, max_mib: int) -> list[Path]:
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
    done, total = _write_pack(members, index, out, (part_mib, max_files, max_mib), "run shorter chunks")
    print(f"stores_pack: {len(members)} files, {total / 2**20:.1f} MiB in {len(done)} part(s) in {out}")
    return done


class _Locked(Exception):
    pass


def _backup(db: Path, target: Path) -> None:
    """A consistent copy of SQLite database ``db``, which workers may hold open, through SQLite's backup API."""
    source = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=LOCK_WAIT_S, isolation_level=None)
    copy = sqlite3.connect(target)
    try:
        # a read transaction first, which waits at most LOCK_WAIT_S for a writer that is committing: holding it, no
        # writer can commit, so the backup copies in one step (Python's backup retries a busy source for ever)
        source.execute("BEGIN")
        source.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        source.backup(copy)
    except sqlite3.OperationalError as e:  # a writer holds the database: its transaction is not committed yet
        raise _Locked(str(e)) from None
    finally:
        copy.close()
        source.close()


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # a worker that ended meanwhile holds nothing
            pass


def _snapshot(stores: Path, target: Path, pause: list[int]) -> None:
    """The databases of STORES_DIR copied into ``target`` with the workers ``pause`` stopped; a stopped worker
    that holds a write lock is let go on for a moment and stopped again."""
    for attempt in range(LOCK_TRIES):
        _signal(pause, signal.SIGSTOP)
        try:
            for name in DATABASES:
                if (stores / name).exists():
                    _backup(stores / name, target / name)
            return
        except _Locked as e:
            if attempt == LOCK_TRIES - 1:
                raise Refused(f"{stores}: a database stayed locked by a writer ({e}): nothing written") from None
        finally:
            _signal(pause, signal.SIGCONT)
        time.sleep(LOCK_WAIT_S / 4)


def _progress(optuna_db: Path) -> dict[str, int]:
    """The sweep's Optuna trials by state (tuning trials and final seeds alike)."""
    if not optuna_db.exists():
        return {}
    with sqlite3.connect(f"file:{optuna_db}?mode=ro", uri=True) as con:
        return dict(con.execute("SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall())


def _checked(stores: Path) -> int:
    """The budget check's completed seeds (every results/*/budget_check.csv row whose state is COMPLETE): its
    progress lives there, not in Optuna."""
    count = 0
    for path in sorted(stores.glob("results/*/budget_check.csv")):
        with path.open(newline="") as f:
            count += sum(row.get("state") == "COMPLETE" for row in csv.DictReader(f))
    return count


def finished(stores: Path, multiple: int | None) -> Path:
    """The results folder of the finished run in the stores, refused (one line) unless it is whole: its manifest
    says the sweep finished and, with ``multiple``, budget_check.csv holds a row at that multiple for every
    final seed of every cell with finals (a failed seed's row counts: it was trained and recorded)."""
    folders = [m.parent for m in sorted(stores.glob("results/*/manifest.json"))]
    if len(folders) != 1:
        raise Refused(f"{stores}/results: expected the results of one run, found {len(folders)}")
    results = folders[0]
    manifest = json.loads((results / "manifest.json").read_text())
    if not manifest.get("finished"):
        raise Refused(
            f"{results}: the sweep has not finished (its manifest says so): let the workers run it to its end"
        )
    if multiple is None:
        return results
    with (results / "finals.csv").open(newline="") as f:
        seeds = {(row["cell"], row["seed"]) for row in csv.DictReader(f)}
    rows = set()
    if (results / "budget_check.csv").is_file():
        with (results / "budget_check.csv").open(newline="") as f:
            rows = {(r["cell"], r["seed"]) for r in csv.DictReader(f) if r.get("multiple") == str(multiple)}
    missing = sorted(seeds - rows)
    if missing:
        raise Refused(
            f"{results}: the budget check at {multiple}x lacks {len(missing)} of {len(seeds)} final seeds "
            f"(first: {missing[0][0]} seed {missing[0][1]}): let the workers finish it first"
        )
    return results


def behind(stores: Path, out: Path) -> str:
    """What the stores lack of the progress a checkpoint in OUT recorded ("" when nothing): fewer complete
    trials, or fewer budget-check seeds, than the checkpoint means they were left by an earlier session, and
    another went on from there."""
    if not (out / SUMMARY).is_file():
        raise Refused(f"{out}: no {SUMMARY}: not a checkpoint (the order is: behind STORES_DIR CHECKPOINT_DIR)")
    summary = json.loads((out / SUMMARY).read_text())
    here = _progress(stores / "optuna.db").get("COMPLETE", 0)
    there = summary["trials"].get("COMPLETE", 0)
    if here < there:
        return f"{here} complete trials here, {there} in the checkpoint"
    here, there = _checked(stores), summary.get("checked", 0)  # absent: a checkpoint from before the check
    return f"{here} budget-check seeds here, {there} in the checkpoint" if here < there else ""


def checkpoint(stores: Path, out: Path, part_mib: float, max_files: int, max_mib: int, pause: list[int]) -> None:
    if not any((stores / name).exists() for name in DATABASES):
        raise Refused(f"{stores}: no {' or '.join(DATABASES)}: not a sweep's stores")
    with tempfile.TemporaryDirectory() as tmp:
        copied = Path(tmp)
        _snapshot(stores, copied, pause)
        roots = artifact_roots(copied)
        members = [(copied / n, f"stores/{n}") for n in DATABASES if (copied / n).exists()]
        results = stores / "results"
        files = sorted(p for p in results.rglob("*") if p.is_file()) if results.is_dir() else []
        members += [(p, f"stores/{p.relative_to(stores).as_posix()}") for p in files]
        left_out = 0
        for i, root in enumerate(roots):
            for path in sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []:
                if path.name in KEPT:
                    left_out += 1
                else:
                    members.append((path, f"roots/{i}/{path.relative_to(root).as_posix()}"))
        # a checkpoint "arrived" as itself: `unpack` restores it where there is no database, or the same one
        index = {
            "arrived": {n: _db_digest(copied / n) for n in DATABASES},
            "time": time.time(),
            "roots": {str(i): str(r) for i, r in enumerate(roots)},
        }
        done, total = _write_pack(members, index, out, (part_mib, max_files, max_mib), "raise --max-mib")
        summary = {
            "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "stores": str(stores.resolve()),
            "trials": _progress(copied / "optuna.db"),
            "checked": _checked(stores),
            "files": len(members),
            "kept_files_left_out": left_out,
            "parts": len(done),
            "mib": round(total / 2**20, 2),
        }
        (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"stores_pack: checkpoint of {stores}: {len(members)} files ({left_out} kept models and embeddings left "
        f"out), {total / 2**20:.1f} MiB in {len(done)} part(s) in {out}; trials {summary['trials']}"
    )


def _replace(source: Path, target: Path) -> None:
    """``target`` becomes ``source``'s content in one rename (a copy beside it first)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _join(parts_dir: Path, into: Path) -> Path:
    """The parts in PARTS_DIR, each checked against its sum, joined into one .tgz in INTO."""
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
    joined = into / "pack.tgz"
    with joined.open("wb") as f:
        for p in parts:
            f.write(p.read_bytes())
    return joined


def same(stores: Path, out: Path) -> str:
    """How STORES_DIR differs from what the checkpoint in OUT restores ("" when it does not): a database or
    results file of other content, or one that only one of them has. Stores a checkpoint was taken of or restored
    to, that have run nothing since, get "", and a lent machine can then restore the checkpoint (which travels in the
    checkout) instead of carrying a copy of the stores. Databases are compared by their records (`_db_digest`),
    so the stores a checkpoint was just taken of are the same too. Artifacts are not compared: a run writes them
    only with a record in a database, which would differ."""
    if not (out / SUMMARY).is_file():
        raise Refused(f"{out}: no {SUMMARY}: not a checkpoint (the order is: same STORES_DIR CHECKPOINT_DIR)")
    here = {n for n in DATABASES if (stores / n).is_file()}
    results = stores / "results"
    here |= {p.relative_to(stores).as_posix() for p in results.rglob("*") if p.is_file()} if results.is_dir() else set()
    seen = set()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with tarfile.open(_join(out, Path(tmp)), "r:gz") as tar:
                index = tar.extractfile(INDEX)
                arrived = json.loads(index.read())["arrived"] if index else {}
                for member in tar:
                    if not member.isfile() or not member.name.startswith("stores/"):
                        continue
                    name = member.name.removeprefix("stores/")
                    if name not in here:
                        return f"{name}: in the checkpoint, not here"
                    if name in DATABASES:  # its records, whose digest the pack's index holds (`unpack` reads it so)
                        theirs, ours = arrived.get(name), _db_digest(stores / name)
                    else:
                        source = tar.extractfile(member)
                        assert source is not None  # a regular file's member
                        theirs, ours = hashlib.sha256(source.read()).hexdigest(), _digest(stores / name)
                    if theirs != ours:
                        return f"{name}: not the checkpoint's"
                    seen.add(name)
        except (tarfile.TarError, EOFError, zlib.error) as e:
            raise Refused(f"{out}: the parts do not make a whole pack ({e})") from None
    extra = sorted(here - seen)
    return f"{extra[0]}: not in the checkpoint" if extra else ""


def _is_state(relative: Path) -> bool:
    """A saved training state in the stores: results/NAME/resume/... (bench.resume.FOLDER)."""
    return len(relative.parts) > 3 and relative.parts[0] == "results" and relative.parts[2] == STATES


def unpack(parts_dir: Path, stores: Path, states: bool = True) -> int:
    """The records in PARTS_DIR into STORES_DIR. ``states=False`` leaves out the saved training states of runs
    the lent machine left unfinished, and keeps those here: where the workers that go on are of another device,
    they could not resume the lent machine's (a state is tied to its device) and would train those runs again,
    while each would have replaced this machine's own state of the same run."""
    with tempfile.TemporaryDirectory() as tmp:
        joined = _join(parts_dir, Path(tmp))
        unpacked = Path(tmp) / "x"
        try:
            with tarfile.open(joined, "r:gz") as tar:
                tar.extractall(unpacked, filter="data")
        except (tarfile.TarError, EOFError, zlib.error) as e:
            raise Refused(f"{parts_dir}: the parts do not make a whole pack ({e}): nothing unpacked") from None
        index = json.loads((unpacked / INDEX).read_text())
        for name in DATABASES:
            here, carried = _db_digest(stores / name), index["arrived"].get(name)
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
            (p for p in source.rglob("*") if p.is_file() and (states or not _is_state(p.relative_to(source)))),
            key=lambda p: (p.name in DATABASES, p.as_posix()),
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
    p.add_argument("--part-mib", type=float, default=15, help="the largest part (the machine returns files <= 16 MiB)")
    p.add_argument(
        "--max-files", type=int, default=6, help="the most parts (8 files come back, the sums and logs among them)"
    )
    p.add_argument("--max-mib", type=int, default=60, help="the most in all (64 MiB come back)")
    c = sub.add_parser("checkpoint")
    c.add_argument("stores", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--part-mib", type=float, default=1.9, help="the largest part (what a repository takes well)")
    c.add_argument("--max-files", type=int, default=40, help="the most parts")
    c.add_argument("--max-mib", type=int, default=64, help="the most in all")
    c.add_argument(
        "--pause", type=int, action="append", default=[], metavar="PID",
        help="a worker to stop while the databases are copied (repeatable)",
    )  # fmt: skip
    m = sub.add_parser("same", help="exit 0 if the stores are what the checkpoint restores, else 1 and the difference")
    m.add_argument("stores", type=Path)
    m.add_argument("out", type=Path)
    b = sub.add_parser("behind", help="print what the stores lack of the checkpoint's progress, if anything")
    b.add_argument("stores", type=Path)
    b.add_argument("out", type=Path)
    sub.add_parser("progress", help="the stores' Optuna trials by state and budget-check seeds done").add_argument(
        "stores", type=Path
    )
    f = sub.add_parser("finished", help="print the finished run's results folder; refused while it is not whole")
    f.add_argument("stores", type=Path)
    f.add_argument("--check", type=int, default=None, metavar="MULTIPLE", help="its budget check at MULTIPLE too")
    u = sub.add_parser("unpack")
    u.add_argument("parts", type=Path)
    u.add_argument("stores", type=Path)
    u.add_argument(
        "--no-states", action="store_true",
        help="leave out the saved states of runs left unfinished there, keeping those here (workers of another device go on)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if not args.stores.is_dir() and args.command != "unpack":
            raise Refused(f"{args.stores}: no such folder")
        if args.command == "stamp":
            stamp(args.stores)
        elif args.command == "pack":
            pack(args.stores, args.out, args.part_mib, args.max_files, args.max_mib)
        elif args.command == "checkpoint":
            checkpoint(args.stores, args.out, args.part_mib, args.max_files, args.max_mib, args.pause)
        elif args.command == "behind":
            print(behind(args.stores, args.out))
        elif args.command == "same":
            differs = same(args.stores, args.out)
            if differs:
                print(f"stores_pack: {args.stores} differs from the checkpoint in {args.out}: {differs}")
                return 1
        elif args.command == "finished":
            print(finished(args.stores, args.check))
        elif args.command == "progress":
            print(json.dumps({**_progress(args.stores / "optuna.db"), "budget_check_complete": _checked(args.stores)}))
        else:
            unpack(args.parts, args.stores, states=not args.no_states)
    except Refused as e:
        print(f"stores_pack: {e}", file=sys.stderr)
        return 2
    except TooLarge as e:
        print(f"stores_pack: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
