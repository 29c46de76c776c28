"""The plain PML script against a harness cell, at equal iterations and batch, in one run.

Issue 14's rule: tuning must never leave a method worse than its defaults,
so at the same budget a harness cell, tuned, must score at least what
`plain_pml_script.py` scores with the same method at PML's defaults (no
augmentation, no schedule, fp32). The plain arm is the cell's own method in
PML (`plain_pml_script.PLAIN`: the counterpart of its loss and miner; a cell
whose fixed parameters PML's defaults lack, such as FaceNet's semi-hard or a
learned metric, has none) unless ``--plain`` names another, such as
``triplet+batch_hard``, the script users start from. Both arms train for
the protocol's iterations (under early stopping, the length the cell's final
seeds trained) on batches of P x K (the plain script: MPerClassSampler with
m = K), one seed of each in turn (plain, harness, plain, ...), so a busy
machine slows both alike; both are scored by bench's `evaluate` on the 659
evaluation characters and Lake's 20 one-shot runs. The harness arm is
exactly a final seed of the cell: the protocol's trunk, augmentation,
schedule and precision, final seed s's training seed, and the cell's tuned
parameters from ``--results`` (the best trial in summary.csv) or
``--param``, else the cell's defaults (which are PML's).

    .venv/bin/python benchmarks/compare_plain_pml.py [--protocol protocols/omniglot-standard.yaml]
        [--results results/omniglot-standard] [--cell triplet+batch_hard] [--plain LOSS+MINER]
        [--param loss.margin=0.2] [--iterations N] [--seeds 0 1 2] [--out FILE.csv]

With ``--out`` each arm's scores join a CSV as soon as the arm ends, and a
rerun of the same command skips the arms it holds (the same protocol,
bench code, precision, cell, plain method, iterations and parameters; rows
of any other comparison in the file are kept as they are): a comparison of
hours goes on across sessions, and its summary is over every seed asked for.

Each metric's harness - plain difference is judged by its Welch interval:
above, BELOW, or no difference shown. Exit: 0; 1 when an interval lies
wholly below 0 (the harness worse than the plain script); 2 on bad input.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the plain script beside this file

import plain_pml_script  # noqa: E402

from bench.atomic import locked, write_text  # noqa: E402
from bench.commands.train import parse_params  # noqa: E402
from bench.data import load, load_lake_runs  # noqa: E402
from bench.devices import describe as describe_device  # noqa: E402
from bench.errors import BenchError  # noqa: E402
from bench.evaluation import evaluate, scoring_precision
from bench.plan import Cell, plan  # noqa: E402
from bench.protocol import Protocol, load_protocol  # noqa: E402
from bench.resume import code_digest  # noqa: E402
from bench.stats import Difference, t_interval, welch  # noqa: E402
from bench.sweep import tables as result_tables  # noqa: E402
from bench.sweep.tuning import final_config  # noqa: E402
from bench.training import TrainConfig, train  # noqa: E402

CELL = "triplet+batch_hard"
METRICS = ("lake_accuracy", "map_at_r")
# What makes two rows one comparison's; ``code``: bench's sources (`bench.resume.code_digest`), so that a
# comparison resumed after the package changed trains its remaining arms anew rather than mix two codes' scores
KEY = ("protocol_hash", "code", "precision", "cell", "plain", "iterations", "params")
FIELDS = (*KEY, "seed", "arm", *METRICS, "seconds", "device")


def tuned_params(results: str | None, cell: str, given: dict[str, Any]) -> dict[str, Any]:
    """The cell's best-trial parameters from a results directory (none: the defaults), ``given`` on top."""
    params: dict[str, Any] = {}
    if results is not None:
        summary = result_tables.read(results)["summary"]
        rows = summary[summary["cell"] == cell] if "cell" in summary else summary.iloc[0:0]
        if rows.empty:
            raise BenchError(f"{results}: no summary row for cell {cell}")
        params = json.loads(rows.iloc[0]["params"])
    return {**params, **given}


def as_trained(protocol: Protocol, results: str | None) -> Protocol:
    """The protocol in the precision its sweep trained in: a fixed one as it says; ``auto`` as the sweep's
    manifest in ``results`` records it (chosen at the sweep's start), which the harness arm must match."""
    if not protocol.precision_auto:
        return protocol
    manifest = Path(results or "") / "manifest.json"
    chosen = json.loads(manifest.read_text()).get("precision") if manifest.is_file() else None
    if not chosen or chosen.get("setting") != "auto":
        raise BenchError(
            f"{protocol.name} says precision: auto: give --results of its sweep, whose manifest records the "
            "precision chosen at its start"
        )
    return protocol.with_precision(chosen["precision"], bool(chosen["channels_last"]))


def budget(protocol: Protocol, results: str | None, cell: str, given: int | None) -> int:
    """The iterations both arms train: ``given``; else under early stopping the length the cell's final seeds
    trained (finals.csv of ``results``: a final seed has no validation classes and trains as long as its
    cell's best trial did); else the protocol's iterations."""
    if given is not None:
        return given
    if not protocol.spec.training.early_stopping:
        return protocol.spec.training.iterations
    if results is None:
        raise BenchError(
            f"{protocol.name} early-stops its runs: give --results of its sweep (the cell's final seeds' length is "
            "the budget) or --iterations"
        )
    finals = result_tables.read(results)["finals"]
    rows = finals[(finals["cell"].astype(str) == cell) & (finals["state"].astype(str) == "COMPLETE")]
    if rows.empty:
        raise BenchError(f"{results}: no completed final seed of cell {cell}")
    return int(rows["iterations"].max())


def plain_method(cell: Cell) -> plain_pml_script.Method:
    """The cell's own method in PML: its loss and miner, when their fixed parameters are all PML's defaults
    (``normalize``, which every counterpart's distance does, aside); else one line saying to name one."""
    fixed = {k: v for k, v in {**cell.loss_params, **cell.miner_params}.items() if k != "normalize"}
    method = (cell.loss, cell.miner)
    if fixed or method not in plain_pml_script.PLAIN:
        why = f"fixes {fixed}, which PML's defaults do not" if fixed else "has no counterpart in PML"
        raise BenchError(f"cell {cell.id} {why}: name the plain arm's method with --plain LOSS+MINER")
    return method


def harness_config(
    protocol: Protocol, cell_id: str, params: dict[str, Any], seed: int, iterations: int | None
) -> TrainConfig:
    """Final seed ``seed`` of the cell as the runner would train it, at ``iterations`` if given. Under early
    stopping the runner keeps the whole budget's schedule and stops the final at its length (`harness_run`'s
    ``stop_after``), so the configuration keeps the protocol's iterations."""
    cell = plan(protocol).cell(cell_id)
    config = final_config(protocol, cell, params, seed)
    if iterations is None or protocol.spec.training.early_stopping:
        return config
    return dataclasses.replace(config, iterations=iterations)


def harness_run(
    config: TrainConfig, protocol: Protocol, lake_runs: list[Any], stop_after: int | None = None
) -> dict[str, float]:
    """Train on the protocol's training classes and score the test classes as a final seed is scored."""
    data = protocol.spec.data
    train_data = load(data.train, None, data.image_size)
    test_data = load(data.test, None, data.image_size)
    result = train(config, train_data, stop_after=stop_after)
    with scoring_precision(protocol.spec):
        return evaluate(
            result.model, test_data, lake_runs=lake_runs, clustering=False, normalize=protocol.spec.model.normalize
        )


def recorded(out: Path | None, key: dict[str, str]) -> dict[tuple[int, str], dict[str, float]]:
    """The arms ``out`` already holds under this comparison's ``key``, by (seed, arm); none without a file.
    A harness arm is the cell's own run whatever the plain arm it is set against, so one recorded beside
    another plain method (``plain`` the only part of the key that differs) is this comparison's too."""
    if out is None or not out.is_file():
        return {}
    with out.open(newline="") as f:
        reader = csv.DictReader(f)
        lacking = [c for c in FIELDS if c not in (reader.fieldnames or [])]
        if lacking:
            raise BenchError(f"{out}: not a record of this comparison (no column {', '.join(lacking)})")
        rows = [r for r in reader if all(r[k] == v for k, v in key.items() if k != "plain" or r["arm"] != "harness")]
    return {(int(r["seed"]), r["arm"]): {name: float(r[name]) for name in METRICS} for r in rows}


def writable(out: Path) -> None:
    """Refuse a record file that could not be written, before an arm trains for an hour and loses its score."""
    folder = out.parent
    if not folder.is_dir():
        raise BenchError(f"--out {out}: no folder {folder}")
    if not os.access(folder, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise BenchError(f"--out {out}: not writable")


def record(out: Path, row: dict[str, Any]) -> None:
    """``row`` joins ``out``, the file rewritten whole under a lock (a kill leaves it as it was or with the row)."""
    with locked(f"{out}.lock"):
        old = out.read_text() if out.is_file() else ""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
        if not old:
            writer.writeheader()
        writer.writerow(row)
        write_text(out, old + buffer.getvalue())


def _summary(name: str, values: list[float]) -> str:
    iv = t_interval(values)
    if len(values) < 2:  # a t-interval needs two values: say so rather than print [nan, nan]
        return f"{name:<10} {iv.mean:.4f} (one seed: no interval)"
    return f"{name:<10} {iv.mean:.4f} [{iv.low:.4f}, {iv.high:.4f}]"


def finding(d: Difference) -> str:
    """What the interval of harness - plain shows, never the point estimate alone: a mean above the plain
    arm's by less than the seeds' noise is no evidence that tuning kept the method at least at its defaults."""
    if not d.testable:
        return "not shown either way (no interval)"
    if d.low > 0:
        return "harness above plain"
    if d.high < 0:
        return "HARNESS BELOW PLAIN"
    return "no difference shown (the interval holds 0)"


def main() -> int:
    """Run both arms seed by seed, print each score, then the means and the harness - plain differences.
    Exit 1 when an interval shows the harness below the plain script (issue 14's rule broken), else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="protocols/omniglot-standard.yaml")
    parser.add_argument("--results", default=None, help="results directory whose best trial gives the parameters")
    parser.add_argument("--cell", default=CELL)
    parser.add_argument(
        "--plain",
        default=None,
        metavar="LOSS+MINER",
        help="the plain arm's PML method (default: the cell's own), e.g. triplet+batch_hard",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a tuned value, e.g. loss.margin=0.2 (repeatable; over --results)",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="default: the protocol's; under early stopping the cell's final seeds' length in --results",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="CSV of every arm's scores; a rerun skips those in it")
    args = parser.parse_args()
    if args.out is not None:
        writable(args.out)
    torch.set_num_threads(args.threads)
    protocol = as_trained(load_protocol(args.protocol), args.results)
    training, data = protocol.spec.training, protocol.spec.data
    if (data.train, data.test, data.image_size) != ("omniglot:background", "omniglot:evaluation", 28):
        raise BenchError(
            f"{args.protocol}: the plain script trains on omniglot:background and tests on "
            "omniglot:evaluation at 28x28; this protocol does not"
        )
    planned = plan(protocol)
    if planned.budget.final_mode == "folds":
        raise BenchError(f"{args.protocol}: its final seeds are fold models joined (final.mode: folds), not one run")
    try:
        cell = planned.cell(args.cell)
    except KeyError:
        raise BenchError(f"{args.protocol}: no cell {args.cell} in its plan") from None
    method = plain_pml_script.parse_method(args.plain) if args.plain else plain_method(cell)
    params = tuned_params(args.results, args.cell, parse_params(tuple(args.param), "--param"))
    iterations = budget(protocol, args.results, args.cell, args.iterations)
    stop_after = iterations if training.early_stopping else None
    batch = training.batch_size
    print(
        f"{iterations} iterations of {training.P} x {training.K} = {batch}; harness cell {args.cell} "
        f"with {params or 'its defaults'}; plain PML {plain_pml_script.PLAIN[method][0]}; {args.threads} thread(s)"
    )
    trains = harness_config(protocol, args.cell, params, 0, iterations)  # the precision the harness arm trains in
    key = {
        "protocol_hash": protocol.hash,
        "code": code_digest()[:12],
        "precision": f"{trains.precision}{'+channels_last' if trains.channels_last else ''}",
        "cell": args.cell,
        "plain": plain_pml_script.method_name(method),
        "iterations": str(iterations),
        "params": json.dumps(params, sort_keys=True),
    }
    done = recorded(args.out, key)
    lake_runs = load_lake_runs(None, 28)
    scores: dict[str, dict[str, list[float]]] = {arm: {m: [] for m in METRICS} for arm in ("plain", "harness")}
    print("seed  arm      lake_accuracy  map_at_r  seconds")
    for seed in args.seeds:
        for arm in ("plain", "harness"):
            start = time.perf_counter()
            m = done.get((seed, arm))
            if m is None:
                if arm == "plain":
                    m = plain_pml_script.main(iterations, seed, batch, training.K, method=method)
                else:
                    config = harness_config(protocol, args.cell, params, seed, iterations)
                    m = harness_run(config, protocol, lake_runs, stop_after)
                took = f"{time.perf_counter() - start:>7.0f}"
                if args.out is not None:
                    row = {**key, "seed": seed, "arm": arm, **{n: repr(float(m[n])) for n in METRICS}}
                    record(args.out, {**row, "seconds": took.strip(), "device": describe_device("cpu")})
            else:
                took = f"{'in ' + args.out.name if args.out else '':>7}"
            for name in METRICS:
                scores[arm][name].append(float(m[name]))
            print(f"{seed:>4}  {arm:<7}  {m['lake_accuracy']:>13.4f}  {m['map_at_r']:>8.4f}  {took}", flush=True)
    below = False
    for name in METRICS:
        d = welch(scores["harness"][name], scores["plain"][name])
        print(f"\n{name} (mean [95% t-interval over {len(args.seeds)} seeds])")
        print(_summary("plain", scores["plain"][name]))
        print(_summary("harness", scores["harness"][name]))
        spread = f"[{d.low:+.4f}, {d.high:+.4f}] (Welch)" if len(args.seeds) > 1 else "(one seed: no interval)"
        shown = finding(d)
        print(f"harness - plain: {d.diff:+.4f} {spread}; {shown}")
        below = below or shown == "HARNESS BELOW PLAIN"
    return 1 if below else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as error:  # bad input: one line and the CLI's exit code (2), no traceback
        print(f"compare_plain_pml: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
