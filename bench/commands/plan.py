"""`dmlbench plan FILE`: the cells a protocol expands to, what is dropped and why, and the budget.

No data is loaded and nothing is trained: this is the look before the
sweep, showing that every cell gets the same trials and iterations, what
each cell tunes, and about how long the whole sweep takes on this machine,
from a few training steps of the protocol's trunk timed here on random
inputs (`bench.plan.measure`; ``--no-measure`` uses the built-in table).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import click

from bench.clock import hms
from bench.commands._output import emit, format_option, quiet_option
from bench.errors import BenchError
from bench.plan import NOT_SELECTED, plan
from bench.plan.cost import DATASET_SIZES, STEP_FIXED_S, SWEEP_FIXED_S, dataset_size, sized_test, trunk_cost
from bench.plan.space import describe_space
from bench.protocol import load_protocol
from bench.spec import Spec, TrainingSpec
from bench.sweep.kept import kept_bytes
from bench.sweep.preflight import inspect

if TYPE_CHECKING:
    from bench.plan import Plan


def rows(p: Plan) -> list[dict[str, Any]]:
    """One row per cell, planned or dropped; a dropped one carries its reason and no budget."""
    out: list[dict[str, Any]] = []
    for c in p.cells:
        b = p.budget.for_cell(c)
        e = p.estimates.get(c.id)
        out.append(
            {
                "cell": c.id,
                "status": "planned",
                "trials": b.trial_count // b.draws,
                "folds": b.folds,
                "iterations_per_run": b.iterations,
                "seeds": b.seeds,
                **({"seeds_min": b.seeds_min, "iterations_min": b.min_total_iterations} if b.adaptive_seeds else {}),
                **({"rungs": [list(r) for r in b.rungs]} if b.rungs else {}),
                "draws": b.draws,
                "iterations": b.total_iterations,
                "samples_max": b.samples_seen,
                "est_time_s": None if e is None else round(e.mid_s, 1),
                "method_ms": round(p.method_s[c.id] * 1000, 3) if c.id in p.method_s else None,
                "search_space": c.search_space,
                "reason": "",
            }
        )
    out += [{"cell": d.cell, "status": "dropped", "reason": d.reason} for d in p.dropped]
    return out


def _kept_line(p: Plan) -> str:
    """What the sweep keeps of its final seeds (`bench.sweep.kept`): each one's model and test embeddings, their
    size, and the key that turns it off."""
    if not p.protocol.spec.final.keep_models:
        return "kept: no final model or embeddings (final.keep_models: false)"

    data = p.protocol.spec.data
    _, images = dataset_size(sized_test(data.test_spec), data.test_classes)
    model, embeddings = kept_bytes(p.protocol, images)
    seeds = len(p.cells) * p.budget.final_count
    if images:
        said = f"{_mb(model)} model + {_mb(embeddings)} test embeddings, {_mb((model + embeddings) * seeds)}"
    else:  # a dataset plan does not know the size of: the embeddings' share is known once the data are read
        unknown = "the test embeddings (a test set of a size not known here)"
        said = f"{_mb(model)} model + {unknown}, {_mb(model * seeds)} + embeddings"
    return (
        f"kept as MLflow artifacts (final.keep_models; false keeps none): each final seed's model and test "
        f"embeddings, {said} for {seeds} final seeds (bench.sweep.kept.load_final reads one back)"
    )


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.0f} kB"


def _unsearched_lines(p: Plan) -> list[str]:
    """What the cells that search nothing get: one trial each (``tuning.unsearched: one``), or ``tuning.trials``
    trials that differ by seed alone, whose best is the luckiest seed's (said, with the key that changes it)."""
    cells = [c.id for c in p.cells if not c.search_space]
    if not cells:
        return []
    b = p.budget
    if b.unsearched_one:
        return ["", f"searching nothing, one tuning trial each (tuning.unsearched: one): {', '.join(cells)}"]
    if b.trials == 1:
        return []
    return [
        "",
        f"searching nothing: {', '.join(cells)}: their {b.trials} trials each differ by seed alone, so the "
        "best is the luckiest seed's validation score (tuning.unsearched: one runs one trial instead)",
    ]


def _draw_budget(b: Any) -> str:
    """One tuning draw's budget of a cell, in words: its trials (or rungs), then its final seeds (or range)."""
    count = f"{b.seeds_min} to {b.seeds}" if b.adaptive_seeds else f"{b.seeds}"
    finals = f"{count} seeds x {b.final_runs} fold models" if b.final_runs > 1 else f"{count} seeds"
    if b.rungs:
        tuning = "(" + " + ".join(f"{n} x {it:,}" for n, it in b.rungs) + f") x {b.folds} fold(s)"
    else:
        tuning = f"{b.trials} trials x {b.folds} fold(s) x {b.iterations:,} iterations"
    return f"{tuning} + {finals} x {b.iterations:,} iterations"


def _tuning_text(spec: Spec, b: Any) -> str:
    """The tuning line's start: the trials, or successive halving's rungs (`bench.plan.rungs`)."""
    strategy = spec.tuning.strategy
    if strategy is None:
        return f"tuning: {b.trials} Optuna trials per cell (seeded TPE), pruner {spec.tuning.pruner.type}"
    rungs = ", ".join(f"{n} x {it:,}" for n, it in b.rungs)
    eta = strategy.eta
    return (
        f"tuning: synchronous successive halving (eta {eta}), {b.trials} configurations (seeded TPE) at rung 0; "
        f"rungs (configurations x iterations): {rungs}; the same rungs and {b.tuning_iterations:,} tuning "
        "iterations in every cell; a promoted configuration retrained from its start (its shorter run repeated)"
    )


def _final_text(spec: Spec, b: Any) -> str:
    """The final seeds in words: the list, or a range with its stopping precision (`bench.plan.seeds`)."""
    if not b.adaptive_seeds:
        return f"final: seeds {', '.join(map(str, spec.final.seeds))}"
    return (
        f"final: seeds 0, 1, ... in order, at least {b.seeds_min} and at most {b.seeds}, stopping once the 95% "
        f"interval of {spec.evaluation.primary} has a half-width of at most {b.half_width:g}"
    )


def _not_nan(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and value != value:  # NaN passes every range comparison
        raise click.BadParameter("expected a number, got nan")
    return value


@click.command("plan")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--step-ms",
    type=click.FloatRange(min=0, max=3.6e6, min_open=True),
    default=None,
    callback=_not_nan,
    help="a training step's time measured on your device (benchmarks/bench_trunk_step.py), "
    "at the protocol's batch and image size: replaces the step timed here (or the built-in table)",
)
@click.option(
    "--loader-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    callback=_not_nan,
    help="images a second your data loader delivers (benchmarks/bench_loader.py's loader or cache row, "
    "with the workers the run gets): a training step then takes at least a batch's loading time",
)
@click.option(
    "--data-root",
    default=None,
    help="folder holding the datasets, for timing the training loader on image files (default: "
    "$DMLBENCH_DATA, ../shared/data)",
)
@click.option(
    "--measure/--no-measure",
    default=True,
    show_default=True,
    help="time a few training steps and embeddings of the protocol's trunk on this machine (a few "
    "seconds) for the estimate; --no-measure uses the built-in per-trunk table (one reference "
    "machine's figures). A CUDA protocol on a machine without CUDA keeps the table. For image files it also "
    "times the training loader here (its workers, without the decoded-image cache), unless --loader-rate",
)
@click.option(
    "--threads",
    default=None,
    type=click.IntRange(min=1),
    help="torch CPU threads to time the trunk on: pass what `run --threads` will get (default: "
    "torch's, as `run` without --threads)",
)
@click.option(
    "--budget-check",
    "check_multiple",
    type=click.IntRange(min=0, max=1000),
    default=0,
    show_default=True,
    help="add a budget check at this whole multiple of the budget to the estimate, as `dmlbench "
    "budget-check --multiple` trains it (0: none)",
)
@click.option(
    "--time-methods",
    is_flag=True,
    help="time each cell's loss and miner on batches of the protocol's shape (a few seconds) and add "
    "them to its steps: a method that costs more than the trunk is named",
)
@click.option(
    "--stop-at",
    type=click.IntRange(min=1),
    default=None,
    help="under training.early_stopping: also estimate the sweep when every run stops at this many "
    "iterations (a typical case; default: the earliest a run can stop, check_every x (patience + 1)); "
    "the main estimate is the maximum, every run trained to the budget",
)
@format_option
@quiet_option
def command(
    file: str,
    step_ms: float | None,
    loader_rate: float | None,
    stop_at: int | None,
    data_root: str | None,
    measure: bool,
    threads: int | None,
    check_multiple: int,
    time_methods: bool,
    fmt: str,
    quiet: bool,
) -> int:
    """Expand protocol FILE into cells (loss x miner), print dropped pairs, search spaces, budget and time estimate.

    The estimate is wall time on this machine for a CPU protocol and GPU-hours for a CUDA one, from the
    protocol's trunk timed here (a few seconds; --no-measure: a built-in table)."""
    from bench.data import check_path
    from bench.data.query_gallery import test_specs

    protocol = load_protocol(file)
    d = protocol.spec.data
    for spec in (d.train, *test_specs(d.test_spec)):
        check_path(spec)  # no class count for data that does not exist
    # what `validate --no-data` refuses (bench.sweep.preflight), a dead search parameter among it: it would
    # waste the budget. A device this machine lacks matters only to --time-methods, which times on it.
    found = inspect(protocol, data=False)
    refused = [p for p in found.problems if not p.note or time_methods]
    if refused:
        first = refused[0]
        raise BenchError(
            f"--time-methods times on the protocol's device: {first.message}" if first.note else first.message
        )
    p = plan(
        protocol,
        None if step_ms is None else step_ms / 1000,
        check_multiple,
        time_methods,
        measure=measure,
        threads=threads,
        loader_rate=loader_rate,
        stop_at=stop_at,
        data_root=data_root,
    )
    emit(fmt, lambda: format_plan(p, stop_given=stop_at is not None), lambda: rows(p))
    return 0


def lacks_amx(cpuinfo: str) -> bool:
    """Whether an x86 CPU's /proc/cpuinfo text shows no AMX bf16 units (False where it lists no flags).

    The CPU step costs in `TRUNK_COSTS` are fp32's. bf16 + channels-last speeds a step up about 2x more
    with AMX's bf16 units than without them, where it barely beats fp32 + channels-last
    (`benchmarks/bench_precision.py`, benchmarks/README.md): whether a bf16 sweep fits the time at hand
    depends on it."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return "amx_bf16" not in line.split(":", 1)[-1].split()
    return False


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def format_plan(p: Plan, cpuinfo: str | None = None, stop_given: bool = False) -> str:
    """The plan as `dmlbench plan` prints it: data, model, budget, cells, dropped pairs, time.

    ``cpuinfo`` (default: this machine's /proc/cpuinfo) decides the note on bf16 without AMX; ``stop_given``:
    the early-stopping length of ``Plan.stopped`` was the user's (`--stop-at`), not the earliest stop."""
    from bench.data.query_gallery import describe

    spec, b = p.protocol.spec, p.budget
    data, model, training, val = spec.data, spec.model, spec.training, spec.data.validation

    def classes(spec: str, given: Any) -> str:
        if isinstance(given, list):
            return f"{len(given)} classes"
        if isinstance(given, int):
            return f"{given} classes (seeded sample)"
        known = DATASET_SIZES.get(spec)
        return f"all {known[0]} classes" if known else "all classes"

    split = data.split
    sides = (
        f"train {data.train} ({classes(data.train, data.train_classes)}), "
        f"test {describe(data.test_spec)} ({classes(sized_test(data.test_spec), data.test_classes)}), "
        if split is None
        else f"pool {data.train} split {split.test_classes} of the classes for test (seed {split.seed}), "
    )
    lines = [
        f"protocol {p.protocol.name} (hash {p.protocol.hash12}) from {p.protocol.source}",
        f"data: {sides}"
        f"{'x'.join(map(str, data.hw))}, augmentation {data.augmentation or 'none'}"
        f"{_augment_text(data.augment)}",
        f"validation: {val.folds} class-disjoint folds of the training classes"
        f"{' by ' + val.group_by if val.group_by else ''}, {val.use} used per trial",
        f"model: {model.trunk}, {model.embedding_dim}-d embedding, "
        f"{'L2-normalised' if model.normalize else 'not normalised'}, distance {model.distance or 'per method'}",
        f"training: {training.optimizer} lr {training.lr:g}, batch P x K = {training.P} x {training.K} = "
        f"{b.batch_size}, {b.iterations} iterations a run",
        _tuning_text(spec, b)
        + (
            f", repeated in {b.draws} independent draws (tuning.repeats), each draw's winner tested on the final "
            "seeds; intervals and tests over the draws' means"
            if b.draws > 1
            else ""
        )
        + "; "
        + _final_text(spec, b)
        + (
            f", each {b.final_runs} fold models scored alone (separate) and concatenated"
            if b.final_runs > 1
            else ", each retrained on every training class"
        )
        + f"; primary metric {spec.evaluation.primary}",
        "",
        f"cells ({len(p.cells)}):",
    ]
    width = max([len(c.id) for c in p.cells] + [4])
    timed = bool(p.method_s)
    lines.append(
        f"  {'cell':<{width}}  trials  folds  iters/run  seeds  iterations  samples(max)  est. time"
        + ("  loss+miner ms" if timed else "")
    )
    for c in p.cells:
        e = p.estimates[c.id]
        method = p.method_s.get(c.id)
        cb = b.for_cell(c)
        lines.append(
            f"  {c.id:<{width}}  {cb.slots:>6}  {cb.folds:>5}  {cb.iterations:>9}  {cb.seeds:>5}  "
            f"{cb.total_iterations:>10,}  {cb.samples_seen:>12,}  {hms(e.mid_s)}"
            + (f"  {'-' if method is None else f'{method * 1000:.3g}':>13}" if timed else "")
        )
    lines += [
        "",
        "search spaces (what each cell's trials tune; [low, high], log: sampled on a log scale, {...}: choices):",
    ]
    lines += [f"  {c.id:<{width}}  {describe_space(c.search_space)}" for c in p.cells]
    lines += _unsearched_lines(p)
    if p.dropped:
        lines += ["", f"dropped ({len(p.dropped)}):"]
        lines += [f"  {d.cell}: {d.reason}" for d in p.dropped if d.reason != NOT_SELECTED]
        unselected: dict[str, list[str]] = {}
        for d in p.dropped:
            if d.reason == NOT_SELECTED:
                loss, miner = d.cell.split("+", 1)
                unselected.setdefault(loss, []).append(miner)
        lines += [f"  {loss}+{{{', '.join(miners)}}}: {NOT_SELECTED}" for loss, miners in unselected.items()]
    e = p.estimate
    trunk = spec.model.trunk
    cost = p.cost or trunk_cost(p.protocol)
    note = cost.source or ("" if cost.measured else "not measured: scaled from conv4")
    if p.cost_note:
        note = f"{note}; {p.cost_note}" if note else p.cost_note
    step = f"{cost.step_s[0] * 1000:.3g}" + (
        "" if cost.step_s[0] == cost.step_s[1] else f"-{cost.step_s[1] * 1000:.3g}"
    )
    h, w = cost.ref_hw or (math.isqrt(cost.ref_pixels),) * 2
    basis = f"{trunk} step {step} ms at {h}x{w}, batch {cost.ref_batch}" + (f", {note}" if note else "")
    gpu = str(training.device).startswith("cuda")
    span = e.high_s > e.low_s * 1.001
    where = (
        f"estimated GPU time{{check}}: {e.mid_s / 3600:,.1f} GPU-hours on one GPU ("
        + (f"{e.low_s / 3600:,.1f} to {e.high_s / 3600:,.1f}; " if span else "")
        if gpu
        else f"estimated time on this machine{{check}}: {hms(e.mid_s)} ("
        + (f"{hms(e.low_s)} to {hms(e.high_s)}; " if span else "")
    )
    check = (
        f", with a budget check at {p.check_multiple:g}x the finals ({b.seeds} seeds x "
        f"{round(p.check_multiple * b.iterations):,} iterations a cell)"
        if p.check_multiple
        else ""
    )
    single = [c for c in p.cells if b.trials_for(c) != b.trials]
    lines += [
        "",
        "budget, the same for every cell"
        + (f" that searches something ({len(single)} searching nothing: one trial each)" if single else "")
        + ": "
        + (f"{b.draws} draws x ({_draw_budget(b)}) " if b.draws > 1 else f"{_draw_budget(b)} ")
        + (
            f"= {b.min_total_iterations:,} to {b.total_iterations:,} iterations (a seed range: its minimum to its "
            f"maximum) "
            if b.adaptive_seeds
            else f"= {b.total_iterations:,} iterations "
        )
        + f"(at most {b.samples_seen:,} samples)",
        f"total: {len(p.cells)} cells, {sum(b.trial_count_for(c) for c in p.cells)} trials, {sum(b.for_cell(c).tuning_runs for c in p.cells)} tuning "
        f"runs, {len(p.cells) * b.final_count * b.final_runs} final runs"
        + (
            f" at most ({len(p.cells) * b.min_final_count * b.final_runs} at least), "
            f"{len(p.cells) * b.min_total_iterations:,} to {p.total_iterations:,} iterations"
            if b.adaptive_seeds
            else f", {p.total_iterations:,} iterations"
        ),
        where.format(check=check) + f"{basis})",
        _kept_line(p),
        _assumptions(p, cost, gpu),
    ]
    if p.at_min is not None:
        least = p.at_min
        took = f"{least.mid_s / 3600:,.1f} GPU-hours" if gpu else hms(least.mid_s)
        lines.append(
            f"seed range: the estimate above is the maximum, every cell to {b.seeds} seeds; if every cell stops at "
            f"{b.seeds_min}: {took}"
        )
    if p.stopped is not None:
        at, short = p.stopped
        when = "(--stop-at)" if stop_given else "(the earliest a run can stop: check_every x (patience + 1))"
        took = f"{short.mid_s / 3600:,.1f} GPU-hours" if gpu else hms(short.mid_s)
        lines.append(
            f"early stopping: the estimate above is the maximum, every run trained to {b.iterations:,} iterations; "
            f"if every run stops at {at:,} iterations {when}: {took}"
        )
    if not gpu and cost.slowdown > 1.05:  # the load then decides the wall time: what the work itself costs
        lines.append(
            f"at the machine's load then the step ran {cost.slowdown:.1f}x its CPU time: the same work on an idle "
            f"machine takes about {hms(e.mid_s / cost.slowdown)}, the run's CPU time (a load that falls or rises "
            f"during the run moves the wall time between the two)"
        )
    if timed:
        lines.append(
            f"loss+miner: timed here on one thread, random {b.batch_size}-sample batches (early training, "
            f"an upper bound where mining shrinks), added to every step of the cell"
        )
        ph, pw = data.hw  # the trunk's step at the protocol's batch and image size
        step_s = cost.step_s[0] * (b.batch_size / cost.ref_batch) * (ph * pw / cost.ref_pixels)
        slow = [(c, s) for c, s in p.method_s.items() if s > step_s]
        lines += [
            f"note: {c}'s loss and miner take {s * 1000:.3g} ms a step, {s / step_s:.1f}x the trunk's "
            f"{step_s * 1000:.3g} ms: this cell costs more than the others"
            for c, s in slow
        ]
    if p.precision_note:
        lines.append(f"note: {p.precision_note}")
    if p.loader_note:
        lines.append(f"note: {p.loader_note}")
    if not gpu and training.precision == "bf16" and cost.source != "--step-ms" and cost.threads is None:
        amx = "has no AMX" if lacks_amx(_cpuinfo() if cpuinfo is None else cpuinfo) else "has AMX or is not x86"
        lines.append(
            f"note: the step time above is fp32's; bf16 + channels-last measured 2.1-2.5x faster on a "
            f"CPU with AMX, 1.2x on one without (this CPU {amx}): time a step with "
            f"benchmarks/bench_precision.py and pass --step-ms"
        )
    return "\n".join(lines)


def _assumptions(p: Plan, cost: Any, gpu: bool) -> str:
    """What the estimate rests on: where the trunk's step comes from, and what was not timed."""
    training = p.protocol.spec.training
    if cost.threads is not None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        step = (
            f"the trunk's training step ({training.precision}"
            f"{', channels-last' if _channels_last(training) else ''}, forward + backward + "
            f"{training.optimizer} step) and its embedding (no gradient) as timed here just now on random "
            + (
                "inputs; "
                if gpu
                else f"inputs on {cost.threads} CPU thread(s) (pass `run --threads {cost.threads}` to match), with "
                f"this machine's load then ({load:.1f} on {os.cpu_count()} cores): a busier machine is slower; "
                f"the step ran {cost.slowdown:.1f}x its CPU time, and the figures not timed (below) are "
                f"stretched by that; "
            )
        )
    elif cost.source == "--step-ms":
        step = "the step time given (--step-ms), an embedding scaled from the table; "
    else:
        step = (
            "the built-in per-trunk table (one reference machine's figures, scaled to this batch and image "
            "size: 2-3x off on another machine; `dmlbench plan` without --no-measure times it here); "
        )
    method = "timed above" if p.method_s else f"{STEP_FIXED_S * 1000:g} ms a step; --time-methods times them"
    reading = (
        ""
        if p.loader_note.startswith("loader:")
        else "reading the data a step (in memory: nothing; --loader-rate for image files), "
    )
    return (
        f"assumes: {step}not timed: the loss and miner ({method}), {reading}the metrics (fixed per-pair and "
        f"k-means figures), the records (MLflow, Optuna: "
        f"fixed figures a run), and once a sweep {SWEEP_FIXED_S:g} s of start-up, data loading and opening "
        f"the stores, plus the floor"
    )


def _channels_last(training: TrainingSpec) -> bool:
    setting = training.channels_last
    return training.precision != "fp32" if setting is None else bool(setting)


def _augment_text(augment: dict[str, Any] | None) -> str:
    """``data.augment``'s pipelines, one name list per side (their arguments are in the protocol)."""
    if not augment:
        return ""
    return "".join(
        f", {side} pipeline {' > '.join(next(iter(item)) for item in items)}" for side, items in augment.items()
    )
