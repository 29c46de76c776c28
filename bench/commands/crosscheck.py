"""`dmlbench crosscheck`: own losses and miners against PML, values and gradients."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import click

from bench.commands._output import emit, format_option, quiet_option
from bench.crosscheck import TOLERANCE, all_checks

if TYPE_CHECKING:
    from bench.crosscheck import CheckResult


def text(results: list[CheckResult], tolerance: float) -> str:
    """One aligned row per check, with the PML settings that make both sides equal."""
    lines = [f"{'check':<40} {'cases':>5} {'max rel value':>14} {'max rel grad':>13}  result  PML settings"]
    for r in results:
        ok = "ok" if r.passed else "FAIL"
        lines.append(
            f"{r.name:<40} {r.cases:>5} {r.max_rel_value:>14.2e} {r.max_rel_grad:>13.2e}  {ok:<6}  {r.pml_settings}"
        )
        if r.note:
            lines.append(f"{'':<40} note: {r.note}")
    failed = sum(not r.passed for r in results)
    lines.append(f"tolerance {tolerance:g} relative; {'all equal' if not failed else f'{failed} check(s) differ'}")
    return "\n".join(lines)


@click.command("crosscheck")
@click.option("--cases", default=50, show_default=True, help="random cases per check")
@click.option("--seed", default=0, show_default=True, help="seed of the random cases")
@format_option
@quiet_option
def command(cases: int, seed: int, fmt: str, quiet: bool) -> int:
    """Compare every own loss and miner with its PML counterpart on random batches, in float64.

    Plugin entries that declare a reference (installed ones, and those of
    --plugin files) are compared with it too.

    Exit 0 when all agree within the tolerance, 1 when any differs.
    """
    import torch

    torch.set_default_dtype(torch.float64)
    results = list(all_checks(cases=cases, seed=seed))
    rows: list[dict[str, Any]] = [{**asdict(r), "passed": r.passed, "tolerance": TOLERANCE} for r in results]
    emit(fmt, lambda: text(results, TOLERANCE), lambda: rows)
    return 0 if all(r.passed for r in results) else 1
