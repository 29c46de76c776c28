"""The `dmlbench` command line: a thin layer over functions tests call directly.

Each command lives in `bench.commands.<name>` and is imported only when it
runs, so `dmlbench --help` stays fast. A `BenchError` anywhere below becomes
one line on stderr and exit code 2; other exceptions are bugs and keep their
traceback.
"""

from __future__ import annotations

import importlib
import sys

import click

from bench import __version__
from bench.errors import BenchError

COMMANDS = {
    "list": "names of losses, miners and trunks with their parameters",
    "crosscheck": "compare own losses and miners with pytorch-metric-learning",
    "train": "train one trunk with one loss and miner, evaluate, log to MLflow",
    "validate": "check a protocol file against the schema",
    "plan": "expand a protocol into cells and print its budget",
    "run": "run a protocol: tune every cell, retrain the best with final seeds",
    "leaderboard": "Markdown and HTML leaderboard from a results directory",
    "regress": "compare two results tables cell by cell",
    "claims": "verdicts on published claims from a results directory",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n in COMMANDS if _module_exists(n)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not _module_exists(name):
            return None
        return importlib.import_module(f"bench.commands.{name}").command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, COMMANDS[n]) for n in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _module_exists(name: str) -> bool:
    return importlib.util.find_spec(f"bench.commands.{name}") is not None


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="dmlbench")
def cli() -> None:
    """dmlbench: fair, rerunnable comparisons of deep metric learning methods."""


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="dmlbench", standalone_mode=False)
    except BenchError as e:
        click.echo(f"dmlbench: error: {e}", err=True)
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("dmlbench: aborted", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except SystemExit as e:  # commands that exit with a status (regress, crosscheck)
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
