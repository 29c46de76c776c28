"""`dmlbench validate FILE...`: check protocol files before anything runs.

Every problem is printed on its own line as ``FILE:LINE: key.path: what was
expected``; the exit status is 2 when any file has one, so CI can gate on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from bench.commands._output import quiet_option
from bench.errors import BenchError
from bench.protocol import ProtocolError, load_protocol
from bench.sweep.preflight import inspect, short_classes_notice

if TYPE_CHECKING:
    from bench.protocol import Protocol


def data_lines(protocol: Protocol, prepared: Any, sampler: dict[str, Any] | None = None) -> list[str]:
    """One line per split of the data the pre-flight loaded and split as `run` does: its class and sample counts;
    then the notices `run` gives of them (classes left out, classes below K drawn with replacement)."""
    from bench.data.query_gallery import QueryGallery
    from bench.data.splits import fold_label
    from bench.sweep.prepare import small_classes_notice

    d = protocol.spec.data

    def counts(data: Any) -> str:
        return f"{len(data.classes)} classes, {len(data)} samples, inputs {'x'.join(map(str, data.x.shape[1:]))}"

    test = prepared.test
    lines = [f"  train {d.train}: {counts(prepared.train)}"]
    if isinstance(test, QueryGallery):
        skipped = len(test.query) - test.matched_queries()
        lines += [
            f"  test query {d.test['query']}: {counts(test.query)}"
            + (f"; {skipped} without a match in the gallery, skipped by the metrics" if skipped else ""),
            f"  test gallery {d.test['gallery']}: {counts(test.gallery)}",
        ]
    else:
        lines.append(f"  test {d.test}: {counts(test)}")
    for i in range(len(prepared.folds)):
        fold_train, fold_val = prepared.fold(i)
        lines.append(f"  {fold_label(i)}: train {counts(fold_train)}; validation {counts(fold_val)}")
    left_out = small_classes_notice(prepared.small_classes)
    if left_out:
        lines.append(f"  {left_out}")
    short = short_classes_notice(sampler) if sampler else None
    if short:
        lines.append(f"  {short}")
    return lines


@click.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--data-root", default=None, help="folder holding the datasets (default: $DMLBENCH_DATA, ../shared/data)")
@click.option(
    "--no-data", is_flag=True, help="check the files only: do not load the data nor look for the weights file"
)
@click.option(
    "--no-decode",
    is_flag=True,
    help="read image files' headers only: do not decode every file once (what run does before training)",
)
@click.option(
    "--storage", default=None, metavar="URL", help="check this Optuna storage as `run --storage` would use it"
)
@click.option("--tracking-uri", default=None, help="check this MLflow store as `run --tracking-uri` would use it")
@click.option(
    "--results-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="check this results folder as `run --results-dir` would use it",
)
@click.option(
    "--threads",
    default=None,
    type=click.IntRange(min=1),
    help="torch CPU threads the precision check times a step with, as `run --threads` would train "
    "(default: torch's, one per core)",
)
@quiet_option
def command(
    files: tuple[str, ...],
    data_root: str | None,
    no_data: bool,
    no_decode: bool,
    storage: str | None,
    tracking_uri: str | None,
    results_dir: str | None,
    threads: int | None,
    quiet: bool,
) -> int:
    """Check protocol FILES against the schema and the registry, then load and split their data; print each one's hash
    and the class and sample counts of every split.

    Every check `run` makes before training is made here (bench.sweep.preflight): the data (every image file
    decoded once, remembered per file so that a later check decodes only what changed; --no-decode reads
    headers only), the trunk on the data's inputs, `evaluation.ks` against the test set, the pretrained
    weights file, the device; the stores too when --storage,
    --tracking-uri or --results-dir is given (run's defaults for the others). A device this machine lacks
    is a note: the file is valid, `run` refuses it here. With the data checked, a fixed training.precision
    3x or more slower here than another (fp32/bf16, with or without channels-last, timed a few seconds with
    --threads, as `run --threads` trains) is a one-line warning; `precision: auto` picks the fastest at a sweep's start.

    Exit 0 when every file is valid, 2 when any has a problem (all are listed).
    """
    stores = storage is not None or tracking_uri is not None or results_dir is not None
    problems: list[str] = []
    for path in files:
        try:
            protocol = load_protocol(path)
        except ProtocolError as e:
            problems += e.problems
            continue
        except BenchError as e:
            problems.append(str(e))
            continue
        found = inspect(
            protocol,
            data_root=data_root,
            data=not no_data,
            stores=stores,
            storage=storage,
            tracking_uri=tracking_uri,
            results_dir=results_dir,
            decode=not no_decode,
        )
        if found.errors:
            problems += [p.message for p in found.errors]
            continue
        click.echo(f"{path}: ok, protocol {protocol.name}, hash {protocol.hash12}")
        for note in found.problems:
            click.echo(f"dmlbench: note: {path}: {note.message}: `dmlbench run` refuses it here", err=True)
        slow = None if no_data or found.problems else _slow_precision(protocol, threads)
        if slow:
            click.echo(f"dmlbench: warning: {path}: {slow}", err=True)
        for line in [] if found.prepared is None else data_lines(protocol, found.prepared, found.sampler):
            click.echo(line)
    if problems:
        for line in problems[:-1]:
            click.echo(f"dmlbench: error: {line}", err=True)
        raise BenchError(problems[-1])
    return 0


def _slow_precision(protocol: Any, threads: int | None) -> str | None:
    """A fixed precision several times slower here than another (`bench.plan.measure.slow_precision`, a few
    seconds of timing with ``threads``, the count `run --threads` would train with: the ratio between the
    variants depends on it): a warning, not a problem (the file is valid, and fair on any machine)."""
    from bench.plan.measure import slow_precision

    return slow_precision(protocol, threads=threads)
