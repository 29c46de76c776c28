"""`dmlbench variance RESULTS`: each cell's variance split into tuning noise and seed noise (tuning.repeats)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bench.commands._output import emit, format_option, quiet_option
from bench.errors import BenchError

if TYPE_CHECKING:
    from bench.reports.source import Results


def metric_of(res: Results, metric: str | None) -> str:
    """The metric asked for, or the results' primary one; an unknown name is one line."""
    name = metric or res.primary
    if name not in res.metrics:
        raise BenchError(f"{res.root}: no metric {name!r} in the final runs (have: {', '.join(res.metrics)})")
    return name


def cells_of(res: Results, cells: str) -> list[str]:
    """The comma-separated cells asked for (each must have completed final seeds), or every such cell."""
    names = [c.strip() for c in cells.split(",") if c.strip()]
    for cell in names:
        res.require_cell(cell)
    return names or res.cells


def rows(res: Results, metric: str, cells: list[str]) -> list[dict[str, Any]]:
    """One row per cell: the split of its final seeds' ``metric`` by tuning draw (`bench.reports.variance`)."""
    from bench.reports import variance

    out = []
    for cell in cells:
        s = variance.cell_split(res, cell, metric)
        out.append(
            {
                "cell": cell,
                "metric": metric,
                "draws": s.draws,
                "seeds": s.seeds,
                "mean": s.mean,
                "tuning_sd": s.tuning_sd,
                "seed_sd": s.seed_sd,
                "seed_sd_ci_low": s.seed_var_low**0.5,
                "seed_sd_ci_high": s.seed_var_high**0.5,
                "tuning_share": s.share,
                "tuning_share_ci_low": s.share_low,
                "tuning_share_ci_high": s.share_high,
                "tuning_var_unbiased": s.tuning_var_raw,
                "draw_mean_sd": s.draw_var(s.seeds) ** 0.5,
            }
        )
    return out


def _f(x: float, spec: str = ".4f") -> str:
    return "-" if x != x else f"{x:{spec}}"


def text(rows: list[dict[str, Any]]) -> str:
    """The terminal table and what its columns mean."""
    from bench.reports.variance import aligned

    head = ["cell", "draws x seeds", "mean", "s_t (tuning)", "s_e (seed) [95% CI]", "tuning share [95% CI]"]
    body = [
        [
            r["cell"],
            f"{r['draws']} x {_f(r['seeds'], '.3g')}",
            _f(r["mean"]),
            _f(r["tuning_sd"]),
            f"{_f(r['seed_sd'])} [{_f(r['seed_sd_ci_low'])}, {_f(r['seed_sd_ci_high'])}]",
            f"{_f(r['tuning_share'], '.0%')} [{_f(r['tuning_share_ci_low'], '.0%')}, "
            f"{_f(r['tuning_share_ci_high'], '.0%')}]",
        ]
        for r in rows
    ]
    metric = rows[0]["metric"] if rows else ""
    return "\n".join(
        [
            aligned(head, body),
            f"{metric}: one-way random-effects ANOVA over tuning draws (docs/METHODS.md, What a verdict costs); "
            "s_t = sqrt(max(0, var(draw means) - s_e^2/S)), s_e = pooled within-draw SD; tuning share = "
            "s_t^2 / (s_t^2 + s_e^2), F interval; s_t is 0 where the draws' means vary no more than their seeds do",
        ]
    )


@click.command("variance")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--metric", default=None, help="the metric to split [default: the results' primary metric]")
@click.option("--cells", default="", metavar="CELL,CELL", help="only these cells (comma-separated) [default: all]")
@format_option
@quiet_option
def command(results: Path, metric: str | None, cells: str, fmt: str, quiet: bool) -> int:
    """Split each cell's variance into tuning noise (s_t) and seed noise (s_e).

    RESULTS must come from a sweep with tuning.repeats of 2 or more: with one
    tuning draw the tuning's share is invisible (exit 2).
    """
    from bench.reports import source, variance

    res = source.load(results)
    variance.require_draws(res)
    name = metric_of(res, metric)
    table = rows(res, name, cells_of(res, cells))
    emit(fmt, lambda: text(table), lambda: table)
    return 0
