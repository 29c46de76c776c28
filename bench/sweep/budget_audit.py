"""The budget audit: a cell whose recorded trials or final runs do not match the protocol's budget is refused.

A refused cell is left out of the summary and named in the manifest rather
than reported beside cells it cannot be compared with (`bench.sweep.tables.write`).
"""

from __future__ import annotations

from typing import Any

from bench.plan import Plan
from bench.plan.seeds import seeds_wanted
from bench.sweep.records import Records


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
    b = plan.budget
    if not b.adaptive_seeds:
        return b.final_count
    return sum(
        seeds_wanted(seed_values(plan, finals, r if b.draws > 1 else None), b.seeds_min, b.seeds, b.half_width)
        for r in range(b.draws)
    )


def audit_finished(plan: Plan, records: Records) -> dict[str, str]:
    """The audit of cells whose final runs are all recorded (a cell still running is not refused yet)."""
    refused = audit(plan, records)
    finished = {r["cell"] for r in records.finals}
    complete = {
        c for c in finished if len(rows := [r for r in records.finals if r["cell"] == c]) >= seeds_expected(plan, rows)
    }
    return {c: why for c, why in refused.items() if c in complete or c in finished}
