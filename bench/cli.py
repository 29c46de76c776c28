"""The `dmlbench` command line: a thin layer over functions tests call directly.

Each command lives in `bench.commands.<name>` and is imported only when it
runs, so `dmlbench --help` stays fast. Commands return their exit code to
`main`, the one place that turns outcomes into statuses:

exit  meaning
   0  done; for `regress` no cell regressed, for `crosscheck` all checks equal
   1  a check failed: `regress` found a regression (or the current lacks
      something of the baseline: a cell, a final seed, a value, a column;
      or has a seed the baseline lacks),
      `crosscheck` found a loss or miner that differs from PML,
      `train` diverged (NaN or infinite loss), `run` ended with no cell
      completed (every trial failed: the reason is printed)
   2  bad input: a name, file, option or parameter the command cannot use
      (one line on stderr, no traceback); also click's usage errors, and a
      file that cannot be read or written (read-only or full disk, a name
      too long): results files are written whole or not at all
   3  a test class reached tuning or training data (`run`, `train`): the
      split is broken, and the run stops before anything is recorded
   4  `run --stop-after SECONDS` (or `budget-check --stop-after`) reached its
      limit with work left: nothing running was lost (a trial still training
      then is given back, a check's seed keeps its state), what remains is
      printed, and the same command resumes
  75  a store stopped answering mid-sweep for longer than the retry window
      (`run`, `budget-check`: the Optuna database or the MLflow server;
      --store-retry, $DMLBENCH_STORE_RETRY_S, 300 s by default): records made
      are kept, the same command resumes
 130  interrupted (Ctrl-C, or SIGTERM during `run` or `budget-check`); a
      rerun resumes

Any other exception is a bug and keeps its traceback (status 1 from Python).

The one global option, ``--plugin MODULE|FILE.py`` (repeatable), imports
code that registers losses, miners or trunks (`bench.plugins`) before the
command runs. A protocol naming them is re-read by every worker, resume and
``leaderboard --mlflow-experiment``, so each must be started with the same
``--plugin`` (installed entry-point packages need nothing: they are found).

This module is also the edge where the process-wide settings live: the
handler of the `dmlbench` logger, and the quieting of Optuna's and MLflow's
INFO chatter (`quiet_libraries`). The library itself only logs to
`logging.getLogger("dmlbench")` and leaves global logging, warning filters
and environment variables to whoever embeds it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import warnings
from typing import Any

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
    "budget-check": "retrain a finished run's cells at a multiple of the budget: is the ranking converged?",
    "variance": "split each cell's variance into tuning noise and seed noise (results of tuning.repeats >= 2)",
    "power": "seeds and tuning draws a paired claim of a given effect needs (80% power by default)",
    "merge": "join the results folders of jobs that ran a protocol's cells apart (run --cells) into one",
}
MODULES = {"budget-check": "budget"}  # a command whose module is not named after it

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

EPILOG = """\b
Exit status: 0 done; 1 a check failed (regress: regression, crosscheck:
differs from PML, train: diverged, run and merge: a planned cell without a
result, with --cells a cell asked for); 2 bad input (one line on stderr);
3 a test class reached tuning or training data; 4 run or budget-check
--stop-after reached with work left (a rerun resumes); 75 a database or MLflow
server stopped answering for longer than --store-retry (a rerun resumes);
130 interrupted (a rerun resumes).
"""


class LazyGroup(click.Group):
    """Commands imported only when named, so that `dmlbench --help` and quick commands never import torch,
    MLflow or Optuna."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The commands whose module is there, in COMMANDS order."""
        return [n for n in COMMANDS if _module_exists(n)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The named command, importing its module now; None for an unknown name (click's error)."""
        if cmd_name not in COMMANDS or not _module_exists(cmd_name):
            return None
        command: click.Command = importlib.import_module(f"bench.commands.{MODULES.get(cmd_name, cmd_name)}").command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """One line per command from COMMANDS, without importing any command module."""
        rows = [(n, COMMANDS[n]) for n in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _module_exists(name: str) -> bool:
    return importlib.util.find_spec(f"bench.commands.{MODULES.get(name, name)}") is not None


@click.group(cls=LazyGroup, epilog=EPILOG)
@click.version_option(__version__, prog_name="dmlbench")
@click.option(
    "--plugin",
    "plugins",
    multiple=True,
    metavar="MODULE|FILE.py",
    help="import this module (from the current directory or sys.path) or .py file first, so that the "
    "losses, miners and trunks it registers can be named; repeatable. Give every worker, resume "
    "and leaderboard of a protocol the same --plugin.",
)
def cli(plugins: tuple[str, ...]) -> None:
    """dmlbench: fair, rerunnable comparisons of deep metric learning methods."""
    from bench.plugins import load_plugin  # importlib.metadata: tens of milliseconds on every start

    for spec in plugins:
        load_plugin(spec)


def quiet_libraries() -> None:
    """Keep Optuna's and MLflow's INFO chatter (study created, tables migrated) off the terminal.

    Called by the commands that use them, after importing them: both packages
    reset their loggers on import, so a setting made before would not hold.
    This is process-wide, which is why it lives here and not in the library.
    """
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per downloaded file
    # MLflow's own SQLAlchemy mappings use a strategy SQLAlchemy 2 deprecates: not ours to act on
    warnings.filterwarnings("ignore", message=r"The ``noload`` loader strategy is deprecated")
    import mlflow  # noqa: F401  (configures its loggers; then we lower them)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow's SQL store logs every failed database call at ERROR with a traceback, then raises: the raised
    # error is reported once by the harness (waited for within the store retry window, or one line, exit 75)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def bound_connections() -> None:
    """One retry policy for MLflow's HTTP store: an unreachable ``--tracking-uri http://...`` fails in seconds.

    MLflow's defaults (7 retries, exponential backoff, 120 s a request) wait
    for minutes on a closed port. A user's own settings win (setdefault).
    Process-wide environment, hence set here at the edge, not in the library.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of the record (pytest's capture, a redirection)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _log_to_stderr() -> None:
    """One plain handler on the `dmlbench` logger; INFO unless a command's --quiet raises it."""
    logger = logging.getLogger("dmlbench")
    logger.setLevel(logging.INFO)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    """Run one command and return its exit status (see the table in this module's docstring)."""
    _log_to_stderr()
    bound_connections()
    try:
        code = cli.main(args=argv, prog_name="dmlbench", standalone_mode=False)
    except BenchError as e:
        click.echo(f"dmlbench: error: {e}", err=True)
        return e.exit_code
    except OSError as e:
        if e.filename is None:  # not a file the user named or a disk we write to: a bug, keep the traceback
            raise
        where = str(e.filename)[:200] + (f" -> {str(e.filename2)[:200]}" if e.filename2 else "")
        click.echo(
            f"dmlbench: error: {where}: {e.strerror or e} (nothing half-written: files are replaced "
            "whole or not at all)",
            err=True,
        )
        return EXIT_BAD_INPUT
    except click.exceptions.Abort:
        click.echo("dmlbench: interrupted", err=True)
        return EXIT_INTERRUPTED
    except click.UsageError as e:  # one line, as every other refusal; --help has the rest
        where = f"dmlbench {e.ctx.command_path.split(' ', 1)[1]}" if e.ctx and " " in e.ctx.command_path else "dmlbench"
        click.echo(f"dmlbench: error: {e.format_message()} (see: {where} --help)", err=True)
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    return int(code or EXIT_OK)


if __name__ == "__main__":
    sys.exit(main())
