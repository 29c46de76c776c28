"""`dmlbench plan FILE`: the cells a protocol expands to, what is dropped and why, and the budget.

Nothing is loaded or trained: this is the look before the sweep, showing
that every cell gets the same trials and iterations and about how long the
whole sweep takes on this machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from bench.commands._output import emit, format_option, quiet_option

if TYPE_CHECKING:
    from bench.plan import Plan


def rows(p: Plan) -> list[dict[str, Any]]:
    """One row per cell, planned or dropped; a dropped one carries its reason and no budget."""
    b = p.budget
    out: list[dict[str, Any]] = []
    for c in p.cells:
        e = p.estimates.get(c.id)
        out.append({"cell": c.id, "status": "planned", "trials": b.trials, "folds": b.folds,
                    "iterations_per_run": b.iterations, "seeds": b.seeds, "iterations": b.total_iterations,
                    "samples_max": b.samples_seen, "est_time_s": None if e is None else round(e.mid_s, 1),
                    "reason": ""})
    out += [{"cell": d.cell, "status": "dropped", "reason": d.reason} for d in p.dropped]
    return out


@click.command("plan")
@click.argument("file", type=click.Path(dir_okay=False))
@format_option
@quiet_option
def command(file: str, fmt: str, quiet: bool) -> int:
    """Expand protocol FILE into cells (loss x miner), print dropped pairs, budget and time estimate."""
    from bench.data import check_path
    from bench.plan import format_plan, plan
    from bench.probe import check_live
    from bench.protocol import load_protocol

    protocol = load_protocol(file)
    for side in ("train", "test"):
        check_path(protocol.doc["data"][side])  # no class count for data that does not exist
    p = plan(protocol)
    check_live(p)  # a dead search parameter would waste the budget: refuse before the sweep
    emit(fmt, lambda: format_plan(p), lambda: rows(p))
    return 0
