"""`dmlbench plan FILE`: the cells a protocol expands to, what is dropped and why, and the budget.

Nothing is loaded or trained: this is the look before the sweep, showing
that every cell gets the same trials and iterations and about how long the
whole sweep takes on this machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from bench.commands._output import emit, format_option, quiet_option
from bench.errors import BenchError

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
                    "method_ms": round(p.method_s[c.id] * 1000, 3) if c.id in p.method_s else None,
                    "reason": ""})
    out += [{"cell": d.cell, "status": "dropped", "reason": d.reason} for d in p.dropped]
    return out


def _not_nan(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and value != value:  # NaN passes every range comparison
        raise click.BadParameter("expected a number of milliseconds, got nan")
    return value


@click.command("plan")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--step-ms", type=click.FloatRange(min=0, max=3.6e6, min_open=True), default=None, callback=_not_nan,
              help="a training step's time measured on your device (benchmarks/bench_trunk_step.py), "
                   "at the protocol's batch and image size: replaces the built-in cost table")
@click.option("--budget-check", "check_multiple", type=click.IntRange(min=0, max=1000), default=0, show_default=True,
              help="add a budget check at this whole multiple of the budget to the estimate, as `dmlbench "
                   "budget-check --multiple` trains it (0: none)")
@click.option("--time-methods", is_flag=True,
              help="time each cell's loss and miner on batches of the protocol's shape (a few seconds) and add "
                   "them to its steps: a method that costs more than the trunk is named")
@format_option
@quiet_option
def command(file: str, step_ms: float | None, check_multiple: int, time_methods: bool, fmt: str, quiet: bool) -> int:
    """Expand protocol FILE into cells (loss x miner), print dropped pairs, budget and time estimate.

    The estimate is wall time on this machine for a CPU protocol and GPU-hours for a CUDA one."""
    from bench.data import check_path
    from bench.data.query_gallery import test_specs
    from bench.plan import format_plan, plan
    from bench.probe import check_live
    from bench.protocol import load_protocol

    protocol = load_protocol(file)
    d = protocol.doc["data"]
    for spec in (d["train"], *test_specs(d["test"])):
        check_path(spec)  # no class count for data that does not exist
    if time_methods:
        from bench.protocol import device_problem

        problem = device_problem(str(protocol.doc["training"]["device"]))
        if problem:
            raise BenchError(f"--time-methods times on the protocol's device: {problem}")
    p = plan(protocol, None if step_ms is None else step_ms / 1000, check_multiple, time_methods)
    check_live(p)  # a dead search parameter would waste the budget: refuse before the sweep
    emit(fmt, lambda: format_plan(p), lambda: rows(p))
    return 0
