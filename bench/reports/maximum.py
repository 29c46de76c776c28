"""Which cells a training maximum stopped rather than their own validation score (under early stopping).

Under ``training.early_stopping`` a run stops when its validation score has
not improved for ``patience`` checks, or at its maximum (the protocol's
``max_iterations``, or under successive halving its rung's iterations),
whichever comes first. A final seed has no validation classes: it trains as
long as the cell's chosen trial (the best trial of the top rung) trained to
its best checkpoint (`bench.sweep.tuning.final_iterations`). So a cell is
*converged* only when its chosen trial stopped on its patience: when the
maximum ended it, the finals' length is the maximum's, and the cell might
have gone on gaining. The table then is not the converged table it claims
to be, and the reports say so, cell by cell.

The rule, per fold of the chosen trial: the maximum ended it when its best
checkpoint plus ``patience x check_every`` lies beyond the fold's maximum
(its patience had not run out when the maximum came). That needs each
fold's best checkpoint (trials.csv's ``best_iterations``); tables without
it (older runs, MLflow) fall back to the iterations trained, which tell it
exactly for one fold (the fold trained its whole maximum) and for several
only when every fold did; otherwise the cell is named as not known.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from bench.plan import trained_cell
from bench.reports.source import Results


@dataclass(frozen=True)
class Ended:
    """How the chosen trial of one cell (of each tuning draw under tuning.repeats) ended."""

    cell: str
    maximum: int  # the chosen trial's maximum per fold: the protocol's, or its rung's
    by_maximum: int  # folds (over every draw) that the maximum ended
    folds: int  # folds counted (over every draw)
    unknown: int = 0  # folds whose ending the tables cannot tell

    @property
    def hit(self) -> bool:
        return self.by_maximum > 0

    def describe(self) -> str:
        """One clause for the cell's notes."""
        if self.hit:
            if self.folds == 1:
                which = "its chosen trial"
            elif self.by_maximum == self.folds:
                which = f"every fold of its chosen trial ({self.folds})"
            else:
                which = f"{self.by_maximum} of its chosen trial's {self.folds} folds"
            return (
                f"ended by the maximum: {which} reached {self.maximum:,} iterations before its patience ran out "
                "(its validation score might still have risen), so the maximum bounds its finals' length"
            )
        return (
            f"how its chosen trial ended is not recorded for {self.unknown} of {self.folds} folds (no "
            "best_iterations column): whether the maximum ended them is unknown"
        )


def stopping(res: Results) -> tuple[int, int] | None:
    """(patience, check_every) of the run's early stopping; None without early stopping or when unknown."""
    budget = res.manifest.get("budget")
    if isinstance(budget, dict) and budget.get("early_stopping") is False:
        return None
    plan = res.plan
    spec = plan.protocol.spec.training.early_stopping if plan is not None else None
    return (spec.patience, spec.check_every) if spec else None


def _fold_list(value: Any) -> list[int] | None:
    if isinstance(value, list):
        return [int(v) for v in value]
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return [int(v) for v in parsed] if isinstance(parsed, list) and parsed else None


def _chosen(trials: pd.DataFrame) -> pd.Series | None:
    """The trial the finals came from: the best COMPLETE trial of the largest budget (successive halving's top
    rung; every trial without halving), ties to the lower trial number, as the tuner chose it."""
    done = trials[trials["state"].astype(str) == "COMPLETE"] if "state" in trials else trials
    if done.empty:
        return None
    budget = pd.to_numeric(done["budget_iterations"], errors="coerce")
    top = done[budget == budget.max()]
    value = pd.to_numeric(top["value"], errors="coerce")
    order = top.assign(_v=value.fillna(-math.inf)).sort_values(["_v", "trial"], ascending=[False, True])
    return order.iloc[0]


def ended(res: Results) -> dict[str, Ended]:
    """Every reported cell's `Ended` under early stopping (empty without it, or without a trials table)."""
    rule = stopping(res)
    trials = res.trials
    if rule is None or trials is None or trials.empty or not {"cell", "iterations", "budget_iterations"} <= set(trials):
        return {}
    patience, every = rule
    budget = res.manifest.get("budget")
    n_folds = int(budget.get("folds", 1)) if isinstance(budget, dict) else 1
    out: dict[str, Ended] = {}
    for cell in dict.fromkeys(trained_cell(c) for c in res.reported_cells):
        mine = trials[trials["cell"].astype(str) == cell]
        groups = [g for _, g in mine.groupby("draw")] if "draw" in mine else [mine]
        hit = folds = unknown = maximum = 0
        for group in groups:
            best = _chosen(group)
            if best is None:
                continue
            per_fold = int(best["budget_iterations"]) // n_folds
            maximum = max(maximum, per_fold)
            checkpoints = _fold_list(best.get("best_iterations"))
            folds += n_folds
            if checkpoints is not None:
                hit += sum(b + patience * every > per_fold for b in checkpoints)
            elif int(best["iterations"]) >= int(best["budget_iterations"]):
                hit += n_folds  # every fold trained its whole maximum
            elif n_folds > 1:
                unknown += n_folds
        if folds:
            out[cell] = Ended(cell, maximum, hit, folds, unknown)
    return out


def sentence(found: dict[str, Ended]) -> str:
    """The footer's count: how many cells a maximum ended, which, and those not known."""
    hit = [e for e in found.values() if e.hit]
    text = (
        f"ended by a maximum rather than by early stopping: {len(hit)} of {len(found)} cells"
        + (f" ({', '.join(f'{e.cell} at {e.maximum:,}' for e in hit)})" if hit else "")
        + " (the chosen trial of each cell, whose best checkpoint sets the finals' length)"
    )
    unknown = [e.cell for e in found.values() if e.unknown and not e.hit]
    if unknown:
        text += f"; not known for {', '.join(unknown)} (their tables lack each fold's best checkpoint)"
    return text
