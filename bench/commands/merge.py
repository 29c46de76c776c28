"""`dmlbench merge OUT JOB...`: the results of jobs that each ran some of a protocol's cells, in one folder."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands._output import log, quiet_option
from bench.errors import BenchError


@click.command("merge")
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("jobs", nargs=-1, required=True, type=click.Path(path_type=Path))
@quiet_option
def command(out: Path, jobs: tuple[Path, ...], quiet: bool) -> int:
    """Join the results folders JOBS (each `dmlbench run P --cells ... --results-dir rN` with its own stores)
    into OUT, a new folder: the tables, manifest and artifacts of one sweep of those cells (bench/sweep/merge.py).

    Refused (one line, exit 2, nothing written): jobs of other shared settings, data, protocol version, budget or
    seeds, a cell run by two jobs, a job not finished. Exit 1: a planned cell without a result, whether no job ran
    it (listed in the manifest's `not_run`) or every trial or final seed of it failed, each named with its reason
    and a row of the merged leaderboard; 0: every planned cell has a result (the rule of `run`).
    """
    from bench.reports import leaderboard, source
    from bench.sweep.merge import merge

    manifest = merge(out, list(jobs))
    cells = manifest["cells"]
    log.info(f"merged {len(jobs)} jobs: {len(cells)} cells of {manifest['protocol']} in {out}")
    try:
        missing = leaderboard.build(source.load(out)).missing
    except BenchError:  # no final seed completed in any job: every planned cell is without a result
        missing = {c: manifest["not_run"].get(c, "no final seed completed") for c in manifest["planned_cells"]}
    if missing:
        shown = "; ".join(f"{cell}: {why}" for cell, why in missing.items())
        log.error(
            f"dmlbench: {len(missing)} of {len(manifest['planned_cells'])} planned cell(s) have no result "
            f"({shown}); the leaderboard marks them, and a merge without them is not a finished comparison"
        )
        return 1
    return 0
