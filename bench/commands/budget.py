"""`dmlbench budget-check FILE`: retrain a finished run's cells at a multiple of the budget (bench.sweep.budget_check).

The same storage, tracking, results and thread options as `dmlbench run`,
pointing at the run being checked; rerunning the same command resumes.
`dmlbench leaderboard` then shows the change per cell and Kendall's tau.
"""

from __future__ import annotations

import click

from bench.cli import quiet_libraries
from bench.commands._output import log, quiet_option
from bench.commands.run import EXIT_STOPPED, device_option, stop_after_option, sweep_options
from bench.protocol import load_protocol


@click.command("budget-check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--multiple",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="train for MULTIPLE x training.iterations (the schedule's warm-up scaled alike); 1 reproduces the finals",
)
@click.option(
    "--shard",
    default="1/1",
    show_default=True,
    metavar="K/N",
    help="train only the K-th of every N (cell, seed) pairs: start N workers with 1/N ... N/N",
)
@stop_after_option(
    "the longest seeds that would end by then at this device's recorded pace are trained, none that would not "
    "is started, one still training then is stopped (its state kept)"
)
@sweep_options
@device_option
@quiet_option
def command(
    file: str,
    multiple: int,
    shard: str,
    stop_after: float | None,
    storage: str | None,
    tracking_uri: str | None,
    results_dir: str,
    data_root: str | None,
    threads: int | None,
    device: str | None,
    quiet: bool,
) -> int:
    """Retrain every cell of FILE's finished run at MULTIPLE x its budget, on the same final seeds.

    Give the run's own --storage (its tuned parameters are read there),
    --tracking-uri and --results-dir (budget_check.csv goes beside its
    tables), and its --threads to reproduce its float sums exactly.

    Refused (exit 2) before the run has finished. SIGTERM and Ctrl-C leave
    every finished seed recorded (exit 130); the same command resumes.
    With --stop-after, a worker whose time is limited (a lent GPU's call)
    trains the longest seeds that fit it and exits 4 with work left.
    """
    import torch

    from bench.sweep.accounts import TimeUp, stop_on_signals
    from bench.sweep.budget_check import budget_check, describe

    if threads is not None:
        torch.set_num_threads(threads)
    protocol = load_protocol(file)
    if device is not None:  # a check of a CPU run may train on a GPU: its rows agree within rounding
        protocol = protocol.with_device(device)
    quiet_libraries()
    k, sep, n = shard.partition("/")
    if not (sep and k.isdigit() and n.isdigit()):
        raise click.BadParameter(f"expected K/N, for example 1/2, got {shard!r}", param_hint="--shard")
    try:
        with stop_on_signals():
            outcome = budget_check(
                protocol,
                multiple,
                storage=storage,
                tracking_uri=tracking_uri,
                results_dir=results_dir,
                data_root=data_root,
                quiet=quiet,
                shard=(int(k), int(n)),
                stop_after_s=stop_after,
            )
    except TimeUp as stopped:  # said even when quiet: the check is not finished
        left = stopped.remaining
        log.warning(
            f"budget check x{multiple}: stopped at --stop-after with work left: {left['seeds']} seed(s), "
            f"{left['iterations']:,} iterations (not started: they would have ended past the limit at this "
            "device's recorded pace; a seed stopped at the limit keeps its state); rerun the same command to resume"
        )
        return EXIT_STOPPED
    log.info(describe(outcome, multiple))
    return 0
