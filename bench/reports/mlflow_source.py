"""A leaderboard's tables rebuilt from an MLflow experiment instead of a results directory.

A team that shares one tracking server may have the MLflow records but not
the worker's ``results/<protocol>/``. Everything a report needs is in those
records: each cell run carries the protocol file it ran, each trial run its
hyperparameters, state and validation score, each final run its seed and
test metrics, the first seed its pair distances (and 2-D embedding).

The records are turned into the same ``bench.sweep.records.Records`` the runner
builds from its Optuna storage, then audited and tabulated by the same
functions, so a leaderboard from MLflow and one from the results directory
of the same sweep are the same table. Two versions of a protocol (two
hashes) in one experiment are never pooled: the caller picks one, and its
cells' runs are found by their cell keys (`bench.plan.cell_key`, the head of
``dmlbench.key``), so a cell trained under an earlier version that shares
the cell is read from those runs, and a cell the version dropped is not.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from bench.errors import BenchError
from bench.plan import cell_key
from bench.plan import plan as make_plan
from bench.protocol import parse_protocol
from bench.reports.source import Results
from bench.stores import tracking
from bench.stores.urls import DEFAULT_DIR, parse, redact, sqlite_path, sqlite_url, with_connect_timeout
from bench.sweep import tables
from bench.sweep.budget_audit import audit_finished
from bench.sweep.budget_check import columns
from bench.sweep.final_run import SEPARATE_PREFIX
from bench.sweep.frames import tables as build_tables
from bench.sweep.records import Records, history, metric_names

PREFIX = "dmlbench/"
HASH_TAG = "dmlbench.protocol_hash"


def _client(tracking_uri: str | None) -> Any:
    """A client on an existing store: reading must not leave a new, empty SQLite file behind."""
    given = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not given:
        given = str(Path(DEFAULT_DIR) / tracking.DEFAULT_FILE)
    if not parse(given).scheme:
        path = Path(given).expanduser()
        path = path / tracking.DEFAULT_FILE if path.is_dir() else path
        if not path.is_file():
            raise BenchError(f"no MLflow store at {path} (give the one `dmlbench run` recorded to with --tracking-uri)")
        given = sqlite_url(path)
    elif (stored := sqlite_path(given)) is not None and not stored.is_file():
        raise BenchError(f"no MLflow store at {stored}")
    from mlflow.tracking import MlflowClient

    given = with_connect_timeout(given)
    tracking.check_reachable(given)
    try:
        client = MlflowClient(tracking_uri=given)
        client.search_experiments(max_results=1)  # opens the store: a file that is no database fails here
    except Exception as e:
        raise BenchError(f"cannot read MLflow tracking store {redact(given)!r}: {str(e).splitlines()[0]}") from None
    return client


def _experiment(client: Any, name: str) -> Any:
    """The experiment by its name, with or without the ``dmlbench/`` prefix the runner gives it."""
    try:
        for candidate in (name, PREFIX + name):
            found = client.get_experiment_by_name(candidate)
            if found is not None:
                return found
        known = [e.name for e in client.search_experiments() if e.name.startswith(PREFIX)]
    except Exception as e:  # an unreachable server or an unreadable file is the user's URI
        raise BenchError(f"cannot read MLflow tracking store {client.tracking_uri!r}: {str(e).splitlines()[0]}") from e
    raise BenchError(
        f"no MLflow experiment {name!r} in {client.tracking_uri} "
        f"(dmlbench experiments there: {', '.join(known) or 'none'})"
    )


def _pick_hash(runs: list[Any], wanted: str | None, experiment: str) -> str:
    hashes = sorted({r.data.tags[HASH_TAG] for r in runs if HASH_TAG in r.data.tags})
    if not hashes:
        raise BenchError(f"MLflow experiment {experiment!r} holds no dmlbench runs")
    if wanted:
        chosen = [h for h in hashes if h.startswith(wanted)]
        if len(chosen) != 1:
            raise BenchError(
                f"--protocol-hash {wanted!r} matches {len(chosen)} of the protocol versions in "
                f"{experiment!r} ({', '.join(h[:12] for h in hashes)})"
            )
        return chosen[0]
    if len(hashes) > 1:
        raise BenchError(
            f"MLflow experiment {experiment!r} holds {len(hashes)} versions of the protocol "
            f"({', '.join(h[:12] for h in hashes)}); choose one with --protocol-hash"
        )
    return hashes[0]


def _protocol(client: Any, cell_runs: list[Any], protocol_hash: str) -> Any:
    """The protocol file a cell run recorded, parsed; its hash must be the one the runs carry."""
    for run in cell_runs:
        for item in client.list_artifacts(run.info.run_id):
            if not item.path.endswith(".yaml"):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                local = client.download_artifacts(run.info.run_id, item.path, tmp)
                protocol = parse_protocol(Path(local).read_text(), source=f"MLflow run {run.info.run_id}/{item.path}")
            if protocol.hash != protocol_hash:
                raise BenchError(
                    f"MLflow run {run.info.run_id}: its protocol file hashes to {protocol.hash[:12]}, "
                    f"its runs say {protocol_hash[:12]}"
                )
            return protocol
    raise BenchError(f"no cell run of protocol {protocol_hash[:12]} recorded its protocol file")


def keyed_runs(runs: list[Any], plan: Any) -> list[Any]:
    """The runs of the plan's cells under their current keys (``<cell key>/<cell>[/...]``) and of its floor
    (``<shared key>/floor/...``), whichever protocol version recorded them."""
    heads = {f"{cell_key(plan.protocol, c)}/{c.id}" for c in plan.cells}
    floor = f"{plan.protocol.shared_key}/floor/"

    def mine(key: str) -> bool:
        return key.startswith(floor) or "/".join(key.split("/")[:2]) in heads  # a cell id holds no "/"

    return [r for r in runs if mine(r.data.tags.get("dmlbench.key", ""))]


def _number(data: Any, name: str, default: float = math.nan) -> float:
    return float(data.metrics[name]) if name in data.metrics else default


def records(runs: list[Any], plan: Any) -> Any:
    """`Records` as `bench.sweep.records.collect` would read them from Optuna, here from MLflow runs.

    A run without a ``state`` tag never finished (a worker was stopped in
    it) and is not counted, as an unfinished Optuna trial is not. MLflow
    does not record the budget a trial was given; every trial of one
    protocol version is given the same, so the plan's is used.
    """
    protocol = plan.protocol
    primary = protocol.primary
    metrics = metric_names(protocol.spec.evaluation)
    per_trial = plan.budget.folds * plan.budget.iterations
    by_kind: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        tags = run.data.tags
        if "state" in tags and "cell" in tags:
            by_kind[tags.get("kind", "")][tags["cell"]].append(run)
    out = Records()
    draws = plan.budget.draws > 1  # tuning.repeats: runs of draw r > 0 are tagged ``draw``

    def draw(run: Any) -> int:
        return int(run.data.tags.get("draw", 0))

    for cell in plan.cells:
        base = {"protocol_hash": protocol.hash, "cell": cell.id, "loss": cell.loss, "miner": cell.miner or "none"}
        folds: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
        for run in by_kind["fold"][cell.id]:
            if f"val_{primary}" in run.data.metrics:
                folds[draw(run), int(run.data.tags["trial"])].append(
                    (int(run.data.tags["fold"]), _number(run.data, f"val_{primary}"))
                )
        trials: dict[tuple[int, int], dict[str, Any]] = {}
        for run in sorted(by_kind["trial"][cell.id], key=lambda r: (draw(r), int(r.data.tags["trial"]))):
            slot, state, d = int(run.data.tags["trial"]), run.data.tags["state"], run.data
            value = _number(d, f"val_{primary}") if state == "COMPLETE" else None
            key = (draw(run), slot)
            trials[key] = {
                **base,
                **({"draw": key[0]} if draws else {}),
                "trial": slot,
                "state": state,
                "value": value,
                "fold_values": json.dumps([v for _, v in sorted(folds[key])]),
                "params": json.dumps({k: _param(v) for k, v in d.params.items()}, sort_keys=True),
                "iterations": int(_number(d, "iterations", 0)),
                "samples_seen": int(_number(d, "samples_seen", 0)),
                "wall_time_s": _number(d, "wall_time_s"),
                "reason": d.tags.get("reason", ""),
                # successive halving: each slot its rung's iterations (`Budget.slot_iterations`), as the runner gives
                "budget_iterations": plan.budget.folds * plan.budget.slot_iterations(slot)
                if plan.budget.rungs and slot < plan.budget.slots
                else per_trial,
                "device": d.tags.get("dmlbench.device"),
            }
            out.trials.append(trials[key])
        out.history[cell.id] = history(list(trials.values()))
        for run in sorted(by_kind["final"][cell.id], key=lambda r: (draw(r), int(r.data.tags["seed"]))):
            d = run.data
            chosen = trials.get((draw(run), int(d.params.get("best_trial", -1))), {})
            row = {
                **base,
                **({"draw": draw(run)} if draws else {}),
                "seed": int(d.tags["seed"]),
                "params": chosen.get("params", "{}"),
                "train_fingerprint": d.tags.get("dmlbench.train_fingerprint"),
                "test_fingerprint": d.tags.get("dmlbench.test_fingerprint"),
                "iterations": int(_number(d, "iterations", 0)),
                "samples_seen": int(_number(d, "samples_seen", 0)),
                "wall_time_s": _number(d, "wall_time_s"),
                f"val_{primary}": chosen.get("value"),
            }
            row.update({m: _number(d, m) for m in metrics})
            row.update({"state": d.tags["state"], "reason": d.tags.get("reason", "")})
            row["device"] = d.tags.get("dmlbench.device")
            # final.mode folds: the fold models scored alone, logged with the prefix (bench.sweep.final_run)
            row["separate"] = {m: _number(d, SEPARATE_PREFIX + m) for m in metrics if SEPARATE_PREFIX + m in d.metrics}
            out.finals.append(row)
    return out


def _param(text: str) -> Any:
    """MLflow stores parameters as strings; Optuna's were numbers or category names."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _download(client: Any, runs: list[Any], root: Path, plan: Any) -> None:
    """The first final seed's report artifacts of each cell, to ``root/artifacts/<cell>/``."""
    first = str(plan.protocol.final_seeds[0])
    planned = {c.id for c in plan.cells}
    for run in runs:
        tags = run.data.tags
        if (
            tags.get("kind") != "final"
            or tags.get("seed") != first
            or tags.get("draw", "0") != "0"
            or tags.get("cell") not in planned
        ):
            continue  # a tag naming no planned cell (``../../x``) never becomes a path
        for item in client.list_artifacts(run.info.run_id):
            if item.path in (tables.PAIR_DISTANCES, tables.EMBEDDING_2D):
                directory = tables.cell_dir(root, tags["cell"])
                directory.mkdir(parents=True, exist_ok=True)
                client.download_artifacts(run.info.run_id, item.path, str(directory))


def load(
    experiment: str, out: str | Path, tracking_uri: str | None = None, protocol_hash: str | None = None
) -> Results:
    """The `Results` of one protocol version recorded in an MLflow experiment; artifacts go under ``out``."""
    client = _client(tracking_uri)
    found = _experiment(client, experiment)
    everything = tracking.search_all(client, found.experiment_id)  # active runs only: a --redo's are gone
    chosen = _pick_hash(everything, protocol_hash, found.name)
    runs = [r for r in everything if r.data.tags.get(HASH_TAG) == chosen]
    protocol = _protocol(client, [r for r in runs if r.data.tags.get("kind") == "cell"], chosen)
    data = next((d for r in runs if (d := r.data.tags.get("dmlbench.data_fingerprint"))), "")
    plan = make_plan(protocol.with_data(data) if data else protocol)
    runs = keyed_runs(everything, plan) if data else runs
    recs = records(runs, plan)
    if not recs.finals:
        raise BenchError(f"MLflow experiment {found.name!r} holds no finished final run of protocol {chosen[:12]}")
    refused = audit_finished(plan, recs)
    frames = build_tables(plan, recs, refused)
    root = Path(out)
    _download(client, runs, root, plan)
    tables.write_histories(root, recs.history)
    manifest = _manifest(runs, plan, refused, found.name)
    res = Results(
        root,
        manifest,
        frames["finals"],
        frames["trials"],
        frames["summary"],
        None,
        floor_frame(runs, plan),
        budget_frame(runs, plan),
        cell_floor_frame(runs, plan),
    )
    if not res.cells:
        raise BenchError(
            f"MLflow experiment {found.name!r}: no cell of protocol {chosen[:12]} has a completed, "
            "budget-audited final run"
        )
    return res


def floor_frame(runs: list[Any], plan: Any) -> pd.DataFrame:
    """floor.csv's rows from the runs tagged ``kind: floor`` (one per final seed), in the seeds' order."""
    protocol = plan.protocol
    metrics = metric_names(protocol.spec.evaluation)
    rows = {
        int(r.data.tags["seed"]): {
            "protocol_hash": protocol.hash,
            "seed": int(r.data.tags["seed"]),
            **{m: r.data.metrics.get(m, float("nan")) for m in metrics},
        }
        for r in runs
        if r.data.tags.get("kind") == "floor" and "seed" in r.data.tags
    }
    return pd.DataFrame(
        [rows[s] for s in protocol.final_seeds if s in rows], columns=["protocol_hash", "seed", *metrics]
    )


def cell_floor_frame(runs: list[Any], plan: Any) -> pd.DataFrame | None:
    """cell_floor.csv's rows from the runs tagged ``kind: cell_floor`` (a learned-metric cell's own floor per
    final seed, `bench.sweep.floor`), in the plan's cell order and the seeds' order; None when there are none."""
    protocol = plan.protocol
    metrics = metric_names(protocol.spec.evaluation)
    planned = {c.id: i for i, c in enumerate(plan.cells)}
    keys = {c.id: cell_key(protocol, c) for c in plan.cells}
    rows = {
        (r.data.tags["cell"], int(r.data.tags["seed"])): {
            "protocol_hash": protocol.hash,
            "cell_key": keys[r.data.tags["cell"]],
            "cell": r.data.tags["cell"],
            "seed": int(r.data.tags["seed"]),
            **{m: r.data.metrics.get(m, float("nan")) for m in metrics},
        }
        for r in runs
        if r.data.tags.get("kind") == "cell_floor" and r.data.tags.get("cell") in planned and "seed" in r.data.tags
    }
    if not rows:
        return None
    order = sorted(
        rows, key=lambda k: (planned[k[0]], protocol.final_seeds.index(k[1]) if k[1] in protocol.final_seeds else 0)
    )
    return pd.DataFrame([rows[k] for k in order], columns=["protocol_hash", "cell_key", "cell", "seed", *metrics])


def budget_frame(runs: list[Any], plan: Any) -> pd.DataFrame | None:
    """budget_check.csv's rows from the finished runs tagged ``kind: budget_check``; None when there are none."""
    protocol = plan.protocol
    planned = {c.id: i for i, c in enumerate(plan.cells)}
    rows = []
    for run in runs:
        tags, d = run.data.tags, run.data
        if tags.get("kind") != "budget_check" or "state" not in tags or tags.get("cell") not in planned:
            continue
        rows.append(
            {
                "protocol_hash": protocol.hash,
                "cell": tags["cell"],
                "seed": int(tags["seed"]),
                "multiple": int(tags["multiple"]),
                "iterations": int(_number(d, "iterations", 0)),
                "samples_seen": int(_number(d, "samples_seen", 0)),
                "wall_time_s": _number(d, "wall_time_s"),
                **{m: _number(d, m) for m in metric_names(protocol.spec.evaluation)},
                "state": tags["state"],
                "reason": tags.get("reason", ""),
                "git_commit": tags.get("dmlbench.git_commit"),
                "device": tags.get("dmlbench.device"),
            }
        )
    if not rows:
        return None
    rows.sort(key=lambda r: (r["multiple"], planned[r["cell"]], r["seed"]))
    return pd.DataFrame(rows, columns=columns(protocol))


def _manifest(runs: list[Any], plan: Any, refused: dict[str, str], experiment: str) -> dict[str, Any]:
    """What the runner's manifest.json says, from the tags every run carries and the protocol file."""
    protocol, tags = plan.protocol, runs[0].data.tags
    fingerprints: dict[str, Any] = {
        k: tags[f"dmlbench.{k}_fingerprint"] for k in ("split", "train", "test") if f"dmlbench.{k}_fingerprint" in tags
    }
    folds = _fold_fingerprints(runs)
    if folds:
        fingerprints["folds"] = folds
    starts = [r.info.start_time for r in runs if r.info.start_time]
    ends = [r.info.end_time for r in runs if r.info.end_time]
    return {
        "protocol": protocol.name,
        "protocol_hash": protocol.hash,
        "primary_metric": protocol.primary,
        "metrics": metric_names(protocol.spec.evaluation),
        "fingerprints": dict(sorted(fingerprints.items())),
        "budget": dict(sorted(plan.budget.record().items())),
        "cells": [c.id for c in plan.cells],
        "refused": refused,
        "git_commit": tags.get("dmlbench.git_commit"),
        "git_dirty": tags.get("dmlbench.git_dirty") == "true",
        "source": f"MLflow experiment {experiment}",
        "protocol_text": protocol.text,  # the search ranges and fixed params reports re-plan from
        "created": _iso(min(starts)) if starts else None,
        "finished": _iso(max(ends)) if ends else None,
    }


def _fold_fingerprints(runs: list[Any]) -> list[dict[str, str]]:
    """Each validation fold's train and validation class fingerprints, from the fold runs' tags."""
    folds: dict[int, dict[str, str]] = {}
    for run in runs:
        t = run.data.tags
        if t.get("kind") == "fold" and "train_fingerprint" in t:
            folds[int(t["fold"])] = {"train": t["train_fingerprint"], "validation": t.get("validation_fingerprint", "")}
    return [folds[k] for k in sorted(folds)]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds")
