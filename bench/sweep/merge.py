"""A sweep split without a shared database: jobs that each ran some cells into their own stores, joined into one
results folder.

Each job is ``dmlbench run P --cells a,b --results-dir rN --storage sqlite:///sN.db --tracking-uri ./mN``: the
cells it names, its own Optuna storage and MLflow store, its own tables. A cell's training depends on the
protocol's shared settings, its own definition and the data only (`bench.plan.cell_key`; common random numbers:
its seeds do not depend on the other cells), so a cell run in a job has exactly the records it would have in one
sweep. `merge` checks what one sweep guarantees by construction, then writes one results folder:

* every job ran the same protocol version (the same hash: shared settings and grid) on the same data (the data
  fingerprint and the split fingerprints), with the same budget and final seeds, and finished;
* no cell was run by two jobs (two records of one cell: which one is the result?);
* every planned cell was run by a job; one that was not is named in the manifest (``not_run``) and on the
  command line, and the command exits 1, as it does for a cell a job ran without a result: the rule of `run`
  (`bench.reports.source.Results.asked_cells`: a job answers for the cells it was asked for, a merge for all).

Any other difference is a refusal, one line, exit 2, and nothing is written. The tables are then rebuilt from
the jobs' rows by the functions a sweep uses (`bench.sweep.budget_audit`, `bench.sweep.frames`), so the
merged folder's trials, finals and summary equal those of one sweep of the same cells (wall times aside); the
floor (the same untrained trunks in every job) is the first job's, checked equal in the others; the budget check
rows, the artifacts and each job's MLflow runs are the jobs' own (the manifest lists every job's stores, where a
leaderboard's records stay).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from bench.atomic import write_with
from bench.errors import BenchError
from bench.plan import cell_key
from bench.plan import plan as make_plan
from bench.protocol import parse_protocol
from bench.sweep import tables
from bench.sweep.records import Records, collapse_evaluations, history

SAME = ("protocol", "shared_hash", "data_fingerprint", "fingerprints", "protocol_hash", "budget", "primary_metric")


def job_dir(path: str | Path) -> Path:
    """A job's results folder: the one given (``rN/<protocol>``), or the only protocol folder under it (``rN``)."""
    path = Path(path)
    if (path / tables.MANIFEST).is_file():
        return path
    inner = [p for p in path.iterdir() if (p / tables.MANIFEST).is_file()] if path.is_dir() else []
    if len(inner) == 1:
        return inner[0]
    what = "does not exist" if not path.exists() else f"holds {len(inner)} results folders (give one)"
    raise BenchError(f"merge: {path} {what}: expected a job's results folder (its --results-dir/<protocol>)")


def _read(job: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"manifest": tables.read_manifest(job)}
    for name in ("trials", "finals", "floor", "cell_floor", "budget_check"):
        path = job / tables.name_to_file(name)
        try:
            out[name] = pd.read_csv(path, dtype=tables.KEY_DTYPES) if path.is_file() else pd.DataFrame()
        except (OSError, ValueError) as e:
            raise BenchError(f"merge: {path}: unreadable table ({str(e).splitlines()[0]})") from None
    return out


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as `bench.sweep.records.collect` makes them: a missing value None, not NaN (a trial without a value)."""
    rows = frame.to_dict("records")
    for row in rows:
        for key, value in row.items():
            if key == "value" and isinstance(value, float) and math.isnan(value):
                row[key] = None
    return rows


def check(jobs: list[Path], read: list[dict[str, Any]]) -> None:
    """Every refusal of the module docstring, one line each (the first found is raised)."""
    first, m0 = jobs[0], read[0]["manifest"]
    if not m0.get("shared_hash") or not isinstance(m0.get("cell_keys"), dict):
        raise BenchError(f"merge: {first} was run before cells had keys: run its protocol again, then merge")
    seen: dict[str, Path] = {}
    for job, r in zip(jobs, read):
        m = r["manifest"]
        for key in SAME:
            if m.get(key) != m0.get(key):
                theirs, ours = str(m.get(key)), str(m0.get(key))
                raise BenchError(
                    f"merge: {job} and {first} differ in {key} ({theirs[:40]} and {ours[:40]}): "
                    + (
                        "not the same experiment"
                        if key in ("protocol", "shared_hash", "data_fingerprint", "fingerprints")
                        else "every job must run the same protocol file on the same data"
                    )
                )
        if not m.get("finished"):
            raise BenchError(f"merge: the job in {job} has not finished: run it to its end first")
        if m.get("refused"):
            cell, why = next(iter(m["refused"].items()))
            raise BenchError(f"merge: {job}: the budget audit refused {cell} ({why})")
        for cell in m.get("cells") or []:
            if cell in seen:
                raise BenchError(f"merge: cell {cell} was run by two jobs ({seen[cell]} and {job}): keep one")
            seen[cell] = job
        seeds = {int(s) for s in r["finals"]["seed"]} if "seed" in r["finals"] else set()
        planned = set(parse_protocol(m["protocol_text"], str(job)).final_seeds) if m.get("protocol_text") else seeds
        if not seeds <= planned:
            raise BenchError(f"merge: {job} holds final seeds {sorted(seeds - planned)} its protocol does not plan")


def merge(out: str | Path, jobs_given: list[str | Path]) -> dict[str, Any]:
    """Join the jobs' results into ``out`` (a new or empty folder); returns the merged manifest, whose
    ``not_run`` names the planned cells no job ran."""
    out = Path(out)
    if not jobs_given:
        raise BenchError("merge: give the results folders of the jobs to merge")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BenchError(f"merge: {out} exists and is not an empty folder: give a new one")
    jobs = [job_dir(j) for j in jobs_given]
    if len({j.resolve() for j in jobs}) < len(jobs):
        raise BenchError("merge: a results folder is given twice")
    read = [_read(j) for j in jobs]
    check(jobs, read)
    m0 = read[0]["manifest"]
    protocol = parse_protocol(m0["protocol_text"], m0.get("protocol_file") or "manifest").with_data(
        m0["data_fingerprint"]
    )
    full = make_plan(protocol)
    ran = {c for r in read for c in r["manifest"]["cells"]}
    keys = {c: k for r in read for c, k in r["manifest"]["cell_keys"].items()}
    for c in full.cells:
        if c.id in ran and keys.get(c.id) != cell_key(protocol, c):
            raise BenchError(f"merge: {c.id}'s key {keys.get(c.id)} is not its protocol's {cell_key(protocol, c)}")
    plan = replace(full, cells=tuple(c for c in full.cells if c.id in ran))
    records = Records(
        trials=_order([row for r in read for row in _rows(r["trials"])], plan, "trial"),
        finals=_order(
            collapse_evaluations(plan, [row for r in read for row in _rows(r["finals"])]),
            plan,
            "seed",
            protocol.final_seeds,
        ),
    )
    records.history = {c.id: history([t for t in records.trials if t["cell"] == c.id]) for c in plan.cells}
    floor = _floor(jobs, read)
    out.mkdir(parents=True, exist_ok=True)
    for job, r in zip(jobs, read):
        for cell in r["manifest"]["cells"]:
            source = tables.cell_dir(job, cell)
            if source.is_dir():
                shutil.copytree(source, tables.cell_dir(out, cell), dirs_exist_ok=True)
    if floor is not None:
        write_with(out / tables.FLOOR, lambda f: floor.to_csv(f, index=False))
    # a learned-metric cell's own floor comes from the job that ran the cell
    own = [r["cell_floor"] for r in read if not r["cell_floor"].empty]
    if own:
        cell_floor = pd.concat(own, ignore_index=True)
        cell_floor = cell_floor[cell_floor["cell"].isin([c.id for c in plan.cells])]
        write_with(out / tables.CELL_FLOOR, lambda f: cell_floor.to_csv(f, index=False))
    checked = [r["budget_check"] for r in read if not r["budget_check"].empty]
    if checked:
        frame = pd.concat(checked, ignore_index=True)
        write_with(out / tables.BUDGET_CHECK, lambda f: frame.to_csv(f, index=False))
    not_run = [c.id for c in full.cells if c.id not in ran]
    manifest = {
        **m0,
        "cells": [c.id for c in plan.cells],
        "cell_keys": {c.id: keys[c.id] for c in plan.cells},
        "planned_cells": [c.id for c in full.cells],
        "not_run": {c: "no merged job ran it" for c in not_run},
        "merged_from": [
            {
                "results": str(j),
                "storage": r["manifest"].get("storage"),
                "tracking_uri": r["manifest"].get("tracking_uri"),
            }
            for j, r in zip(jobs, read)
        ],
        "hardware": [p for r in read for p in r["manifest"].get("hardware") or []],  # every job's parts
        "storage": None,
        "tracking_uri": None,
        "created": min(str(r["manifest"].get("created")) for r in read),
        "finished": max(str(r["manifest"].get("finished")) for r in read),
    }
    refused = tables.write(plan, records, out, manifest, finished=True)
    if refused:  # the jobs' own audits passed: a refusal here is a table edited since
        cell, why = next(iter(refused.items()))
        raise BenchError(f"merge: the budget audit refused {cell} in the merged tables ({why}); see {out}")
    return json.loads((out / tables.MANIFEST).read_text())


def _order(rows: list[dict[str, Any]], plan: Any, key: str, seeds: list[int] | None = None) -> list[dict[str, Any]]:
    """Rows in the order one sweep writes them: cells in plan order, then slot or final seed order."""
    order = {c.id: i for i, c in enumerate(plan.cells)}
    rank = (lambda v: seeds.index(int(v))) if seeds else (lambda v: int(v))
    return sorted(rows, key=lambda r: (order[r["cell"]], int(r.get("draw", 0)), rank(r[key])))  # draw: tuning.repeats


def _floor(jobs: list[Path], read: list[dict[str, Any]]) -> pd.DataFrame | None:
    """The first job's floor.csv; every other job's must hold the same rows (the same untrained trunks)."""
    frames = [(j, r["floor"]) for j, r in zip(jobs, read) if not r["floor"].empty]
    if not frames:
        return None
    first_job, first = frames[0]
    for job, frame in frames[1:]:
        same = list(frame.columns) == list(first.columns) and len(frame) == len(first)
        if same:
            a, b = (
                f.drop(columns=["protocol_hash"]).sort_values("seed").reset_index(drop=True) for f in (first, frame)
            )
            numeric = a.select_dtypes("number").columns
            same = a.drop(columns=numeric).equals(b.drop(columns=numeric)) and bool(
                ((a[numeric] - b[numeric]).abs() <= 1e-6 + 1e-6 * b[numeric].abs()).all().all()
            )
        if not same:
            raise BenchError(
                f"merge: the floor (the untrained trunks) of {job} differs from {first_job}'s: not the same "
                "protocol, data or code"
            )
    return first
