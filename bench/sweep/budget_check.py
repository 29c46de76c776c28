"""The budget check: each cell's tuned configuration retrained at a multiple of the budget, to see whether
the table was converged.

A leaderboard ranks methods at one training budget. If a method is still
improving when the budget ends, the ranking says which one learns fastest,
not which one learns best, and no harness of the field says which it was.
After a finished run, the budget check retrains every cell's final
configuration (the best trial's parameters, exactly those the finals used)
at ``multiple`` times ``training.iterations``, with the same final seeds
(common random numbers: the same initial trunk and the same batch order, the
first ``iterations`` batches identical to the finals'), by the finals' own
run (`bench.sweep.final_run.train_final`: the multiple is its one difference
in training and scoring). The reports then pair each seed with its final
(bench.reports.budget): the change of the primary metric per cell and
Kendall's tau between the two rankings.

What scales with the multiple (`bench.sweep.final_run.final_run_config`): the
iterations, and the schedule's warm-up (in iterations), so the learning-rate
schedule keeps its shape (its milestones and cosine are already fractions of
the budget). What does not:
the method's own parameters, even those counted in iterations (an offline
miner's ``refresh_every``, MargOHNM's warm-up): they are the tuned method,
and the check asks how that method does with more training.

Records: ``budget_check.csv`` in the results directory (one row per cell,
seed and multiple; bench.sweep.tables names the file), rewritten whole through
a temp file and a rename after every seed under a file lock, so a killed
check leaves every finished seed recorded and no half row; and one MLflow
run per row (kind ``budget_check``), found by its key, so a leaderboard
rebuilt from MLflow has it too. Rows and runs are keyed by the cell's key
(`bench.plan.cell_key`): a cell added to the protocol since is checked, the
others keep their rows. Resume: run the same command; rows already
in the file under the cell's current key and parameters are
kept, the rest are trained (a cell run again with ``run --redo`` since is
checked again).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from bench.atomic import locked, write_with
from bench.devices import describe as describe_device
from bench.errors import BenchError
from bench.plan import Cell, cell_key
from bench.plan import plan as make_plan
from bench.protocol import Protocol
from bench.resume import FOLDER as RESUME_DIR
from bench.resume import RunState, state_path
from bench.stores import provenance, tracking
from bench.stores.mlflow_runs import MlflowRecords
from bench.stores.urls import redact, sqlite_path
from bench.sweep import tables
from bench.sweep.accounts import STOP, TimeUp
from bench.sweep.final_run import FinalRun, Record, train_final
from bench.sweep.precision import recorded_choice
from bench.sweep.preflight import refuse
from bench.sweep.progress import Progress
from bench.sweep.records import collect, metric_names
from bench.sweep.tuning import open_storage
from bench.sweep.worker import default_storage

RUN_COLUMNS = ["protocol_hash", "cell_key", "cell", "seed", "multiple", "iterations", "samples_seen", "wall_time_s"]
TAIL_COLUMNS = ["state", "reason", "params", "git_commit", "git_dirty", "device"]
# a file written before rows named their device: read with the column empty, written back whole
OLD_TAIL = TAIL_COLUMNS[:-1]
# under --stop-after a seed is started only if what it has left, at the pace the records give times one of
# these, ends in time: the cell's own pace is a median of runs under other load; a pace borrowed from other
# cells (the slowest's) may be that of a cheaper method (on the H200 of 2026-11-30 the learned quadruplets took
# 29-37 ms an iteration a worker where FaceNet's semi-hard took 21-28)
FIT_MARGIN = 1.15
BORROWED_MARGIN = 1.4


def columns(protocol: Protocol) -> list[str]:
    """budget_check.csv's columns: the run, the finals' validation score, every test metric, the state."""
    return [*RUN_COLUMNS, f"val_{protocol.primary}", *metric_names(protocol.spec.evaluation), *TAIL_COLUMNS]


@dataclass(frozen=True)
class Tuned:
    """What the finals of one cell ran: the best trial's parameters and its validation score."""

    cell: Cell
    params: dict[str, Any]
    validation: float
    stop_after: int | None = None  # under early stopping: the iterations the finals trained (x the multiple here)


def tuned_cells(protocol: Protocol, results: Path, storage_url: str) -> list[Tuned]:
    """Every cell's final configuration, read from the Optuna storage (the records the tables are rebuilt
    from); refused, one line, unless the run finished: its manifest says so and the storage holds every
    cell's final seeds."""
    manifest = tables.read_manifest(results)
    run = f"run `dmlbench run {protocol.source or protocol.name}` to its end first"
    if manifest is None:
        raise BenchError(f"budget-check: {results} holds no results of {protocol.name}: {run}")
    if manifest.get("shared_hash") != protocol.shared_hash:  # cells added or removed since: still this run
        raise BenchError(
            f"budget-check: {results} holds results of another version of {protocol.name}'s shared settings "
            f"(hash {str(manifest.get('protocol_hash'))[:12]}, the file's is {protocol.hash12}): {run}"
        )
    if protocol.data and manifest.get("data_fingerprint") != protocol.data:
        raise BenchError(
            f"budget-check: {results} holds results of {protocol.name} on other data (data fingerprint "
            f"{str(manifest.get('data_fingerprint') or 'not recorded')[:8]}, the data here "
            f"{protocol.data[:8]}): retraining on these data would not check that run"
        )
    if not manifest.get("finished"):
        raise BenchError(f"budget-check: the run of {protocol.name} in {results} has not finished: {run}")
    db = sqlite_path(storage_url)
    if db is not None and not db.is_file():
        raise BenchError(
            f"budget-check: the Optuna storage {db} does not exist: point --storage at the run's "
            "database (manifest.json names it)"
        )
    plan = make_plan(protocol)
    if plan.budget.adaptive_seeds:
        raise BenchError(
            f"budget-check: {protocol.name}'s final.seeds is a range (a cell's seeds depend on its values): the "
            "budget check retrains a fixed number of seeds; check a copy of the protocol with a fixed final.seeds"
        )
    records = collect(plan, open_storage(storage_url))
    out = []
    for cell in plan.cells:
        finals = [r for r in records.finals if r["cell"] == cell.id]
        if not finals:
            trials = [r for r in records.trials if r["cell"] == cell.id]
            if len(trials) == plan.budget.trial_count_for(cell) and not any(r["state"] == "COMPLETE" for r in trials):
                continue  # no trial completed: the finals retrained nothing, nor does the check
            raise BenchError(
                f"budget-check: the Optuna storage {redact(storage_url)} holds no final seed of "
                f"{cell.id}: point --storage at the run's database, or {run}"
            )
        if len(finals) != plan.budget.seeds:
            raise BenchError(
                f"budget-check: {cell.id} has {len(finals)} of {plan.budget.seeds} final seeds recorded: {run}"
            )
        # every final seed of a cell trained the same length; a failed one stopped earlier: the longest
        stop = max(int(r["iterations"]) for r in finals) if protocol.spec.training.early_stopping else None
        out.append(Tuned(cell, json.loads(finals[0]["params"]), finals[0][f"val_{protocol.primary}"], stop))
    return out


# --------------------------------------------------------------------------- the file


def params_text(params: dict[str, Any]) -> str:
    """Parameters as finals.csv writes them (sorted JSON): a row is about the finals only if they match."""
    return json.dumps(params, sort_keys=True)


def read_rows(path: Path, protocol: Protocol, keys: dict[str, str]) -> list[dict[str, Any]]:
    """The rows of budget_check.csv of the cells of ``keys`` (cell id -> cell key) under those keys: rows of
    a cell trained under an earlier version with the same key are kept (none when the file is absent)."""
    if not path.exists():
        return []
    try:
        frame = pd.read_csv(path, dtype=tables.KEY_DTYPES)
    except (OSError, ValueError) as e:
        raise BenchError(f"{path}: unreadable budget check table ({str(e).splitlines()[0]}); move it aside") from None
    if list(frame.columns) == columns(protocol)[: -len(TAIL_COLUMNS)] + OLD_TAIL:
        frame["device"] = None
    if list(frame.columns) != columns(protocol):
        raise BenchError(f"{path}: not this protocol's budget check table (other columns); move it aside")
    rows = [r for r in frame.to_dict("records") if keys.get(str(r["cell"])) == str(r["cell_key"])]
    return [{**r, "protocol_hash": protocol.hash} for r in rows]


def _key(row: dict[str, Any]) -> tuple[str, int, int]:
    return str(row["cell"]), int(row["seed"]), int(row["multiple"])


def record(path: Path, protocol: Protocol, row: dict[str, Any], keys: dict[str, str]) -> None:
    """Add one finished seed to the file: read, merge (a row with the same cell, seed and multiple is
    replaced), sort (multiple, cell in plan order, seed in protocol order), write through a rename."""
    with locked(path.with_name(path.name + ".lock")):  # two checks on one directory merge, never overwrite
        rows = {_key(r): r for r in read_rows(path, protocol, keys)}
        order = list(keys)
        rows[_key(row)] = row

        def rank(key: tuple[str, int, int]) -> tuple[int, int, int]:
            cell, seed, multiple = key
            return multiple, order.index(cell) if cell in order else len(order), protocol.final_seeds.index(seed)

        frame = pd.DataFrame([rows[k] for k in sorted(rows, key=rank)], columns=columns(protocol))
        write_with(path, lambda f: frame.to_csv(f, index=False))


# --------------------------------------------------------------------------- the check


@dataclass
class CheckOutcome:
    """What one budget check did: rows trained now, rows found recorded, where the file is."""

    path: Path
    trained: int
    kept: int
    wall_time_s: float


def budget_check(
    protocol: Protocol,
    multiple: int = 2,
    *,
    storage: str | None = None,
    tracking_uri: str | None = None,
    results_dir: str | Path = "results",
    data_root: str | None = None,
    quiet: bool = False,
    shard: tuple[int, int] = (1, 1),
    stop_after_s: float | None = None,
) -> CheckOutcome:
    """Retrain every cell's final configuration at ``multiple`` x the budget on the final seeds, resuming.

    ``shard`` (k, n) trains only the k-th of every n (cell, seed) pairs: n workers started with shards
    1/n ... n/n share the check without training a seed twice (the CSV is written under a file lock).

    ``stop_after_s``: this worker's wall-time limit. No seed is started that would end past it at the pace
    this device has shown (`_Check.pace`), so a limited time (a lent GPU's call) trains the longest seeds that
    fit rather than starting ones it cannot finish, whose saved states only that device and code resume; a
    seed still training at the limit is stopped (its state kept). Then `TimeUp`, saying what is left."""
    if stop_after_s is not None and not stop_after_s > 0:
        raise BenchError(f"budget-check: --stop-after must be a positive number of seconds, got {stop_after_s!r}")
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise BenchError(f"budget-check: --multiple must be a positive integer, got {multiple!r}")
    k, n = shard
    if not 1 <= k <= n:
        raise BenchError(f"budget-check: --shard must be K/N with 1 <= K <= N, got {k}/{n}")
    if protocol.spec.final.mode == "folds":
        raise BenchError(
            f"budget-check: {protocol.name} uses final.mode folds (a model per fold); the check retrains "
            "final.mode retrain's seeds only"
        )
    if protocol.spec.tuning.repeats > 1:
        raise BenchError(
            f"budget-check: {protocol.name} repeats its tuning (tuning.repeats: "
            f"{protocol.spec.tuning.repeats}); the check retrains one tuning draw's winners only"
        )
    start = time.perf_counter()
    # what `validate` and `run` refuse (bench.sweep.preflight), the data loaded on the way
    prepared = refuse(
        protocol, data_root=data_root, stores=True, storage=storage, tracking_uri=tracking_uri, results_dir=results_dir
    ).prepared
    protocol = protocol.with_data(prepared.data_fingerprint())  # the run's records are keyed by its data too
    results = tables.protocol_dir(results_dir, protocol.name)
    storage_url = storage or default_storage()
    tracking_uri = tracking.resolve_tracking_uri(tracking_uri)
    cells = tuned_cells(protocol, results, storage_url)
    manifest = tables.read_manifest(results) or {}
    if protocol.precision_auto:  # the run's precision, chosen at its start: the check trains in it too
        chosen = recorded_choice(protocol, open_storage(storage_url)) or manifest.get("precision")
        if not chosen or chosen.get("precision") in (None, "auto"):
            raise BenchError(
                f"budget-check: the run of {protocol.name} recorded no precision for `precision: auto` "
                "(neither its Optuna storage nor its manifest): run it again with this version of dmlbench"
            )
        protocol = protocol.with_precision(chosen["precision"], bool(chosen["channels_last"]))
    fingerprints = prepared.fingerprints()
    for side in ("train", "test"):
        ran = (manifest.get("fingerprints") or {}).get(side)
        if ran is not None and ran != fingerprints[side]:
            raise BenchError(
                f"budget-check: the {side} data differ from the run's (fingerprint {fingerprints[side]}, "
                f"the run's {ran}): check --data-root"
            )
    path = results / tables.BUDGET_CHECK
    ran = {t.cell.id: params_text(t.params) for t in cells}
    # a row trained with other parameters (the cell was --redo'ne since) is stale: trained again, then replaced
    keys = {t.cell.id: cell_key(protocol, t.cell) for t in cells}
    done = {_key(r) for r in read_rows(path, protocol, keys) if r["params"] == ran.get(str(r["cell"]))}
    pairs = [(t, s) for t in cells for s in protocol.final_seeds]
    mine = [pair for i, pair in enumerate(pairs) if i % n == k - 1]
    todo = [(t, s) for t, s in mine if (t.cell.id, s, multiple) not in done]
    check = _Check(protocol, multiple, prepared, path, keys, tracking_uri, fingerprints, quiet)
    if stop_after_s is not None:
        check.deadline = start + stop_after_s
    kept = [(t, s) for t, s in mine if (t.cell.id, s, multiple) in done]
    if todo:  # the manifest lists every part of the work, the check's with the sweep's (`tables.add_part`)
        part = {**provenance.hardware(), "device": check.code["device"], "kind": "budget_check", "multiple": multiple}
        tables.add_part(results, part)
    check.run(cells, todo, kept)
    return CheckOutcome(path, len(todo), len(kept), time.perf_counter() - start)


class _Check:
    """One pass of the budget check: training, records, progress."""

    def __init__(
        self,
        protocol: Protocol,
        multiple: int,
        prepared: Any,
        path: Path,
        keys: dict[str, str],
        tracking_uri: str,
        fingerprints: dict[str, Any],
        quiet: bool,
    ) -> None:
        self.protocol, self.multiple, self.prepared, self.path, self.keys = protocol, multiple, prepared, path, keys
        self.iterations = protocol.spec.training.iterations * multiple
        # on every row, as on the sweep's: the code it ran and where it trained (`--device`: a check may train
        # where the run did not, and a check resumed elsewhere has rows of several devices)
        self.code = {
            "git_commit": provenance.git_commit(),
            "git_dirty": provenance.git_dirty(),
            "device": describe_device(protocol.spec.training.device),
        }
        base_tags = provenance.standard_tags(
            fingerprints["split"],
            protocol=protocol.name,
            protocol_hash=protocol.hash,
            train_fingerprint=fingerprints["train"],
            test_fingerprint=fingerprints["test"],
            data_fingerprint=protocol.data,
            device=self.code["device"],
        )
        self.mlflow = MlflowRecords(protocol, tracking_uri, base_tags)
        self.quiet = quiet
        self.deadline: float | None = None  # perf_counter time of --stop-after: no seed started that ends past it

    def length(self, tuned: Tuned) -> int:
        """The iterations one seed of ``tuned`` trains here: the multiple of the budget, or under early
        stopping of what its finals trained."""
        return self.iterations if tuned.stop_after is None else tuned.stop_after * self.multiple

    def run(self, cells: list[Tuned], todo: list[tuple[Tuned, int]], kept: list[tuple[Tuned, int]]) -> None:
        """Train what is missing, cell by cell, the longest first; Ctrl-C (or SIGTERM through the sweep's stop flag,
        `bench.sweep.accounts.STOP`) leaves the running seed unrecorded and every finished one recorded."""
        seeds = len(self.protocol.final_seeds)
        assigned = len(kept) + len(todo)  # this worker's (cell, seed) pairs: all of them, or its shard's
        done = sum(self.length(t) for t, _ in kept)
        self.progress = Progress(len(cells), done + sum(self.length(t) for t, _ in todo), done, self.quiet)
        left = {t.cell.id for t, _ in todo}
        trained: set[tuple[str, int]] = set()  # (cell, seed) recorded by this worker now
        skipped = False  # under --stop-after: a seed not started, as it would have ended past the limit
        self.progress.cell_done(len(cells) - len(left))
        for tuned, seed in kept:  # recorded: a state it left here before it ended elsewhere is not needed
            _Row(self, tuned, seed).run_state().clear()
        if kept:
            self.progress.line(
                f"budget check x{self.multiple}: {len(kept)} of the {assigned} seeds "
                f"{'this shard checks' if assigned < len(cells) * seeds else 'to check'} already in "
                f"{self.path.name}, kept"
            )
        try:
            # the longest cells first (under early stopping each cell's seeds train their own length): a worker
            # given a limited time (a lent GPU's calls, whose saved states only that device resumes) spends it
            # on the seeds that cost the other workers the most, and the short ones fill what is left
            for tuned in sorted(cells, key=lambda t: -self.length(t)):
                mine = [s for t, s in todo if t is tuned]
                if not mine:
                    continue
                self.progress.cell(f"{tuned.cell.id} x{self.multiple}", seeds, seeds - len(mine))
                for seed in mine:
                    if not self._fits(tuned, seed):
                        skipped = True
                        continue
                    self._seed(tuned, seed)
                    trained.add((tuned.cell.id, seed))
                self.progress.cell_done()
        except TimeUp:  # a seed still training at the limit: stopped, its state kept for the next attempt
            skipped = True
        finally:
            self.progress.close()
        if skipped:
            raise TimeUp(self._remaining([(t, s) for t, s in todo if (t.cell.id, s) not in trained]))

    def pace(self, tuned: Tuned) -> float | None:
        """Seconds to plan a training iteration of ``tuned`` with on this device, as the records say: the
        median of its seeds checked here on this device (rows name it) times `FIT_MARGIN`, else the slowest
        other cell's median times `BORROWED_MARGIN`; the finals this device trained where it checked nothing;
        None where it trained nothing of the run. Rows record training and evaluation wall time, under
        whatever else shared the device then (the same number of workers on a lent GPU, whose chunks start
        alike)."""
        per_cell: dict[str, list[float]] = {}
        for path in (self.path, self.path.with_name(tables.FINALS)):
            try:
                frame = pd.read_csv(path, usecols=["cell", "iterations", "wall_time_s", "state", "device"])
            except (OSError, ValueError):  # absent, or a file without those columns: no pace from it
                continue
            done = frame[(frame["device"] == self.code["device"]) & (frame["state"] == "COMPLETE")]
            done = done[done["iterations"] > 0]
            for cell, rows in done.groupby("cell"):
                per_cell.setdefault(str(cell), []).extend((rows["wall_time_s"] / rows["iterations"]).tolist())
            if per_cell:  # the check's own rows first: the finals trained at another length
                break
        if tuned.cell.id in per_cell:
            return FIT_MARGIN * float(pd.Series(per_cell[tuned.cell.id]).median())
        medians = [float(pd.Series(values).median()) for values in per_cell.values()]
        return BORROWED_MARGIN * max(medians) if medians else None

    def _fits(self, tuned: Tuned, seed: int) -> bool:
        """Whether ``seed`` of ``tuned`` would end before the deadline (always without one; while time is left
        without a pace): what it has left to train, after a saved state this device would go on from (an
        earlier call's on the same machine), at the recorded pace."""
        if self.deadline is None:
            return True
        pace = self.pace(tuned)
        now = time.perf_counter()
        if pace is None:
            return now < self.deadline
        device = torch.device(self.protocol.spec.training.device).type
        left = self.length(tuned) - _Row(self, tuned, seed).run_state().saved_iteration(device)
        return now + pace * left <= self.deadline

    def _remaining(self, left: list[tuple[Tuned, int]]) -> dict[str, Any]:
        return {"seeds": len(left), "iterations": sum(self.length(t) for t, _ in left)}

    def _seed(self, tuned: Tuned, seed: int) -> None:
        p = self.protocol
        run = train_final(
            p,
            self.prepared,
            tuned.cell,
            tuned.params,
            seed,
            _Row(self, tuned, seed),
            mlflow=self.mlflow,
            progress=self.progress,
            step=self._step,
            multiple=self.multiple,
            stop_after=tuned.stop_after,
        )
        result, primary = run.result, run.metrics.get(p.primary, math.nan)
        score = f" {p.primary}={primary:.4f}" if math.isfinite(primary) else ""
        why = f" ({result.reason})" if result.reason and result.state != "COMPLETE" else ""
        self.progress.line(
            f"{tuned.cell.id} x{self.multiple} seed {seed} {result.state}{score} "
            f"[{result.iterations} it, {result.wall_time_s:.1f} s]{why} | {self.progress.eta()}"
        )

    def _step(self, it: int, total: int, loss: float) -> None:
        if STOP.is_set():
            raise KeyboardInterrupt
        if self.deadline is not None and time.perf_counter() > self.deadline:  # a seed slower than its pace
            raise TimeUp({})
        self.progress.iteration(it, total, loss)


class _Row(Record):
    """A budget check seed's record: one row of budget_check.csv (NaN for a metric the run did not give), and
    an MLflow run of kind ``budget_check`` logging the finite metrics."""

    def __init__(self, check: _Check, tuned: Tuned, seed: int) -> None:
        m = check.multiple
        super().__init__(
            check.mlflow.key(tuned.cell, "budget_check", f"x{m}", f"seed{seed}"),
            f"budget check x{m} {tuned.cell.id} seed {seed}",
            {"kind": "budget_check", "cell": tuned.cell.id, "seed": seed, "multiple": m},
            params={"multiple": m},
            purpose="budget check training",
        )
        self.check, self.tuned = check, tuned

    def run_state(self) -> RunState:
        # beside the check's CSV, as a sweep's units keep theirs (`Worker.run_state`)
        folder = self.check.path.parent / RESUME_DIR / tables.check_cell_id(self.tuned.cell.id)
        return RunState(state_path(folder, self.key, "budget"), self.key, on_resume=self.check.progress.resumed)

    def write(self, run: FinalRun) -> None:
        c, p, result = self.check, self.check.protocol, run.result
        metrics = {m: run.metrics.get(m, math.nan) for m in metric_names(p.spec.evaluation)}
        row = {
            "protocol_hash": p.hash,
            "cell_key": c.keys[self.tuned.cell.id],
            "cell": self.tuned.cell.id,
            "seed": run.seed,
            "multiple": c.multiple,
            "iterations": result.iterations,
            "samples_seen": result.samples_seen,
            "wall_time_s": round(result.wall_time_s, 3),
            f"val_{p.primary}": self.tuned.validation,
            **metrics,
            "state": result.state,
            "reason": result.reason,
            "params": params_text(self.tuned.params),
            **c.code,
        }
        record(c.path, p, row, c.keys)

    def logged_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in metrics.items() if math.isfinite(v)}


def describe(outcome: CheckOutcome, multiple: int) -> str:
    """The closing line: what was trained, what was kept, where the rows are."""
    minutes, seconds = divmod(int(outcome.wall_time_s), 60)
    return (
        f"budget check x{multiple}: {outcome.trained} seed(s) trained, {outcome.kept} kept, in "
        f"{minutes}:{seconds:02d}; rows in {outcome.path}"
    )
