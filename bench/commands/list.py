"""`dmlbench list`: every registered name with its parameters, defaults, default search space, counterpart
and source.

Installed plugins (entry points) are imported here, so a broken one is one
line naming it (exit 2); ``--plugin`` files are loaded by the CLI before.
"""

from __future__ import annotations

import inspect
from typing import Any

import click

from bench import registry
from bench.commands._output import emit, format_option, quiet_option
from bench.plan.space import describe_space


def rows(kind: str | None = None) -> list[dict[str, Any]]:
    """One row per registry entry (of `kind`, if given), in registry order."""
    out = []
    for entry in registry.entries(kind):
        params = {n: None if d is inspect.Parameter.empty else d for n, d in entry.parameters().items()}
        required = [n for n, d in entry.parameters().items() if d is inspect.Parameter.empty]
        out.append(
            {
                "kind": entry.kind,
                "name": entry.name,
                "pml_backed": entry.pml_backed,
                "parameters": params,
                "required": required,
                "search_space": dict(entry.search_space),
                "summary": entry.summary,
                "counterpart": entry.counterpart or None,
                "needs": list(entry.needs),
                "source": entry.source,
                "version": entry.version or None,
                "source_sha256": entry.source_hash or None,
                "reference": entry.reference
                if entry.reference is None or isinstance(entry.reference, str)
                else getattr(entry.reference, "__qualname__", repr(entry.reference)),
            }
        )
    return out


def text(table: list[dict[str, Any]]) -> str:
    """One line per registry entry (parameters with defaults, required ones bare), then its details."""
    lines = []
    for r in table:
        params = ", ".join(n if n in r["required"] else f"{n}={d!r}" for n, d in r["parameters"].items())
        origin = " [PML]" if r["pml_backed"] else ""
        lines.append(f"{r['kind']:<6} {r['name']}{origin}({params})")
        lines.append(f"       {r['summary']}")
        if r["search_space"]:
            lines.append(f"       tunes by default: {describe_space(r['search_space'])}")
        if r["counterpart"]:
            lines.append(f"       counterpart: {r['counterpart']}")
        if r["needs"]:
            lines.append(f"       built with: {', '.join(r['needs'])}")
        if r["source"] not in ("built-in", "pml"):
            version = f" {r['version']}" if r["version"] else ""
            lines.append(f"       source: {r['source']}{version}, sha256 {(r['source_sha256'] or '-')[:12]}")
        if r["reference"]:
            lines.append(f"       cross-checked against: {r['reference']}")
    return "\n".join(lines)


@click.command("list")
@click.option("--kind", type=click.Choice(["loss", "miner", "trunk"]), help="only this kind")
@format_option
@quiet_option
def command(kind: str | None, fmt: str, quiet: bool) -> int:
    """Every loss, miner and trunk the registry knows, with parameters, defaults, what a sweep tunes by default
    (a protocol's search_space overrides it per parameter; null drops one), PML counterpart and source.

    Any other PML loss or miner is usable as pml:<ClassName> without being listed.
    """
    table = rows(kind)
    emit(fmt, lambda: text(table), lambda: table)
    return 0
