"""`dmlbench list`: every registered name with its parameters, defaults and counterpart."""

from __future__ import annotations

import inspect
from typing import Any

import click

from bench.commands._output import emit, format_option, quiet_option


def rows(kind: str | None = None) -> list[dict[str, Any]]:
    """One row per registry entry (of `kind`, if given), in registry order."""
    from bench import registry

    out = []
    for entry in registry.ENTRIES:
        if kind and entry.kind != kind:
            continue
        params = {n: None if d is inspect.Parameter.empty else d for n, d in entry.parameters().items()}
        required = [n for n, d in entry.parameters().items() if d is inspect.Parameter.empty]
        out.append({"kind": entry.kind, "name": entry.name, "pml_backed": entry.pml_backed, "parameters": params,
                    "required": required, "summary": entry.summary, "counterpart": entry.counterpart or None,
                    "needs": list(entry.needs)})
    return out


def text(table: list[dict[str, Any]]) -> str:
    """One line per registry entry (parameters with defaults, required ones bare), then its details."""
    lines = []
    for r in table:
        params = ", ".join(n if n in r["required"] else f"{n}={d!r}" for n, d in r["parameters"].items())
        origin = " [PML]" if r["pml_backed"] else ""
        lines.append(f"{r['kind']:<6} {r['name']}{origin}({params})")
        lines.append(f"       {r['summary']}")
        if r["counterpart"]:
            lines.append(f"       counterpart: {r['counterpart']}")
        if r["needs"]:
            lines.append(f"       built with: {', '.join(r['needs'])}")
    return "\n".join(lines)


@click.command("list")
@click.option("--kind", type=click.Choice(["loss", "miner", "trunk"]), help="only this kind")
@format_option
@quiet_option
def command(kind: str | None, fmt: str, quiet: bool) -> int:
    """Every loss, miner and trunk the registry knows, with parameters, defaults and PML counterpart."""
    table = rows(kind)
    emit(fmt, lambda: text(table), lambda: table)
    return 0
