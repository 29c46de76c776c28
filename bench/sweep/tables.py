"""Results tables of a protocol: their files, written atomically, read back and checked.

This is the only module that knows the file names under
``results/<protocol>/`` (ARCHITECTURE.md). Tables are rebuilt whole from
the Optuna storage every time (never appended: `bench.sweep.records` reads
the rows, `bench.sweep.frames` builds the tables, `bench.sweep.budget_audit`
refuses a cell whose budget differs), so an interrupted run that resumes,
or a second worker that finishes last, writes the same tables an
uninterrupted run writes.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from bench.atomic import locked, write_with
from bench.errors import BenchError
from bench.plan import Plan, cell_key, trained_cell
from bench.sweep.budget_audit import audit, audit_finished
from bench.sweep.frames import tables
from bench.sweep.records import Records, commits

MANIFEST = "manifest.json"
TRIALS = "trials.csv"
FINALS = "finals.csv"
SUMMARY = "summary.csv"
FLOOR = "floor.csv"  # the untrained trunk per final seed (bench.sweep.floor)
CELL_FLOOR = "cell_floor.csv"  # a learned-metric cell's own floor per final seed: trunk and metric untrained
BUDGET_CHECK = "budget_check.csv"  # the finals retrained at a multiple of the budget (bench.sweep.budget_check)
ARTIFACTS = "artifacts"
HISTORY = "optuna_history.csv"
PAIR_DISTANCES = "pair_distances.npz"
EMBEDDING_2D = "embedding_2d.npz"

TIMING_COLUMNS = ("wall_time_s",)  # the only columns allowed to differ between reruns of the same protocol
# keys are text: a key of digits only (or digits, a dot, digits) would otherwise be read back as a number
KEY_DTYPES = {"protocol_hash": str, "cell_key": str, "shared_key": str}


def check_cell_id(cell: object) -> str:
    """A cell id read from a file or an MLflow tag is untrusted: it must be a cell name, never a path.

    Cell ids are ``loss+miner`` labels (letters, digits, ``_.:+-``); a name
    with a separator, ``..``, a leading dot, a newline or markup (a crafted
    ``finals.csv`` row or tag) is refused, so it can neither point outside
    the results folder nor break out of a report's code span.
    """
    text = str(cell)
    if (
        not isinstance(cell, str)
        or not text
        or len(text) > 200
        or text.startswith(".")
        or not all(c.isascii() and (c.isalnum() or c in "_.:+-") for c in text)
    ):
        raise BenchError(f"cell id {text[:80]!r} is not a cell name (letters, digits, '_.:+-'): refused")
    return text


def cell_dir(results: Path, cell: str) -> Path:
    """A cell's artifact folder, always inside ``results/artifacts`` (see `check_cell_id`)."""
    return results / ARTIFACTS / check_cell_id(cell)


def protocol_dir(results_root: str | Path, name: str) -> Path:
    """A protocol's results directory: one folder per protocol name under ``results_root``."""
    return Path(results_root) / name


def claim_dir(results: Path, shared_hash: str, data_fingerprint: str | None = None) -> str | None:
    """Make ``results`` hold this protocol's tables: a directory from another version of the protocol's
    shared settings (another `Protocol.shared_hash`, or none recorded: made before cells had keys) or of its
    data (another data fingerprint, or none recorded) is moved aside to ``<name>@<hash12>`` (the old protocol
    hash), never mixed or overwritten. A version that differs only by its cells keeps the directory: the
    tables are rebuilt whole from the records of the cells it plans. Returns where it went."""
    manifest = read_manifest(results)
    if manifest is None or (
        manifest.get("shared_hash") == shared_hash
        and (data_fingerprint is None or manifest.get("data_fingerprint") == data_fingerprint)
    ):
        return None
    old = str(manifest.get("protocol_hash", "unknown"))[:12]
    target = results.with_name(f"{results.name}@{old}")
    n = 1
    while target.exists():
        n += 1
        target = results.with_name(f"{results.name}@{old}.{n}")
    results.rename(target)
    return str(target)


def cells_kept(results: Path, shared_hash: str, data_fingerprint: str | None = None) -> set[str]:
    """The cells whose rows ``results`` holds and keeps for this protocol version (`claim_dir` moves another
    version's folder aside: nothing of it is kept)."""
    manifest = read_manifest(results)
    if manifest is None or manifest.get("shared_hash") != shared_hash:
        return set()
    if data_fingerprint is not None and manifest.get("data_fingerprint") != data_fingerprint:
        return set()
    try:
        return set(pd.read_csv(results / SUMMARY, usecols=["cell"])["cell"].astype(str))
    except (OSError, ValueError):  # no summary yet, or not one of ours: nothing to lose
        return set()


def read_manifest(results: Path) -> dict[str, Any] | None:
    """The manifest of a results directory, None when it has none; a BenchError when it cannot be read."""
    path = results / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BenchError(f"{path}: unreadable manifest ({e}); move the directory aside") from None


def write(plan: Plan, records: Records, results: Path, manifest: dict[str, Any], finished: bool) -> dict[str, str]:
    """Audit, then write manifest, trials, finals, summary and per-cell Optuna histories; returns refused cells.

    Mid-sweep (``finished=False``) only cells with final runs are audited;
    at the end every cell is.
    """
    refused = audit(plan, records) if finished else audit_finished(plan, records)
    frames = tables(plan, records, refused)
    for name, filename in (("trials", TRIALS), ("finals", FINALS), ("summary", SUMMARY)):
        write_with(results / filename, lambda f, df=frames[name]: df.to_csv(f, index=False))
    write_histories(results, records.history)
    keep_rows(results, plan)
    # under the manifest's lock: a part another worker adds meanwhile (`add_part`) is merged, never overwritten
    with locked(results / (MANIFEST + ".lock")):
        previous = read_manifest(results) or {}
        parts = [*(previous.get("hardware") or []), *(manifest.get("hardware") or [])]  # every worker's, once each
        manifest = {
            **manifest,
            **({"hardware": [p for i, p in enumerate(parts) if p not in parts[:i]]} if parts else {}),
            "created": previous.get("created", manifest.get("created")),
            "refused": refused,
            "cell_commits": commits(records),
            "updated": now(),
        }
        write_with(results / MANIFEST, lambda f: json.dump(manifest, f, indent=2, sort_keys=True, default=str))
    return refused


def add_part(results: Path, part: dict[str, Any]) -> None:
    """Add one part of the work (a worker start's hardware, `bench.stores.provenance.hardware`) to the
    manifest's ``hardware``, under the manifest's lock: shards starting together each keep theirs."""
    with locked(results / (MANIFEST + ".lock")):
        manifest = read_manifest(results)
        if manifest is None:
            raise BenchError(f"{results}: no {MANIFEST}: not a dmlbench results directory")
        manifest["hardware"] = [*(manifest.get("hardware") or []), part]
        write_with(results / MANIFEST, lambda f: json.dump(manifest, f, indent=2, sort_keys=True, default=str))


def keep_rows(results: Path, plan: Plan) -> None:
    """floor.csv and budget_check.csv hold this version's rows only: floor rows of the protocol's shared key,
    budget check rows of the plan's cells under their current keys, all named with the protocol's hash (a row
    kept from an earlier version with the same key is the same record). The rest leave the tables (their
    MLflow runs stay). Rewritten only when something changes; budget_check.csv under the budget check's lock."""
    protocol = plan.protocol
    keys = {c.id: cell_key(protocol, c) for c in plan.cells}
    floor = results / FLOOR
    if floor.is_file():
        _rekey(floor, protocol.hash, lambda r: str(r.get("shared_key")) == protocol.shared_key)
    checked = results / BUDGET_CHECK
    if checked.is_file():
        with locked(checked.with_name(checked.name + ".lock")):
            _rekey(checked, protocol.hash, lambda r: keys.get(str(r.get("cell"))) == str(r.get("cell_key")))


def _rekey(path: Path, protocol_hash: str, keep: Any) -> None:
    try:
        frame = pd.read_csv(path, dtype=KEY_DTYPES)
    except (OSError, ValueError) as e:
        raise BenchError(f"{path}: unreadable table ({str(e).splitlines()[0]}); move it aside") from None
    rows = [r for r in frame.to_dict("records") if keep(r)]
    for r in rows:
        r["protocol_hash"] = protocol_hash
    new = pd.DataFrame(rows, columns=frame.columns)
    if len(new) != len(frame) or (
        "protocol_hash" in frame and set(frame["protocol_hash"].astype(str)) != {protocol_hash}
    ):
        write_with(path, lambda f: new.to_csv(f, index=False))


def write_histories(results: Path, histories: dict[str, list[dict[str, Any]]]) -> None:
    """Each cell's Optuna history (trial, state, value, best so far) as ``artifacts/<cell>/optuna_history.csv``."""
    for cell, rows in histories.items():
        if rows:
            columns = ["trial", "state", "value", "best_so_far"]
            frame = pd.DataFrame(rows, columns=(["draw"] if "draw" in rows[0] else []) + columns)
            write_with(cell_dir(results, cell) / HISTORY, lambda f, df=frame: df.to_csv(f, index=False))


def name_to_file(name: str) -> str:
    """The file of a table by its name (``trials``, ``finals``, ``summary``, ``floor``, ``budget_check``)."""
    return {
        "trials": TRIALS,
        "finals": FINALS,
        "summary": SUMMARY,
        "floor": FLOOR,
        "cell_floor": CELL_FLOOR,
        "budget_check": BUDGET_CHECK,
    }[name]


def read(results: str | Path) -> dict[str, Any]:
    """The tables of one results directory as DataFrames (``floor``, ``budget_check`` empty when absent), and its
    manifest."""
    results = Path(results)
    manifest = read_manifest(results)
    if manifest is None:
        raise BenchError(f"{results}: no {MANIFEST}: not a dmlbench results directory")
    out: dict[str, Any] = {"manifest": manifest}
    for name in ("trials", "finals", "summary", "floor", "cell_floor", "budget_check"):
        path = results / name_to_file(name)
        out[name] = pd.read_csv(path, dtype=KEY_DTYPES) if path.exists() else pd.DataFrame()
    check_tables(results, manifest, out)
    return out


def check_tables(results: Path, manifest: dict[str, Any], frames: dict[str, pd.DataFrame]) -> None:
    """No row twice: a duplicated row narrowed an interval; a run never writes one (tables are rebuilt
    whole from the records), so it is an edit or two tables concatenated."""
    for name, key in (
        ("finals", ("cell", "seed")),
        ("trials", ("cell", "trial")),
        ("floor", ("seed",)),
        ("cell_floor", ("cell", "seed")),
        ("budget_check", ("cell", "seed", "multiple")),
    ):
        df = frames[name]
        if df.empty or not set(key) <= set(df.columns):
            continue
        if "draw" in df.columns:  # tuning.repeats: a seed (and a trial) once per tuning draw
            key = ("draw", *key)
        dup = df[df.duplicated(list(key), keep=False)]
        if len(dup):
            first = dup.iloc[0]
            raise BenchError(
                f"{results / name_to_file(name)}: duplicate rows for "
                + ", ".join(f"{k} {first[k]}" for k in key)
                + ": the table was edited or "
                "concatenated; rerun `dmlbench run` to rewrite it from the records"
            )


def check_complete(results: Path, manifest: dict[str, Any], finals: pd.DataFrame, summary: pd.DataFrame) -> None:
    """Once the sweep finished, every cell of the manifest has all its final seeds in finals.csv (a cell
    whose every trial failed has a summary row with no seed instead). A table cut short gave a
    leaderboard of 5 of 11 cells with no word. `regress` reads tables edited on purpose and checks
    cells itself, so this is the leaderboard's and the claims' check, not `read`'s."""
    if not isinstance(manifest, dict) or not manifest.get("finished"):
        return  # mid-sweep: cells are still missing by design
    cells, refused = manifest.get("cells"), manifest.get("refused") or {}
    budget = manifest.get("budget") or {}
    seeds = budget.get("seeds")
    if isinstance(seeds, int) and isinstance(budget.get("draws"), int):
        seeds *= budget["draws"]  # tuning.repeats: the final seeds of every draw
    if not isinstance(cells, list) or "cell" not in finals:
        return
    # rows per trained cell and seed: under final.mode folds a seed has two rows (`Plan.reported_ids`)
    counts = {}
    if not finals.empty:
        trained = finals.assign(cell=finals["cell"].astype(str).map(trained_cell))
        key = ["cell", *(["draw"] if "draw" in trained else []), "seed"]
        trained = trained.drop_duplicates(key) if "seed" in trained else trained
        counts = trained["cell"].value_counts().to_dict()
    no_winner = set()
    if not summary.empty and {"cell", "n_seeds"} <= set(summary.columns):
        no_winner = {trained_cell(c) for c in summary.loc[summary["n_seeds"] == 0, "cell"].astype(str)} - set(counts)
    missing = [c for c in cells if c not in counts and c not in no_winner and c not in refused]
    if isinstance(budget.get("seeds_min"), int) and isinstance(seeds, int):  # a seed range: at least its minimum
        seeds = seeds // budget["seeds"] * budget["seeds_min"]
    short = [c for c in cells if isinstance(seeds, int) and 0 < counts.get(c, 0) < seeds and c not in refused]
    if missing or short:
        what = (
            f"no final row for {len(missing)} of the {len(cells)} cells its manifest lists (first: {missing[0]})"
            if missing
            else f"{counts[short[0]]} of {seeds} final seeds for cell {short[0]}"
        )
        raise BenchError(
            f"{results / FINALS}: {what}: the table is truncated or edited; rerun `dmlbench run` "
            "to rewrite it from the records"
        )


def now() -> str:
    """The UTC time to the second, ISO 8601: what records and manifests stamp."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
