"""`dmlbench plan FILE`: the cells a protocol expands to, what is dropped and why, and the budget.

Nothing is loaded or trained: this is the look before the sweep, showing
that every cell gets the same trials and iterations and about how long the
whole sweep takes on this machine.
"""

from __future__ import annotations

import click


@click.command("plan")
@click.argument("file", type=click.Path(dir_okay=False))
def command(file: str) -> None:
    """Expand protocol FILE into cells (loss x miner), print dropped pairs, budget and time estimate."""
    from bench.plan import format_plan, plan
    from bench.protocol import load_protocol

    click.echo(format_plan(plan(load_protocol(file))))
