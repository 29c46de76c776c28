"""`dmlbench validate FILE...`: check protocol files before anything runs.

Every problem is printed on its own line as ``FILE:LINE: key.path: what was
expected``; the exit status is 2 when any file has one, so CI can gate on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from bench.commands._output import quiet_option
from bench.errors import BenchError

if TYPE_CHECKING:
    from bench.protocol import Protocol


def data_lines(protocol: Protocol, data_root: str | None) -> list[str]:
    """Load and split the protocol's data as `run` would; one line per split with its class and sample counts.

    Missing or unreadable paths, unknown class names, a channel mismatch
    between train and test, too few samples or classes for P x K: all
    surface here as a BenchError, before a sweep.
    """
    from bench.data import check_path
    from bench.data.query_gallery import QueryGallery, test_specs
    from bench.sweep.tuning import prepare

    d = protocol.doc["data"]
    for spec in (d["train"], *test_specs(d["test"])):
        check_path(spec)
    prepared = prepare(protocol, data_root)

    def counts(data: Any) -> str:
        return f"{len(data.classes)} classes, {len(data)} samples, inputs {'x'.join(map(str, data.x.shape[1:]))}"

    test = prepared.test
    lines = [f"  train {d['train']}: {counts(prepared.train)}"]
    if isinstance(test, QueryGallery):
        skipped = len(test.query) - test.matched_queries()
        lines += [f"  test query {d['test']['query']}: {counts(test.query)}"
                  + (f"; {skipped} without a match in the gallery, skipped by the metrics" if skipped else ""),
                  f"  test gallery {d['test']['gallery']}: {counts(test.gallery)}"]
    else:
        lines.append(f"  test {d['test']}: {counts(test)}")
    for i in range(len(prepared.folds)):
        fold_train, fold_val = prepared.fold(i)
        lines.append(f"  fold {i}: train {counts(fold_train)}; validation {counts(fold_val)}")
    return lines


@click.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--data-root", default=None, help="folder holding the datasets (default: $DMLBENCH_DATA, ../shared/data)")
@click.option("--no-data", is_flag=True, help="check the files only: do not load the data")
@quiet_option
def command(files: tuple[str, ...], data_root: str | None, no_data: bool, quiet: bool) -> int:
    """Check protocol FILES against the schema and the registry, then load and split their data; print each one's hash
    and the class and sample counts of every split.

    Exit 0 when every file is valid, 2 when any has a problem (all are listed).
    """
    from bench.plan import plan
    from bench.sweep.probe import check_live
    from bench.protocol import ProtocolError, device_problem, load_protocol

    problems: list[str] = []
    for path in files:
        try:
            protocol = load_protocol(path)
            check_live(plan(protocol))
            # a protocol for a GPU is valid on a laptop: the machine, not the file, lacks the device
            wrong = device_problem(protocol.doc["training"]["device"], availability=False)
            if wrong:
                raise BenchError(f"{path}: {wrong}")
            device = device_problem(protocol.doc["training"]["device"])
            found = [] if no_data else data_lines(protocol, data_root)
        except ProtocolError as e:
            problems += e.problems
            continue
        except BenchError as e:
            problems.append(str(e))
            continue
        click.echo(f"{path}: ok, protocol {protocol.name}, hash {protocol.hash12}")
        if device:
            click.echo(f"dmlbench: note: {path}: {device}: `dmlbench run` refuses it here", err=True)
        for line in found:
            click.echo(line)
    if problems:
        for line in problems[:-1]:
            click.echo(f"dmlbench: error: {line}", err=True)
        raise BenchError(problems[-1])
    return 0
