"""`dmlbench validate FILE...`: check protocol files before anything runs.

Every problem is printed on its own line as ``FILE:LINE: key.path: what was
expected``; the exit status is 2 when any file has one, so CI can gate on it.
"""

from __future__ import annotations

import click

from bench.commands._output import quiet_option
from bench.errors import BenchError


@click.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@quiet_option
def command(files: tuple[str, ...], quiet: bool) -> int:
    """Check protocol FILES against the schema and the registry; print each one's hash.

    Exit 0 when every file is valid, 2 when any has a problem (all are listed).
    """
    from bench.plan import plan
    from bench.probe import check_live
    from bench.protocol import ProtocolError, device_problem, load_protocol

    problems: list[str] = []
    for path in files:
        try:
            protocol = load_protocol(path)
            check_live(plan(protocol))
            problem = device_problem(protocol.doc["training"]["device"])
            if problem:
                raise BenchError(f"{path}: {problem}")
        except ProtocolError as e:
            problems += e.problems
            continue
        except BenchError as e:
            problems.append(str(e))
            continue
        click.echo(f"{path}: ok, protocol {protocol.name}, hash {protocol.hash12}")
    if problems:
        for line in problems[:-1]:
            click.echo(f"dmlbench: error: {line}", err=True)
        raise BenchError(problems[-1])
    return 0
