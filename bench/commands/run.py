"""`dmlbench run FILE`: tune every cell of a protocol, retrain the best with the final seeds, write the tables.

Rerunning the same command resumes an interrupted sweep; several processes
(or machines, with --storage on a shared database) can work on one sweep at
once. See bench/sweep/runner.py for what is recorded where and how workers share.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from bench.atomic import write_text
from bench.cli import quiet_libraries
from bench.clock import summary
from bench.commands._output import emit, format_option, log, quiet_option
from bench.commands.leaderboard import document, rows, table
from bench.errors import BenchError
from bench.plan import plan, trained_cell
from bench.protocol import load_protocol
from bench.stores.retry import WINDOW_ENV

if TYPE_CHECKING:
    from bench.sweep.result import SweepResult


def sweep_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that say where a sweep records and reads, and its threads: `run`'s, and `budget-check`'s
    (which must point at the run it checks)."""
    options = [
        click.option(
            "--storage",
            default=None,
            metavar="URL",
            help="Optuna storage, any RDB URL (default: sqlite:///./runs/optuna.db); share it to share the "
            "sweep; postgresql:// needs the `postgres` extra",
        ),
        click.option(
            "--tracking-uri",
            default=None,
            help="MLflow URI or path (default: $MLFLOW_TRACKING_URI, else ./runs/mlflow.db)",
        ),
        click.option(
            "--results-dir",
            default="results",
            show_default=True,
            type=click.Path(file_okay=False),
            help="tables go to RESULTS_DIR/<protocol name>/",
        ),
        click.option(
            "--data-root", default=None, help="folder holding the datasets (default: $DMLBENCH_DATA, ../shared/data)"
        ),
        click.option(
            "--threads",
            default=None,
            type=click.IntRange(min=1),
            help="torch CPU threads (default: torch's, one per core); 1 on a machine busy with other work",
        ),
        click.option(
            "--store-retry",
            "store_retry",
            default=None,
            type=click.FloatRange(min=0),
            metavar="SECONDS",
            expose_value=False,
            callback=_set_store_retry,
            help="how long a database or MLflow server that stops answering mid-sweep is waited for before "
            "the worker stops (exit 75; the same command resumes); default $DMLBENCH_STORE_RETRY_S, else 300",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _set_store_retry(ctx: click.Context, param: click.Parameter, value: float | None) -> None:
    """``--store-retry`` sets the process's retry window (`bench.stores.retry`), as its variable would."""
    if value is not None:
        os.environ[WINDOW_ENV] = f"{value:g}"


def stop_after_option(rule: str) -> Callable[..., Any]:
    """``--stop-after SECONDS``, a worker's wall-time limit (exit 4 with work left): ``rule`` says what the
    command starts and stops by it."""
    return click.option(
        "--stop-after",
        "stop_after",
        default=None,
        type=click.FloatRange(min=0, min_open=True),
        metavar="SECONDS",
        help=f"stop this worker after SECONDS of wall time: {rule}; prints what remains and exits 4 when work "
        "is left (the same command resumes)",
    )


# `run --device` and `budget-check --device`: where the training runs, the records the protocol's own
device_option = click.option(
    "--device",
    default=None,
    metavar="DEVICE",
    help="train on DEVICE (cpu, cuda, cuda:1, mps) instead of the protocol's training.device: the same "
    "records, resumed; the records name the device (run: the manifest's device_override; results agree "
    "across devices only within rounding)",
)


@click.command("run")
@click.argument("file", type=click.Path(dir_okay=False))
@sweep_options
@click.option(
    "--redo",
    multiple=True,
    metavar="CELL",
    help="discard CELL's records and run it again, e.g. after a fix to its loss or miner (repeatable; "
    "no other worker may be running)",
)
@click.option(
    "--cells",
    default="",
    metavar="CELL,CELL",
    help="run only these planned cells (comma-separated): one job of a sweep split without a shared "
    "database, each with its own --results-dir, --storage and --tracking-uri; `dmlbench merge` joins them. "
    "Exit 1 when one of these has no result; the plan's other cells are other jobs'",
)
@stop_after_option(
    "no trial or final seed is started that would end past it (by the longest this worker has run), one "
    "still running then is given back"
)
@device_option
@format_option
@quiet_option
def command(
    file: str,
    storage: str | None,
    tracking_uri: str | None,
    results_dir: str,
    data_root: str | None,
    threads: int | None,
    redo: tuple[str, ...],
    cells: str,
    stop_after: float | None,
    device: str | None,
    fmt: str,
    quiet: bool,
) -> int:
    """Run (or resume) protocol FILE, then print the ranked cells.

    Resume with the same --threads to reproduce the numbers exactly: the
    order of float additions on the CPU depends on the thread count. More
    threads than free cores make every step wait, so on a shared machine
    use --threads 1 (and more workers on the same --storage to use more cores).
    SIGTERM is handled like Ctrl-C: the running trial is given back first
    (exit 130; the same command resumes). With --quiet the progress bars give
    way to one line per finished trial.
    """
    import torch

    from bench.sweep.accounts import TimeUp, stop_on_signals
    from bench.sweep.runner import run_protocol
    from bench.sweep.worker import Options

    if threads is not None:
        torch.set_num_threads(threads)
    protocol = load_protocol(file)  # a malformed file fails before storage, data or MLflow are touched
    quiet_libraries()  # the sweep's pre-flight (bench.sweep.preflight) then refuses what `validate` refuses
    try:
        with stop_on_signals():
            result = run_protocol(
                protocol,
                Options(
                    storage=storage,
                    tracking_uri=tracking_uri,
                    results_dir=results_dir,
                    data_root=data_root,
                    quiet=quiet,
                    redo=redo,
                    cells=tuple(c.strip() for c in cells.split(",") if c.strip()),
                    stop_after_s=stop_after,
                    device=device,
                ),
            )
    except TimeUp as stopped:  # said even when quiet: the sweep is not finished
        log.warning(remaining_line(protocol.name, stopped.remaining))
        return EXIT_STOPPED
    _print_table(result, fmt)
    minutes, seconds = divmod(int(result.wall_time_s), 60)
    completed = _completed_cells(result)
    log.info(
        f"{protocol.name} ({protocol.hash12}): {result.cells} cells run, {completed} with a completed final "
        f"seed, in {minutes}:{seconds:02d}; tables in {result.path}"
    )
    resumed = _resumed_line(result)
    if resumed:
        log.info(resumed)
    accounted = result.manifest.get("time")
    if accounted:  # where this worker's wall time went (bench.clock.Ledger; the manifest's `time`)
        log.info(f"time: {summary(accounted)}")
    _where_to_look(result)
    if completed == 0:
        log.error(f"dmlbench: no cell completed: {_first_reason(result)}")
        return 1
    missing = _cells_without_result(protocol, result)
    if missing:
        shown = "; ".join(f"{cell}: {why}" for cell, why in missing.items())
        asked = "of the cell(s) asked for (--cells)" if result.manifest.get("planned_cells") else "planned cell(s)"
        log.error(
            f"dmlbench: {len(missing)} of {result.cells} {asked} have no result ({shown}); the table "
            "marks them, and a run that leaves a planned cell without a result is not a finished comparison"
        )
        return 1
    return 0


EXIT_STOPPED = 4  # --stop-after reached with work left (bench.cli's table)


def remaining_line(name: str, left: dict[str, Any]) -> str:
    """What a sweep stopped at its time limit has left, in one line: cells, trials, final seeds, iterations
    and the estimated time at this worker's pace."""
    if not left["cells"]:
        return (
            f"{name}: stopped at --stop-after with every cell recorded; the untrained floor's seeds and the "
            "tables are left: rerun the same command to finish"
        )
    eta = left.get("estimated_s")
    if eta is None:  # a unit still running at the limit is given back, so the same limit may never advance it
        return (
            f"{name}: stopped at --stop-after with work left: {left['cells']} of {left['of_cells']} cells, "
            f"{left['trials']} trials and {left['seeds']} final seeds, {left['iterations']:,} of "
            f"{left['of_iterations']:,} iterations; estimated time left unknown: nothing finished in this "
            "chunk, so rerun with a --stop-after longer than one trial or final seed takes here"
        )
    return (
        f"{name}: stopped at --stop-after with work left: {left['cells']} of {left['of_cells']} cells, "
        f"{left['trials']} trials and {left['seeds']} final seeds, {left['iterations']:,} of "
        f"{left['of_iterations']:,} iterations; estimated time left about {_duration(eta)} at this worker's "
        "pace; rerun the same command to resume"
    )


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _resumed_line(result: SweepResult) -> str | None:
    """When the stores already held part of the plan: how much was taken from them rather than trained; all of
    it says so, with how to train anew (another results folder alone reads the same records)."""
    recorded, total = result.recorded_iterations, result.total_iterations
    if not recorded or not total:
        return None
    storage = result.manifest.get("storage", "the Optuna storage")
    if recorded >= total:
        return (
            f"nothing trained now: all {total:,} iterations were already in the records ({storage}); "
            "to train anew, give another --storage and --tracking-uri"
        )
    return f"resumed: {recorded:,} of {total:,} iterations were already in the records ({storage})"


def _cells_without_result(protocol: Any, result: SweepResult) -> dict[str, str]:
    """Planned cells with no completed final seed, each with the first recorded reason."""
    finals, trials = result.finals, result.trials
    done = (  # a row of final.mode folds (`<cell>:separate`) reports its trained cell
        set()
        if finals.empty or "state" not in finals
        else set(finals.loc[finals["state"] == "COMPLETE", "cell"].astype(str).map(trained_cell))
    )
    out = {}
    ran = result.manifest.get("cells")  # with --cells, those only
    for cell in ran if isinstance(ran, list) else (c.id for c in plan(protocol).cells):
        if cell in done:
            continue
        why = (result.manifest.get("refused") or {}).get(cell, "")
        for frame, kind in ((finals, "final seed"), (trials, "trial")):
            if why or frame.empty or "reason" not in frame:
                continue
            rows = frame[(frame["cell"].astype(str).map(trained_cell) == cell) & (frame["state"] != "COMPLETE")]
            reasons = [str(r) for r in rows["reason"] if isinstance(r, str) and r]
            if len(rows):
                why = f"every {kind} failed" + (f" ({reasons[0]})" if reasons else "")
        out[cell] = why or "no record (was the run interrupted?)"
    return out


def _where_to_look(result: SweepResult) -> None:
    """Where the page is and how to browse the records: what a first run should end with."""
    page = result.path / "leaderboard.html"
    if page.is_file():
        log.info(f"leaderboard page: {page.resolve()} (open it in a browser)")
    uri = str(result.manifest.get("tracking_uri", ""))
    if uri and "***" not in uri:
        log.info(f"records: mlflow ui --backend-store-uri {uri}  (then open http://127.0.0.1:5000)")


def _completed_cells(result: SweepResult) -> int:
    """Cells with at least one COMPLETE final seed: a sweep with none has nothing to rank and must not
    look done (it ended with exit 0 and "1 cells done" when every trial failed)."""
    finals = result.finals

    if finals.empty or "state" not in finals:
        return 0
    return int(finals.loc[finals["state"] == "COMPLETE", "cell"].astype(str).map(trained_cell).nunique())


def _first_reason(result: SweepResult) -> str:
    """What failed (every trial, or every final seed) and the first recorded reason."""
    trials = result.trials
    tuned = not trials.empty and "state" in trials and bool((trials["state"] == "COMPLETE").any())
    what = "every final seed failed" if tuned else "every trial failed"
    for frame, kind in ((result.finals, "final seed"), (result.trials, "trial")) if tuned else ((trials, "trial"),):
        if frame.empty or "reason" not in frame:
            continue
        failed = frame[(frame["state"] != "COMPLETE") & frame["reason"].notna() & (frame["reason"] != "")]
        if len(failed):
            row = failed.iloc[0]
            return f"{what}; {row['cell']} {kind}: {row['reason']}"
    return f"{what} (see trials.csv and finals.csv in {result.path})"


def _print_table(result: SweepResult, fmt: str) -> None:
    """The ranked cells, so that a finished run answers its question on the terminal."""
    from bench.reports import leaderboard, source

    try:
        res = source.load(result.path)
    except BenchError as e:  # e.g. every cell failed: the tables still hold the reasons
        log.warning(f"no table to print: {e}")
        return
    board = leaderboard.build(res)
    from bench.reports import html

    write_text(result.path / "leaderboard.md", leaderboard.markdown(board))  # what `dmlbench leaderboard` writes
    write_text(result.path / "leaderboard.html", html.render(board, html.collect(res, board)))

    emit(fmt, lambda: table(board, res), lambda: rows(board), lambda: document(board))
