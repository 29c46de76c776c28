"""`dmlbench crosscheck`: own losses and miners against PML, values and gradients."""

from __future__ import annotations

import sys

import click
import torch

from bench.crosscheck import TOLERANCE, all_checks


@click.command("crosscheck")
@click.option("--cases", default=50, show_default=True, help="random cases per check")
@click.option("--seed", default=0, show_default=True)
def command(cases: int, seed: int) -> None:
    torch.set_default_dtype(torch.float64)
    failed = 0
    click.echo(f"{'check':<40} {'cases':>5} {'max rel value':>14} {'max rel grad':>13}  result  PML settings")
    for r in all_checks(cases=cases, seed=seed):
        ok = "ok" if r.passed else "FAIL"
        failed += not r.passed
        click.echo(f"{r.name:<40} {r.cases:>5} {r.max_rel_value:>14.2e} {r.max_rel_grad:>13.2e}  {ok:<6}  {r.pml_settings}")
        if r.note:
            click.echo(f"{'':<40} note: {r.note}")
    click.echo(f"tolerance {TOLERANCE:g} relative; {'all equal' if not failed else f'{failed} check(s) differ'}")
    sys.exit(1 if failed else 0)
