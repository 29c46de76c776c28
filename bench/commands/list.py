"""`dmlbench list`: every registered name with its parameters, defaults and counterpart."""

from __future__ import annotations

import inspect

import click

from bench import registry


@click.command("list")
@click.option("--kind", type=click.Choice(["loss", "miner", "trunk"]), help="only this kind")
def command(kind: str | None) -> None:
    for entry in registry.ENTRIES:
        if kind and entry.kind != kind:
            continue
        params = ", ".join(
            n if d is inspect.Parameter.empty else f"{n}={d!r}" for n, d in entry.parameters().items()
        )
        origin = " [PML]" if entry.pml_backed else ""
        click.echo(f"{entry.kind:<6} {entry.name}{origin}({params})")
        click.echo(f"       {entry.summary}")
        if entry.counterpart:
            click.echo(f"       counterpart: {entry.counterpart}")
        if entry.needs:
            click.echo(f"       built with: {', '.join(entry.needs)}")
