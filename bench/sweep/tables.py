"""Results tables of a protocol: built from the records, audited, written atomically, read back.

This is the only module that knows the file names under
``results/<protocol>/`` (ARCHITECTURE.md). Tables are rebuilt whole from
the Optuna storage every time (never appended), so an interrupted run that
resumes, or a second worker that finishes last, writes the same tables an
uninterrupted run writes.

The budget audit is here too: a cell whose recorded trials or final runs do
not match the protocol's budget is refused (left out of the summary, named
in the manifest) rather than reported beside cells it cannot be compared
with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.atomic import locked, write_with
from bench.errors import BenchError
from bench.plan import Plan, cell_key, trained_cell
from bench.spec import EvaluationSpec

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

TRIAL_COLUMNS = [
    "protocol_hash",
    "cell_key",
    "cell",
    "loss",
    "miner",
    "trial",
    "state",
    "value",
    "fold_values",
    "params",
    "iterations",
    "samples_seen",
    "wall_time_s",
    "reason",
    "budget_iterations",
    "git_commit",
    "git_dirty",
    "device",
]
TIMING_COLUMNS = ("wall_time_s",)
# keys are text: a key of digits only (or digits, a dot, digits) would otherwise be read back as a number
KEY_DTYPES = {
    "protocol_hash": str,
    "cell_key": str,
    "shared_key": str,
}  # the only columns allowed to differ between reruns of the same protocol


def metric_names(evaluation: EvaluationSpec) -> list[str]:
    """The metric columns, in order: ``recall_at_k`` and ``cmc_at_k`` expand to one column per k."""
    out: list[str] = []
    for m in evaluation.metrics:
        out += [f"{m[:-1]}{k}" for k in evaluation.ks] if m in ("recall_at_k", "cmc_at_k") else [m]
    return out


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


# --------------------------------------------------------------------------- records -> rows


@dataclass
class Records:
    """Rows read from the storage; the runner fills them, tables are derived from them only."""

    trials: list[dict[str, Any]] = field(default_factory=list)
    finals: list[dict[str, Any]] = field(default_factory=list)
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _study(storage: Any, name: str) -> Any:
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def _counted(study: Any) -> list[Any]:
    """Finished trials that hold a slot (stale and surplus ones excluded), by slot."""
    from bench.sweep.tuning import held

    if study is None:
        return []
    slots = held(study.get_trials(deepcopy=False), study.user_attrs.get("slots", math.inf))
    return [t for _, t in sorted(slots.items()) if t.state.is_finished()]


def collect(plan: Plan, storage: Any) -> Records:
    """Every finished trial and final run of the plan's cells, from the Optuna storage (each cell's studies,
    found by its key: a cell trained under an earlier version with the same cell key is read as it was);
    ``protocol_hash`` names the version the tables are of, ``cell_key`` what the row's records are keyed by."""
    from bench.sweep.tuning import extra_seed_study, study_name

    protocol = plan.protocol
    metrics = metric_names(protocol.spec.evaluation)
    primary = protocol.primary
    records = Records()
    draws = plan.budget.draws
    for cell in plan.cells:
        base = {
            "protocol_hash": protocol.hash,
            "cell_key": cell_key(protocol, cell),
            "cell": cell.id,
            "loss": cell.loss,
            "miner": cell.miner or "none",
        }
        trial_rows = []
        for r in range(draws):
            trial_rows += _trial_rows(storage, study_name(protocol, cell, draw=r), base, r if draws > 1 else None)
        records.trials += trial_rows
        records.history[cell.id] = history(trial_rows)
        for r in range(draws):
            studies = [study_name(protocol, cell, finals=True, draw=r)] + [
                extra_seed_study(protocol, cell, r, k) for k in range(plan.budget.seeds_min, plan.budget.seeds)
            ] * plan.budget.adaptive_seeds
            for t in (t for name in studies for t in _counted(_study(storage, name))):
                a = t.user_attrs
                row = {
                    **base,
                    **({"draw": r} if draws > 1 else {}),
                    "seed": a["seed"],
                    "params": _json(a.get("params", {})),
                    "train_fingerprint": a.get("train_fingerprint"),
                    "test_fingerprint": a.get("test_fingerprint"),
                    "iterations": a.get("iterations", 0),
                    "samples_seen": a.get("samples_seen", 0),
                    "wall_time_s": a.get("wall_time_s", math.nan),
                    f"val_{primary}": a.get("val_value"),
                }
                row.update({m: a.get("metrics", {}).get(m, math.nan) for m in metrics})
                row.update({"state": t.state.name, "reason": a.get("reason", ""), **_code(a)})
                row["separate"] = a.get("separate")  # final.mode folds: the fold models scored alone (their mean)
                records.finals.append(row)
    return records


def _trial_rows(storage: Any, name: str, base: dict[str, Any], draw: int | None) -> list[dict[str, Any]]:
    """The rows of one tuning study's counted trials (``draw``: its tuning draw under tuning.repeats)."""
    rows = []
    for t in _counted(_study(storage, name)):
        a = t.user_attrs
        value = t.value if t.state.name == "COMPLETE" else None
        rows.append(
            {
                **base,
                **({"draw": draw} if draw is not None else {}),
                "trial": a["slot"],
                "state": t.state.name,
                "value": value,
                "fold_values": json.dumps(a.get("fold_values", [])),
                "params": _json(t.params),
                "iterations": a.get("iterations", 0),
                "samples_seen": a.get("samples_seen", 0),
                "wall_time_s": a.get("wall_time_s", math.nan),
                "reason": a.get("reason", ""),
                "budget_iterations": a.get("budget_iterations"),
                **_code(a),
            }
        )
    return rows


def expand_evaluations(plan: Plan, finals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Final rows as the tables report them: as recorded, or under final.mode folds two rows per final seed,
    ``<cell>:concatenated`` (the recorded metrics) and ``<cell>:separate`` (its ``separate`` metrics; NaN for a
    seed that failed)."""
    if plan.budget.final_mode != "folds":
        return finals
    metrics = metric_names(plan.protocol.spec.evaluation)
    out = []
    for row in finals:
        concatenated, separate = plan.reported_ids(row["cell"])
        alone = row.get("separate") or {}
        out.append({**row, "cell": concatenated})
        out.append({**row, "cell": separate, **{m: alone.get(m, math.nan) for m in metrics}})
    return out


def _code(attrs: dict[str, Any]) -> dict[str, Any]:
    """The commit a run's code came from, whether it had uncommitted changes, and the hardware it ran on
    (`bench.devices.describe`; None: not recorded)."""
    return {"git_commit": attrs.get("git_commit"), "git_dirty": attrs.get("git_dirty"), "device": attrs.get("device")}


def commits(records: Records) -> dict[str, list[str]]:
    """cell -> the commits its trials and final runs ran (``<sha>+dirty`` for uncommitted changes), sorted."""
    out: dict[str, set[str]] = {}
    for r in records.trials + records.finals:
        if r.get("git_commit"):
            out.setdefault(r["cell"], set()).add(r["git_commit"] + ("+dirty" if r.get("git_dirty") else ""))
    return {cell: sorted(shas) for cell, shas in out.items()}


def history(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Optuna history of one cell's trial rows, in slot order: each value and the best so far (under
    tuning.repeats each draw's own, the rows then naming their ``draw``)."""
    out: list[dict[str, Any]] = []
    best: dict[Any, float] = {}
    for row in trials:
        draw = row.get("draw")
        if row["value"] is not None:
            best[draw] = max(best.get(draw, -math.inf), row["value"])
        out.append(
            {
                **({"draw": draw} if draw is not None else {}),
                "trial": row["trial"],
                "state": row["state"],
                "value": row["value"],
                "best_so_far": best.get(draw),
            }
        )
    return out


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def collapse_evaluations(plan: Plan, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows read back from finals.csv as records again: the inverse of `expand_evaluations` (a merge rebuilds
    the tables from the jobs' rows)."""
    if plan.budget.final_mode != "folds":
        return rows
    metrics = metric_names(plan.protocol.spec.evaluation)

    def key(r: dict[str, Any]) -> tuple[str, int, int]:
        draw = r.get("draw")
        return trained_cell(str(r["cell"])), int(r["seed"]), -1 if draw is None or draw != draw else int(draw)

    alone = {key(r): r for r in rows if str(r["cell"]).endswith(":separate")}
    out = []
    for r in rows:
        if str(r["cell"]).endswith(":concatenated"):
            cell = trained_cell(str(r["cell"]))
            separate = alone.get(key(r), {})
            out.append({**r, "cell": cell, "separate": {m: separate[m] for m in metrics if m in separate}})
    return out


# --------------------------------------------------------------------------- audit


def audit(plan: Plan, records: Records) -> dict[str, str]:
    """cell -> why its budget differs from the plan's, for every cell that cannot be reported.

    The budget is the plan's: ``trials`` trials each given ``folds x
    iterations``, a COMPLETE trial having used all of it; ``seeds`` final
    runs of ``iterations`` each. Under early stopping (``budget.early_stopping``)
    the budget is the maximum: a run may have trained fewer iterations, never
    more. Samples seen may be lower than iterations
    x P x K (dataset-level miners serve smaller batches) but never higher.
    """
    b = plan.budget
    per_final = b.per_final  # under final.mode folds a final seed trains one model per fold
    refused: dict[str, str] = {}
    for cell in plan.cells:
        trials = [r for r in records.trials if r["cell"] == cell.id]
        finals = [r for r in records.finals if r["cell"] == cell.id]
        problems = []
        if len(trials) != b.trial_count_for(cell):
            problems.append(f"{len(trials)} trials recorded, the budget is {b.trial_count_for(cell)}")
        for r in trials:
            # successive halving: each rung's slots their own iterations, the same rungs in every cell
            per_trial = b.folds * b.slot_iterations(r["trial"]) if r["trial"] < b.slots else -1
            if r["budget_iterations"] != per_trial:
                problems.append(f"trial {r['trial']} was given {r['budget_iterations']} iterations, not {per_trial}")
            elif r["iterations"] > per_trial or (
                r["state"] == "COMPLETE" and not b.early_stopping and r["iterations"] != per_trial
            ):
                problems.append(
                    f"trial {r['trial']} ({r['state']}) trained {r['iterations']} iterations, the budget is {per_trial}"
                )
            if r["samples_seen"] > r["iterations"] * b.batch_size:
                problems.append(f"trial {r['trial']} saw {r['samples_seen']} samples, more than its iterations allow")
        if finals and b.adaptive_seeds:
            wanted = seeds_expected(plan, finals)
            if len(finals) != wanted:
                problems.append(
                    f"{len(finals)} final runs recorded, the seed rule (final.seeds: {b.seeds_min} to {b.seeds}, "
                    f"half-width {b.half_width:g}) stops at {wanted} over their values"
                )
        elif finals and len(finals) != b.final_count:
            problems.append(
                f"{len(finals)} final runs recorded, the budget is {b.seeds} seeds"
                + (f" x {b.draws} tuning draws" if b.draws > 1 else "")
            )
        for r in finals:
            if r["iterations"] > per_final or (
                r["state"] == "COMPLETE" and not b.early_stopping and r["iterations"] != per_final
            ):
                problems.append(
                    f"final seed {r['seed']} trained {r['iterations']} iterations, "
                    f"{'the most is' if b.early_stopping else 'not'} {per_final}"
                )
            if r["samples_seen"] > r["iterations"] * b.batch_size:
                problems.append(f"final seed {r['seed']} saw more samples than its iterations allow")
        if problems:
            refused[cell.id] = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
    return refused


def seed_values(plan: Plan, finals: list[dict[str, Any]], draw: int | None) -> list[float | None]:
    """One cell's (and tuning draw's) primary metric by final seed, in seed order: None for a failed seed."""
    order = plan.protocol.final_seeds
    rows = sorted((r for r in finals if draw is None or r.get("draw", 0) == draw), key=lambda r: order.index(r["seed"]))
    primary = plan.protocol.primary
    return [r[primary] if r["state"] == "COMPLETE" else None for r in rows]


def seeds_expected(plan: Plan, finals: list[dict[str, Any]]) -> int:
    """The final runs a cell's records should hold once its seeds are done: ``final_count``, or under a seed
    range (`bench.plan.seeds`) what the rule asks for over the values recorded, tuning draw by draw."""
    from bench.plan.seeds import seeds_wanted

    b = plan.budget
    if not b.adaptive_seeds:
        return b.final_count
    return sum(
        seeds_wanted(seed_values(plan, finals, r if b.draws > 1 else None), b.seeds_min, b.seeds, b.half_width)
        for r in range(b.draws)
    )


# --------------------------------------------------------------------------- tables


def t_interval(values: Iterable[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval over seeds; NaN bounds with fewer than two values.

    The project's one interval (`bench.stats.t_interval`), so summary.csv and the reports agree.
    """
    from bench.stats import t_interval as interval

    iv = interval([math.nan if v is None else v for v in values], level)
    return iv.mean, iv.low, iv.high


def _with_draw(columns: list[str], before: str) -> list[str]:
    i = columns.index(before)
    return [*columns[:i], "draw", *columns[i:]]


def draw_means(rows: Iterable[dict[str, Any]], metric: str) -> list[float]:
    """Under tuning.repeats, each tuning draw's mean of ``metric`` over its final seeds, in draw order: the
    units a cell's interval and tests are over (docs/METHODS.md, *Tuning noise*)."""
    by: dict[int, list[float]] = {}
    for r in rows:
        v = r[metric]
        by.setdefault(int(r["draw"]), []).append(math.nan if v is None else float(v))
    return [float(np.mean(v)) for _, v in sorted(by.items())]


def tables(plan: Plan, records: Records, refused: dict[str, str]) -> dict[str, pd.DataFrame]:
    """trials, finals and summary as DataFrames; the summary has a row only for complete, unrefused cells."""
    protocol = plan.protocol
    metrics = metric_names(protocol.spec.evaluation)
    primary = protocol.primary
    draws = plan.budget.draws > 1  # tuning.repeats: a ``draw`` column, intervals over the draws' means
    trials = pd.DataFrame(records.trials, columns=_with_draw(TRIAL_COLUMNS, "trial") if draws else TRIAL_COLUMNS)
    final_columns = [
        "protocol_hash",
        "cell_key",
        "cell",
        "loss",
        "miner",
        *(["draw"] if draws else []),
        "seed",
        "params",
        "train_fingerprint",
        "test_fingerprint",
        "iterations",
        "samples_seen",
        "wall_time_s",
        f"val_{primary}",
        *metrics,
        "state",
        "reason",
        "git_commit",
        "git_dirty",
        "device",
    ]
    reported = expand_evaluations(plan, records.finals)
    finals = pd.DataFrame(reported, columns=final_columns)
    rows = []
    for cell in plan.cells:
        if cell.id in refused:
            continue
        cell_trials = [r for r in records.trials if r["cell"] == cell.id]
        no_winner = len(cell_trials) == plan.budget.trial_count_for(cell) and not any(
            r["state"] == "COMPLETE" for r in cell_trials
        )
        cell_records = [r for r in records.finals if r["cell"] == cell.id]
        if len(cell_records) != seeds_expected(plan, cell_records) and not no_winner:
            continue  # not finished: nothing to summarise yet
        for row_id in plan.reported_ids(cell.id):
            cell_finals = [r for r in reported if r["cell"] == row_id]
            done = [r for r in cell_finals if r["state"] == "COMPLETE"]
            row = {
                "cell": row_id,
                "loss": cell.loss,
                "miner": cell.miner or "none",
                "n_trials": len(cell_trials),
                "n_seeds": len(done),
                "n_failed": sum(r["state"] == "FAIL" for r in cell_finals),
                "budget_iterations": plan.budget.total_iterations,
                "iterations": sum(r["iterations"] for r in cell_trials + cell_finals),
                "samples_seen": sum(r["samples_seen"] for r in cell_trials + cell_finals),
            }
            for m in metrics:
                mean, low, high = t_interval(draw_means(done, m) if draws else [r[m] for r in done])
                row.update({f"{m}_mean": mean, f"{m}_ci_low": low, f"{m}_ci_high": high})
            row["params"] = cell_finals[0]["params"] if cell_finals else "{}"  # no trial completed: nothing retrained
            row[f"val_{primary}"] = cell_finals[0][f"val_{primary}"] if cell_finals else math.nan
            rows.append(row)
    summary_columns = [
        "cell",
        "loss",
        "miner",
        "n_trials",
        "n_seeds",
        "n_failed",
        "budget_iterations",
        "iterations",
        "samples_seen",
        *[f"{m}_{s}" for m in metrics for s in ("mean", "ci_low", "ci_high")],
        "params",
        f"val_{primary}",
    ]
    return {"trials": trials, "finals": finals, "summary": pd.DataFrame(rows, columns=summary_columns)}


# --------------------------------------------------------------------------- files


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


def audit_finished(plan: Plan, records: Records) -> dict[str, str]:
    """The audit of cells whose final runs are all recorded (a cell still running is not refused yet)."""
    refused = audit(plan, records)
    finished = {r["cell"] for r in records.finals}
    complete = {
        c for c in finished if len(rows := [r for r in records.finals if r["cell"] == c]) >= seeds_expected(plan, rows)
    }
    return {c: why for c, why in refused.items() if c in complete or c in finished}


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
