"""The trials, finals and summary tables of a plan as DataFrames, built from its records only.

A summary row is a complete, unrefused cell: its final seeds' metrics as
Student's t intervals (`bench.stats.t_interval`), under ``tuning.repeats``
over the tuning draws' means. The file names and writing are
`bench.sweep.tables`'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from bench.plan import Plan
from bench.stats import t_interval as interval
from bench.stats import within
from bench.sweep.budget_audit import seeds_expected
from bench.sweep.records import Records, expand_evaluations, metric_names

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


def t_interval(values: Iterable[float], metric: str, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval over seeds of ``metric``; NaN bounds with fewer than two values.

    The project's one interval (`bench.stats.t_interval`), clipped to the metric's range as every report
    clips it (`bench.stats.within`: a symmetric interval near 0 or 1 reaches values no run can take), so
    summary.csv and the reports agree.
    """
    iv = within(interval([math.nan if v is None else v for v in values], level), metric)
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
    trial_columns = _with_draw(TRIAL_COLUMNS, "trial") if draws else list(TRIAL_COLUMNS)
    if protocol.spec.training.early_stopping:  # each fold's best checkpoint (bench.reports.maximum reads it)
        trial_columns.insert(trial_columns.index("budget_iterations") + 1, "best_iterations")
    trials = pd.DataFrame(records.trials, columns=trial_columns)
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
                mean, low, high = t_interval(draw_means(done, m) if draws else [r[m] for r in done], m)
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
