"""`dmlbench power RESULTS --effect D`: the seeds and tuning draws a paired claim of effect D needs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bench.commands._output import emit, format_option, quiet_option
from bench.commands.variance import cells_of, metric_of
from bench.errors import BenchError

if TYPE_CHECKING:
    from bench.reports.source import Results


def _seed_choices(res: Results, seeds: str) -> list[int]:
    from bench.reports.variance import SEED_CHOICES

    try:
        chosen = [int(s) for s in seeds.split(",") if s.strip()] if seeds else list(SEED_CHOICES)
    except ValueError:
        raise BenchError(f"--seeds: {seeds!r} is not a comma-separated list of whole numbers") from None
    if not chosen or min(chosen) < 1:
        raise BenchError(f"--seeds: {seeds!r}: every choice must be 1 or more")
    budget = res.manifest.get("budget")
    own = budget.get("seeds") if isinstance(budget, dict) else None
    return sorted(set(chosen) | ({own} if isinstance(own, int) and own > 0 else set()))


def rows(
    res: Results, metric: str, cells: list[str], pair: bool, effect: float, power: float, alpha: float, seeds: list[int]
) -> list[dict[str, Any]]:
    """One row per comparison and choice of seeds per draw: the draws needed and the cost per cell.

    ``pair``: ``cells`` are two, compared paired (their differences' split); else each cell alone, against
    an independent cell like it (`bench.reports.variance.doubled`)."""
    from bench.reports import variance

    comparisons: list[tuple[str, Any, int, list[str]]] = []
    if pair:
        a, b = cells
        diff, n_pairs = variance.pair_split(res, a, b, metric)
        comparisons.append((f"{a} - {b}", diff, n_pairs, [a, b]))
    else:
        for cell in cells:
            s = variance.cell_split(res, cell, metric)
            comparisons.append((cell, variance.doubled(s), 0, [cell]))
    out = []
    for name, diff, n_pairs, members in comparisons:
        if not math.isfinite(diff.seed_var) or not math.isfinite(diff.tuning_var_raw):
            raise BenchError(
                f"{name}: no split of the variance ({diff.draws} draw(s), {diff.seed_df} seed degree(s) of "
                "freedom): a design needs at least two draws and two seeds in one of them"
            )
        costs = [variance.draw_cost(res, c) for c in members]
        runs, tuning_it, seed_it = (sum(c[i] for c in costs) / len(costs) for i in range(3))
        found = variance.designs(diff, effect, runs, tuning_it, seed_it, seeds, alpha, power)
        cheapest = min(found, key=lambda d: (d.iterations, d.draws))
        for d in found:
            out.append(
                {
                    "comparison": name,
                    "paired": pair,
                    "metric": metric,
                    "effect": effect,
                    "power": power,
                    "alpha": alpha,
                    "observed_difference": diff.mean if pair else math.nan,
                    "pairs": n_pairs if pair else None,
                    "tuning_sd_diff": diff.tuning_sd,
                    "seed_sd_diff": diff.seed_sd,
                    "seeds": d.seeds,
                    "draws": d.draws,
                    "draw_sd": d.draw_sd,
                    "runs_per_cell": d.runs,
                    "iterations_per_cell": d.iterations,
                    "cheapest": d is cheapest,
                }
            )
    return out


def text(rows: list[dict[str, Any]]) -> str:
    """The terminal table, one block per comparison."""
    from bench.reports.variance import aligned

    head = ["comparison", "s_t,d", "s_e,d", "seeds", "draws", "SD of a draw", "runs/cell", "iterations/cell", ""]
    body = []
    for r in rows:
        body.append(
            [
                r["comparison"],
                f"{r['tuning_sd_diff']:.4f}",
                f"{r['seed_sd_diff']:.4f}",
                str(r["seeds"]),
                str(r["draws"]),
                f"{r['draw_sd']:.4f}",
                f"{r['runs_per_cell']:,.0f}",
                f"{r['iterations_per_cell']:,.0f}",
                "cheapest" if r["cheapest"] else "",
            ]
        )
    r0 = rows[0]
    how = (
        "paired over (draw, seed) pairs with common random numbers"
        if r0["paired"]
        else "each cell against an independent cell like it (s_d^2 = 2 s^2: without common random numbers; "
        "pairing usually needs fewer)"
    )
    lines = [
        aligned(head, body),
        f"{r0['metric']}: draws of S seeds each that detect a difference of {r0['effect']:g} with power "
        f"{r0['power']:g} (paired t-test over draws, two-sided alpha {r0['alpha']:g}); {how}. SD of a draw = "
        "sqrt(s_t,d^2 + s_e,d^2 / S); cost per cell at the sweep's recorded cost of a draw's tuning and a seed "
        "(docs/METHODS.md, What a verdict costs)",
    ]
    if r0["paired"]:
        lines.append(f"observed difference {r0['observed_difference']:+.4f} over {r0['pairs']} (draw, seed) pairs")
    return "\n".join(lines)


@click.command("power")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--effect", type=float, required=True, help="the difference of the metric the claim must detect")
@click.option(
    "--cells",
    default="",
    metavar="A,B",
    help="two cells: size the paired comparison A - B from their own differences [default: each cell alone, "
    "against an independent cell like it]",
)
@click.option("--metric", default=None, help="the metric compared [default: the results' primary metric]")
@click.option("--power", "target", type=float, default=0.8, show_default=True, help="the power to reach")
@click.option("--alpha", type=float, default=0.05, show_default=True, help="two-sided significance level")
@click.option(
    "--seeds",
    default="",
    metavar="N,N",
    help="seeds per draw to offer (comma-separated) [default: 1,2,3,5,10 and the sweep's own]",
)
@format_option
@quiet_option
def command(
    results: Path,
    effect: float,
    cells: str,
    metric: str | None,
    target: float,
    alpha: float,
    seeds: str,
    fmt: str,
    quiet: bool,
) -> int:
    """How many seeds and tuning draws a paired claim of effect --effect needs at the given power.

    Sized from the variance split of RESULTS (`dmlbench variance`), which must
    come from a sweep with tuning.repeats of 2 or more (exit 2 otherwise).
    """
    from bench.reports import source, variance

    if not (math.isfinite(effect) and effect > 0):
        raise BenchError(f"--effect {effect!r}: give a positive difference of the metric (e.g. 0.02)")
    if not 0 < target < 1 or not 0 < alpha < 1:
        raise BenchError(f"--power {target!r} and --alpha {alpha!r} must both lie strictly between 0 and 1")
    pair = bool(cells.strip())
    if pair and len({c.strip() for c in cells.split(",") if c.strip()}) != 2:
        raise BenchError(
            f"--cells {cells!r}: name exactly two different cells, A,B, to size the paired comparison A - B"
        )
    res = source.load(results)
    variance.require_draws(res)
    name = metric_of(res, metric)
    chosen = cells_of(res, cells)
    table = rows(res, name, chosen, pair, effect, target, alpha, _seed_choices(res, seeds))
    emit(fmt, lambda: text(table), lambda: table)
    return 0
