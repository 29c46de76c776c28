"""Rows from the records: every finished trial and final run of a plan's cells, read from the Optuna storage.

The tables are derived from these rows only (`bench.sweep.frames`), and the
budget audit checks them (`bench.sweep.budget_audit`); a report rebuilt from
MLflow alone (`bench.reports.mlflow_source`) fills the same `Records`. Under
``final.mode: folds`` a final seed is one record and two reported rows
(`expand_evaluations`, `collapse_evaluations`).

Optuna and `bench.sweep.tuning` are imported where the storage is read, so
that reading tables (reports) never imports the trainer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from bench.plan import Plan, cell_key, trained_cell
from bench.spec import EvaluationSpec
from bench.sweep.seeds import for_draw


def metric_names(evaluation: EvaluationSpec) -> list[str]:
    """The metric columns, in order: ``recall_at_k`` and ``cmc_at_k`` expand to one column per k."""
    out: list[str] = []
    for m in evaluation.metrics:
        out += [f"{m[:-1]}{k}" for k in evaluation.ks] if m in ("recall_at_k", "cmc_at_k") else [m]
    return out


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
            seeds = for_draw(protocol, r).final_seeds
            # (study, index of its slot 0 in final.seeds): the first seeds share the finals study, slot = index
            studies = [(study_name(protocol, cell, finals=True, draw=r), 0)] + [
                (extra_seed_study(protocol, cell, r, k), k) for k in range(plan.budget.seeds_min, plan.budget.seeds)
            ] * plan.budget.adaptive_seeds
            for t, index in (
                (t, first + t.user_attrs["slot"]) for name, first in studies for t in _counted(_study(storage, name))
            ):
                a = t.user_attrs
                # a seed given back (interrupted) is failed before its replacement is enqueued: read in between,
                # or left so by a kill in between, it holds its slot with none of a run's attributes
                given_back = "seed" not in a
                row = {
                    **base,
                    **({"draw": r} if draws > 1 else {}),
                    "seed": seeds[index] if given_back else a["seed"],
                    "params": _json(a.get("params", {})),
                    "train_fingerprint": a.get("train_fingerprint"),
                    "test_fingerprint": a.get("test_fingerprint"),
                    "iterations": a.get("iterations", 0),
                    "samples_seen": a.get("samples_seen", 0),
                    "wall_time_s": a.get("wall_time_s", math.nan),
                    f"val_{primary}": a.get("val_value"),
                }
                row.update({m: a.get("metrics", {}).get(m, math.nan) for m in metrics})
                reason = "given back (interrupted) before it recorded" if given_back else a.get("reason", "")
                row.update({"state": t.state.name, "reason": reason, **_code(a)})
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
                # under early stopping each fold's best checkpoint: whether patience or the maximum ended it
                **({"best_iterations": json.dumps(a["best_iterations"])} if "best_iterations" in a else {}),
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
