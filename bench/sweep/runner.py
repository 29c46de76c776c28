"""Running a protocol: tune every cell, retrain the best with the final seeds, score the floor, write the tables.

`Sweep` only orchestrates: the data, the trial objective, trial slots and
the search strategy are bench.sweep.tuning's; a final seed's training, scoring
and artifacts bench.sweep.final_run's (shared with the budget check); MLflow
runs bench.stores.mlflow_runs'; the untrained-trunk floor bench.sweep.floor's;
the tables bench.sweep.tables'.

Where things are recorded:

* Optuna storage (``--storage``; SQLite under ./runs by default, any RDB URL
  works): one study per cell for tuning, ``<protocol>:<cell key>:<cell>``,
  and one for its final seeds, ``...:final``. A cell's key
  (`bench.plan.cell_key`) covers the protocol's shared settings, the cell's
  own definition and the data, never the other cells: a cell added to the
  protocol is trained alone, the others keep their records. It is the source of truth:
  the results tables are rebuilt from it.
* MLflow (``--tracking-uri``): one experiment per protocol, a parent run per
  cell, child runs per trial, per fold of a trial and per final seed. Each
  run carries a deterministic key tag (``dmlbench.key``) and is found by it
  before one is created, so a resumed sweep adds to its runs rather than
  duplicating them, and a metric already logged is not logged again.
* ``results/<protocol>/`` (bench.sweep.tables): tables and artifacts.

Resume: rerun the same command. Finished trials stay; a trial left RUNNING
by a killed process is failed as stale and re-enqueued with its parameters
and slot (bench.sweep.tuning.SlotStudy), and training is a function of (protocol
seed, slot, fold) or (protocol seed, final seed) and the parameters, so the
tables equal those of an uninterrupted run (wall times aside). The seeds do
not depend on the cell (common random numbers): final seed s starts every
cell from the same trunk with the same batches. Ctrl-C gives the running
trial back at once.

Every trial and final run records the git commit (and dirty flag) of the
code that ran it; the manifest lists the commits per cell.

Several workers, on one machine or many, share a sweep by pointing at the
same storage (PostgreSQL for several machines: SQLite over a network file
system is not safe) and the same tracking server:

* trial and final-seed slots are claimed through the storage: a worker asks
  for a trial, and only the first ``n`` fresh trials of a study (in the
  database's order) get a slot; a later one is failed as surplus before it
  trains. No two workers run the same slot; no cell gets more trials.
* a worker whose trials are all claimed moves to the next cell; a cell's
  finals start only when all its trials are finished, so a worker may wait
  (polling) for another's trials;
* a worker that dies is detected by its heartbeat (every 30 s, stale after
  120 s) or, on the same machine, at once by its process id; its trial is
  re-enqueued for whoever comes next;
* each worker writes the results tables of its own --results-dir whenever
  a cell finishes, from the shared storage, so the last one to finish
  writes complete tables; artifacts (pair distances, 2-D embeddings) are
  written by the worker that ran the first final seed, and logged to MLflow;
  floor.csv by every worker that finishes, each seed scored once, by the
  worker that claimed it in the study ``<protocol>:<key12>:floor``.

Each worker accounts for its wall time (`bench.clock.Ledger`: start-up,
training, run set-up, validation, test, records, tables, waiting, floor,
other) in the manifest's ``time``; `run` ends with it in one line.

TPE's proposals in a multi-worker sweep depend on which trials finished
first, so only a single-worker sweep reproduces its parameters exactly.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.clock import Ledger
from bench.data.splits import fold_label
from bench.devices import describe
from bench.errors import BenchError
from bench.plan import Cell, Plan, cell_key
from bench.protocol import Protocol, load_protocol
from bench.stores import provenance, tracking
from bench.stores.mlflow_runs import MlflowRecords
from bench.stores.retry import StoreUnavailableError
from bench.stores.urls import default_url, redact
from bench.sweep import tables
from bench.sweep.final_run import FinalRun, Record, train_final
from bench.sweep.floor import update_cell_floor, update_floor
from bench.sweep.precision import resolve_precision
from bench.sweep.preflight import refuse, short_classes_notice
from bench.sweep.prepare import Prepared, small_classes_notice
from bench.sweep.progress import Progress
from bench.sweep.records import collect, metric_names
from bench.sweep.result import SweepResult
from bench.sweep.seeds import for_draw
from bench.sweep.tuning import (
    Heartbeat,
    Hooks,
    RunResult,
    Slot,
    SlotStudy,
    TrialOutcome,
    best_trial,
    extra_seed_study,
    final_iterations,
    fixed_sampler,
    held,
    make_pruner,
    make_sampler,
    open_storage,
    promoted,
    ready,
    run_trial,
    rung_for,
    study_name,
    top_slots,
    trial_attrs,
)

log = logging.getLogger("dmlbench.sweep")

POLL_S = 10.0  # how often a worker waiting for other workers' trials looks again


def default_storage(root: str | Path | None = None) -> str:
    """``sqlite:///<root>/optuna.db``, ``root`` defaulting to ./runs (created if missing)."""
    return default_url("optuna.db", root)


@dataclass
class Options:
    """Where a sweep records and reads, and how it talks."""

    storage: str | None = None
    tracking_uri: str | None = None
    results_dir: str | Path = "results"
    data_root: str | None = None
    quiet: bool = False
    poll_s: float = POLL_S
    redo: tuple[str, ...] = ()  # cells whose records are discarded before the sweep (after a fix to a method)
    cells: tuple[str, ...] = ()  # run only these planned cells (a job of a split sweep, `bench.sweep.merge`); () all
    stop_after_s: float | None = None  # wall-time limit of this worker (`TimeUp`); None: none
    device: str | None = None  # training.device overridden (`Protocol.with_device`); None: the protocol's


@dataclass
class SweepOutcome:
    """Where the tables went, the cells the budget audit refused, how long the sweep took, and how many of the
    plan's iterations the stores already held when it started (resumed, not trained again)."""

    results: Path
    refused: dict[str, str]
    cells: int
    wall_time_s: float
    recorded_iterations: int = 0
    total_iterations: int = 0


# --------------------------------------------------------------------------- the sweep


def _query_counts(test: Any) -> dict[str, Any]:
    """A query/gallery test's queries and how many have a match in the gallery: the others are skipped by
    the ranking metrics (as PML skips them), so a table says what its numbers average over."""
    from bench.data.query_gallery import QueryGallery

    if not isinstance(test, QueryGallery):
        return {}
    return {"test_queries": {"total": len(test.query), "with_a_match": test.matched_queries()}}


STOP = threading.Event()


class TimeUp(KeyboardInterrupt):
    """A worker's ``--stop-after`` limit reached with work left: raised where an interruption is (so the
    running trial, if any, is given back and the tables are written as after Ctrl-C); ``remaining`` says
    what is left (`Sweep.remaining`)."""

    def __init__(self, remaining: dict[str, Any]) -> None:
        super().__init__("time limit reached")
        self.remaining = remaining


def request_stop() -> None:
    """Ask a running sweep to stop as after Ctrl-C: its running trial is given back, then it raises
    KeyboardInterrupt. For signal handlers: the KeyboardInterrupt a handler raises can be lost (when it
    lands in a garbage-collection callback Python only prints it and training runs on), so the sweep
    also checks this flag at every progress step of a training run."""
    STOP.set()


def chosen_cells(protocol: Protocol, cells: tuple[str, ...]) -> set[str]:
    """The planned cells ``--cells`` names (empty: all); a name the plan does not hold is refused, one line."""
    if not cells:
        return set()
    from bench.plan import plan

    known = [c.id for c in plan(protocol).cells]
    unknown = [c for c in cells if c not in known]
    if unknown:
        raise BenchError(f"--cells: no cell {unknown[0]!r} in {protocol.name}; cells: {', '.join(known)}")
    return set(cells)


class Sweep:
    """One worker's pass over a protocol; any number may run against the same storage."""

    def __init__(self, protocol: Protocol, options: Options) -> None:
        self.born = time.perf_counter()  # start-up runs from here to the first cell's work
        self.ledger = Ledger()
        if options.device is not None:
            protocol = protocol.with_device(options.device)
        # --stop-after: no claim once the longest trial or seed this worker has run would end past the limit
        # (a unit's expected duration, from its own timing), and a unit still running at the limit given back
        self.deadline = None if options.stop_after_s is None else self.born + options.stop_after_s
        self.longest_s = 0.0
        self.trained_from: tuple[float, int] | None = None  # (when, iterations recorded) as work began
        self.protocol = protocol
        self.options = options
        chosen = chosen_cells(protocol, options.cells)  # an unknown name is refused before any data is read
        # every refusal `validate` also makes (bench.sweep.preflight): before any record is written or moved
        checked = refuse(
            protocol,
            data_root=options.data_root,
            stores=True,
            storage=options.storage,
            tracking_uri=options.tracking_uri,
            results_dir=options.results_dir,
        )
        assert checked.plan is not None and checked.prepared is not None  # refuse() raised otherwise
        self.prepared: Prepared = checked.prepared
        # the records are keyed by the protocol and the data read: changed data are a new version
        self.protocol = protocol = protocol.with_data(self.prepared.data_fingerprint())
        self.plan: Plan = replace(checked.plan, protocol=protocol)
        self.planned = [c.id for c in self.plan.cells]
        if chosen:
            self.plan = replace(self.plan, cells=tuple(c for c in self.plan.cells if c.id in chosen))
        self.sampler = checked.sampler
        self.storage_url = options.storage or default_storage()
        self.tracking_uri = tracking.resolve_tracking_uri(self.options.tracking_uri)
        self.results = tables.protocol_dir(options.results_dir, protocol.name)
        self.storage = open_storage(self.storage_url)
        self.primary = protocol.primary
        self.metrics = metric_names(protocol.spec.evaluation)

    # ---- setup

    def setup(self) -> None:
        """Load the data, make the results directory this protocol's (moving another version aside), open
        the MLflow records and the Optuna studies, and discard the --redo cells: all before the first trial."""
        from bench.metrics.geometry import geometry

        # one precision for every cell: fixed, or `auto` chosen once and stored (bench.sweep.precision)
        self.protocol, self.precision = resolve_precision(self.protocol, self.storage)
        # on every record: the code it ran and the hardware it ran on (threads as set once `auto` measured)
        self.code = {
            "git_commit": provenance.git_commit(),
            "git_dirty": provenance.git_dirty(),
            "device": describe(self.protocol.spec.training.device),
        }  # the device also tags every MLflow run (`dmlbench.device`), so a leaderboard read from MLflow shows it
        self.plan = replace(self.plan, protocol=self.protocol)
        moved = tables.claim_dir(self.results, self.protocol.shared_hash, self.protocol.data)
        self.part = provenance.hardware()  # this worker's CPU and threads; the manifest lists every part's
        earlier = (tables.read_manifest(self.results) or {}).get("hardware") or []
        self._warn_threads(earlier)
        self.fingerprints = self.prepared.fingerprints()
        base_tags = provenance.standard_tags(
            self.fingerprints["split"],
            protocol=self.protocol.name,
            protocol_hash=self.protocol.hash,
            train_fingerprint=self.fingerprints["train"],
            test_fingerprint=self.fingerprints["test"],
            data_fingerprint=self.protocol.data,
            device=self.code["device"],
        )
        self.mlflow = MlflowRecords(self.protocol, self.tracking_uri, base_tags)
        for cell in self._redo_cells():
            self._discard(cell)
        self.manifest = {
            "protocol": self.protocol.name,
            "protocol_hash": self.protocol.hash,
            "shared_hash": self.protocol.shared_hash,
            "shared_key": self.protocol.shared_key,
            "cell_keys": {c.id: cell_key(self.protocol, c) for c in self.plan.cells},
            "protocol_file": self.protocol.source,
            "protocol_text": self.protocol.text,
            "primary_metric": self.primary,
            "metrics": self.metrics,
            "fingerprints": self.fingerprints,
            "data_fingerprint": self.protocol.data,
            "geometry": geometry(self.protocol.spec.model.normalize),
            "precision": self.precision,
            "threads": self.part["threads"],
            "hardware": [*earlier, self.part],  # one entry per worker start: a resumed sweep says where each part ran
            "package_versions": provenance.package_versions(),
            **self.code,
            "tracking_uri": redact(self.tracking_uri),
            "storage": redact(self.storage_url),
            "experiment": f"dmlbench/{self.protocol.name}",
            "datasets": {"train": self.protocol.spec.data.train, "test": self.protocol.spec.data.test},
            **_query_counts(self.prepared.test),
            "budget": self.plan.budget.record(),
            "cells": [c.id for c in self.plan.cells],
            **({"planned_cells": self.planned} if self.options.cells else {}),
            **({"device_override": self.options.device} if self.options.device else {}),
            **({"sampler": self.sampler} if self.sampler else {}),
            **({"small_classes": self.prepared.small_classes} if self.prepared.small_classes else {}),
            "dropped": {d.cell: d.reason for d in self.plan.dropped},
            "created": tables.now(),
            "finished": None,
        }
        # one tuning study and one finals study per cell and tuning draw (tuning.repeats; one draw by default)
        draws = range(self.plan.budget.draws)
        self.tuning = {
            c.id: [
                SlotStudy(
                    self.storage,
                    study_name(self.protocol, c, draw=r),
                    self.plan.budget.for_cell(c).slots,
                    pruner=make_pruner(self.protocol),
                )
                for r in draws
            ]
            for c in self.plan.cells
        }
        self.finals = {
            c.id: [
                SlotStudy(
                    self.storage,
                    study_name(self.protocol, c, finals=True, draw=r),
                    self.plan.budget.seeds_min or self.plan.budget.seeds,  # a seed range: its minimum here
                )
                for r in draws
            ]
            for c in self.plan.cells
        }
        self.cell_runs: dict[str, str] = {}
        self.extra_seeds: dict[tuple[str, int], dict[int, SlotStudy]] = {}  # a seed range's studies past its min
        if self.precision["setting"] == "auto":
            timed = ", ".join(f"{k} {v:.0f} ms" for k, v in self.precision["step_ms"].items())
            self.line(
                f"precision auto: every cell trains in {self.precision['precision']}"
                f"{' + channels-last' if self.precision['channels_last'] else ''} (a step timed on "
                f"{self.precision['host']}: {timed})"
            )
        if moved:
            self.line(f"results of another version of {self.protocol.name} (its protocol or its data) moved to {moved}")
        notice = short_classes_notice(self.sampler) if self.sampler else None
        if notice:
            log.warning(notice)  # said even when quiet: the batches are not P x K distinct images
        left_out = small_classes_notice(self.prepared.small_classes)
        if left_out:
            log.warning(left_out)  # said even when quiet: the table is over fewer classes than selected

    def _warn_threads(self, earlier: list[dict[str, Any]]) -> None:
        """One warning line when the records so far were made with another torch thread count: the order of
        float additions, so every number, depends on it (a resumed or grown sweep mixes both otherwise)."""
        counts = sorted({int(p["threads"]) for p in earlier if isinstance(p, dict) and p.get("threads")})
        now = self.part["threads"]
        if counts and counts != [now]:
            log.warning(
                f"--threads: this worker trains with {now} thread(s), the records of {self.protocol.name} so far "
                f"with {', '.join(map(str, counts))}: the numbers depend on the thread count, so cells trained "
                "now may differ from a sweep run with one (the manifest's `hardware` lists each part's)"
            )

    def line(self, text: str) -> None:
        """A status line through the progress bars when running; before them, a record of the `dmlbench`
        logger: INFO unless quiet, WARNING for a redo (records discarded are said even when quiet)."""
        if hasattr(self, "progress"):
            self.progress.line(text)
        elif text.startswith("redo"):
            log.warning(text)
        elif not self.options.quiet:
            log.info(text)

    def _redo_cells(self) -> list[Cell]:
        known = {c.id: c for c in self.plan.cells}
        unknown = [c for c in self.options.redo if c not in known]
        if unknown:
            raise BenchError(f"--redo: no cell {unknown[0]!r} in {self.protocol.name}; cells: {', '.join(known)}")
        return [known[c] for c in dict.fromkeys(self.options.redo)]

    def _discard(self, cell: Cell) -> None:
        """Forget a cell's records so that the sweep runs it again: its two Optuna studies, its MLflow
        runs (deleted, so still restorable from MLflow), its artifacts. Other cells are untouched.

        For a fix to one method's code: the protocol (and its hash) is the same, so without this the
        sweep would keep the old records. Run it with no other worker on the same storage."""
        import shutil

        import optuna

        studies = 0
        for finals in (False, True):
            for r in range(self.plan.budget.draws):
                try:
                    optuna.delete_study(
                        study_name=study_name(self.protocol, cell, finals=finals, draw=r), storage=self.storage
                    )
                    studies += 1
                except KeyError:  # never started
                    pass
        runs = self.mlflow.delete_cell(cell)
        shutil.rmtree(tables.cell_dir(self.results, cell.id), ignore_errors=True)
        self.line(f"redo {cell.id}: discarded {studies} Optuna studies and {runs} MLflow runs")

    def _done_iterations(self) -> tuple[int, set[str]]:
        """Allotted iterations already recorded, and the cells whose finals are all recorded."""
        b = self.plan.budget
        done, finished = 0, set()
        for cell in self.plan.cells:
            over = 0  # the cell's draws that are over: finals all recorded, or no trial completed
            for r, tuning in enumerate(self.tuning[cell.id]):
                trials = [s for s, t in tuning.counted().items() if t.state.is_finished()]
                values, stopped = self._seed_values(cell, r)
                no_winner = self._no_winner(cell, r)
                # a seed range that stopped early counts the seeds it did not need as done, as a cell with no
                # winner counts all its seeds
                done += sum(b.slot_iterations(s) for s in trials) * b.folds
                done += (b.seeds if no_winner or stopped else len(values)) * b.per_final
                over += no_winner or stopped
            if over == b.draws:
                finished.add(cell.id)
        return done, finished

    def _seed_studies(self, cell: Cell, draw: int, upto: int | None = None) -> list[SlotStudy]:
        """The studies of a cell's final seeds in one draw: its finals study, then under a seed range one a seed
        past the minimum (`extra_seed_study`), those up to seed ``upto`` (all without it) that exist or are
        asked for; each is opened once."""
        b = self.plan.budget
        studies = [self.finals[cell.id][draw]]
        if not b.adaptive_seeds:
            return studies
        cache = self.extra_seeds.setdefault((cell.id, draw), {})
        for k in range(b.seeds_min, b.seeds if upto is None else upto + 1):
            if k not in cache:
                name = extra_seed_study(self.protocol, cell, draw, k)
                if upto is None and not _exists(self.storage, name):
                    break  # seeds are asked for in order: none past the first that was never asked for
                cache[k] = SlotStudy(self.storage, name, 1)
            studies.append(cache[k])
        return studies

    def _seed_values(self, cell: Cell, draw: int) -> tuple[list[float | None], bool]:
        """The primary metric of the draw's finished final seeds in seed order, up to the first unfinished one
        (None: a failed seed), and whether the cell's seeds are done: all of them, or a seed range's rule
        stopped (`bench.plan.seeds`)."""
        from bench.plan.seeds import stops_at

        b = self.plan.budget
        values: list[float | None] = []
        for study in self._seed_studies(cell, draw):
            trials = study.counted()
            for s in range(study.n):
                t = trials.get(s)
                if t is None or not t.state.is_finished():
                    return values, False
                values.append(t.value if t.state.name == "COMPLETE" else None)
        if not b.adaptive_seeds:
            return values, len(values) == b.seeds
        return values, stops_at(values, b.seeds_min, b.seeds, b.half_width) is not None

    def _no_winner(self, cell: Cell, draw: int) -> bool:
        return self.tuning[cell.id][draw].finished() and self._best(cell, draw) is None

    # ---- main loop

    def run(self) -> SweepOutcome:
        """The sweep to its end: every planned cell tuned and run on its final seeds (resuming what a store
        already holds), then the tables written; returns what ran and where the tables are."""
        start = self.born
        self.setup()
        done, finished = self._done_iterations()
        self.progress = Progress(len(self.plan.cells), self.plan.total_iterations, done, self.options.quiet)
        self.progress.cell_done(len(finished))
        self.ledger.add("start-up", time.perf_counter() - start)
        self.trained_from = (time.perf_counter(), done)
        try:
            pending = [c for c in self.plan.cells if c.id not in finished]
            while pending:
                waiting = []
                for cell in pending:
                    if self._work(cell):
                        self.progress.cell_done()
                        self._write(finished=False)
                    else:
                        waiting.append(cell)
                if waiting and len(waiting) == len(pending):
                    self.line(
                        f"waiting for other workers: {', '.join(c.id for c in waiting[:3])}"
                        + (" ..." if len(waiting) > 3 else "")
                    )
                    self._check_time(0.0)
                    with self.ledger.timing("waiting"):
                        time.sleep(self.options.poll_s)
                pending = waiting
            self._floor_records(update_floor(self.protocol, self.prepared, self.results, self._floor_rows()))
            with self.ledger.timing("floor"):
                cell_floor = update_cell_floor(
                    self.protocol, self.prepared, self.results, self.plan.cells, self._cell_floor_rows()
                )
            self._floor_records(cell_floor)
            self.manifest["finished"] = tables.now()
            self.manifest["time"] = self.time_table(time.perf_counter() - start)
            refused = self._write(finished=True)
        except KeyboardInterrupt:
            with suppress(StoreUnavailableError):  # a store away when stopped gets nothing; the rerun resumes
                for run_id in self.cell_runs.values():  # cells left open; a resumed sweep reopens them
                    self.mlflow.end(run_id, "KILLED")
            with suppress(StoreUnavailableError):
                self._write(finished=False)
            raise
        finally:
            self.progress.close()
        return SweepOutcome(
            self.results, refused, len(self.plan.cells), time.perf_counter() - start, done, self.plan.total_iterations
        )

    def time_table(self, wall_s: float) -> dict[str, Any]:
        """This worker's wall time accounted (`bench.clock.Ledger`), as the manifest's ``time`` holds it: the
        worker it is of (the last worker to finish writes it), its seconds and shares by account."""
        import os
        import platform

        return {"worker": f"{platform.node()}:{os.getpid()}", **self.ledger.table(wall_s)}

    def _write(self, finished: bool) -> dict[str, str]:
        with self.ledger.timing("tables"):
            records = collect(self.plan, self.storage)
            return tables.write(self.plan, records, self.results, self.manifest, finished=finished)

    def _cell_run(self, cell: Cell) -> str:
        """The cell's parent MLflow run, opened once per worker."""
        if cell.id not in self.cell_runs:
            self.cell_runs[cell.id] = self.mlflow.cell_run(cell)
        return self.cell_runs[cell.id]

    def _work(self, cell: Cell) -> bool:
        """Do what can be done for a cell now; True when its trials and finals are all recorded. Under
        tuning.repeats every draw's trials are claimed first, then each finished draw's final seeds, with its
        own draw's seeds (`for_draw`)."""
        b = self.plan.budget.for_cell(cell)
        studies = self.tuning[cell.id]
        self.progress.cell(
            cell.id,
            b.tuning_runs + b.final_count,
            sum(len([t for t in s.counted().values() if t.state.is_finished()]) for s in studies) * b.folds,
        )
        for r, tuning in enumerate(studies):
            drawn = for_draw(self.protocol, r)
            while (
                not (b.rungs and self._rung_waits(tuning))
                and (slot := self._claim(tuning, lambda s, drawn=drawn: make_sampler(drawn, cell, s))) is not None
            ):
                if b.rungs and not self._rung_ready(tuning, slot):
                    break  # its rung waits for the one before it, which other workers hold
                self._trial(cell, tuning, slot, r)
        winners = 0
        for r, tuning in enumerate(studies):
            with self.ledger.timing("records"):
                if not tuning.finished():
                    return False
                best = self._best(cell, r)
            if best is None:
                self.line(f"{cell.id}: no trial completed{_of_draw(r, b.draws)}, nothing to retrain")
                continue
            winners += 1
            finals = self.finals[cell.id][r]
            while (slot := self._claim(finals)) is not None:
                self._final(cell, finals, slot, best, r, slot.slot)
            with self.ledger.timing("records"):
                if not finals.finished():
                    return False
            if b.adaptive_seeds and not self._more_seeds(cell, r, best):
                return False
        self.mlflow.end(self._cell_run(cell), "COMPLETE" if winners else "FAIL")
        self.cell_runs.pop(cell.id)
        return True

    def _more_seeds(self, cell: Cell, draw: int, best: Any) -> bool:
        """A seed range's seeds past the minimum, one at a time in seed order while the rule asks for another
        (`bench.plan.seeds`); True once the rule stopped, False while another worker trains the next seed."""
        from bench.plan.seeds import seeds_wanted

        b = self.plan.budget
        while True:
            with self.ledger.timing("records"):
                values, stopped = self._seed_values(cell, draw)
            if stopped:
                return True
            k = len(values)
            if seeds_wanted(values, b.seeds_min, b.seeds, b.half_width) <= k:
                return True
            study = self._seed_studies(cell, draw, upto=k)[-1]
            while (slot := self._claim(study)) is not None:
                self._final(cell, study, slot, best, draw, k)
            with self.ledger.timing("records"):
                if not study.finished():
                    return False

    def _rung_waits(self, study: SlotStudy) -> bool:
        """Whether the slot a claim would get now (the oldest waiting trial's, else the next fresh one) belongs to
        a rung whose predecessor is still training: then no claim is made (`_rung_ready` covers the race)."""
        from optuna.trial import TrialState

        with self.ledger.timing("records"):
            trials = study.trials()
            waiting = sorted((t for t in trials if t.state == TrialState.WAITING), key=lambda t: t.number)
            fresh = [t for t in trials if "replaces" not in t.user_attrs]
            slot = waiting[0].user_attrs.get("slot") if waiting else len(fresh)
            if slot is None or slot >= study.n:
                return False
            return not ready(self.plan.budget.rungs, held(trials, study.n), slot)

    def _rung_ready(self, study: SlotStudy, slot: Slot) -> bool:
        """Whether a claimed successive-halving slot may train now (its rung's predecessor finished); if not,
        it is given back at once, waiting for whoever comes next (`bench.sweep.tuning.ready`)."""
        with self.ledger.timing("records"):
            if ready(self.plan.budget.rungs, study.counted(), slot.slot):
                return True
            study.abandon(slot, "its rung waits for the rung before it")
            return False

    def _claim(self, study: SlotStudy, *sampler: Any) -> Slot | None:
        with self.ledger.timing("records"):
            if self.deadline is not None and study.open_slots():
                self._check_time(self.longest_s)
            return study.claim(*sampler)

    def _check_time(self, ahead_s: float) -> None:
        """Raise `TimeUp` when the limit falls within ``ahead_s`` seconds from now."""
        if self.deadline is not None and time.perf_counter() + ahead_s >= self.deadline:
            raise TimeUp(self.remaining())

    def remaining(self) -> dict[str, Any]:
        """What the sweep has left: cells, trials and final seeds not yet recorded (across workers), the
        iterations they hold, and the time they would take at this worker's pace so far (None: no pace yet)."""
        b = self.plan.budget
        done, finished = self._done_iterations()
        trials = seeds = 0
        for cell in self.plan.cells:
            for tuning, finals in zip(self.tuning[cell.id], self.finals[cell.id]):
                trials += b.trials - len([t for t in tuning.counted().values() if t.state.is_finished()])
                seeds += b.seeds - len([t for t in finals.counted().values() if t.state.is_finished()])
        left = max(self.plan.total_iterations - done, 0)
        eta = None
        if self.trained_from is not None and done > self.trained_from[1]:
            pace = (time.perf_counter() - self.trained_from[0]) / (done - self.trained_from[1])
            eta = round(pace * left, 1)
        return {
            "cells": len(self.plan.cells) - len(finished),
            "of_cells": len(self.plan.cells),
            "trials": max(trials, 0),
            "seeds": max(seeds, 0),
            "iterations": left,
            "of_iterations": self.plan.total_iterations,
            "estimated_s": eta,
        }

    def _best(self, cell: Cell, draw: int) -> Any:
        """The draw's best trial by validation value; under successive halving the best of the top rung."""
        counted = self.tuning[cell.id][draw].counted()
        return best_trial(top_slots(self.plan.budget.rungs, counted) if self.plan.budget.rungs else counted)

    # ---- one trial

    def _trial(self, cell: Cell, study: SlotStudy, slot: Slot, draw: int) -> None:
        import optuna
        from optuna.trial import TrialState

        began = time.perf_counter()
        parent = self._cell_run(cell)
        run_id = self.mlflow.run(
            self.mlflow.key(cell, f"{_draw_prefix(draw)}trial{slot.slot}"),
            f"{_draw_prefix(draw, ' ')}trial {slot.slot}",
            parent,
            tags={"cell": cell.id, "kind": "trial", "trial": slot.slot, **({"draw": draw} if draw else {})},
        )
        hooks = _TrialHooks(self, cell, run_id, draw)
        rungs = self.plan.budget.rungs
        rung, source = None, None
        if rungs:  # successive halving: the rung's iterations, and a promoted slot its configuration's values
            with self.ledger.timing("records"):
                counted = study.counted()
                source = promoted(rungs, counted, slot.slot) if slot.slot >= rungs[0][0] else None
            rung = rung_for(rungs, slot.slot, source)
            if source is not None:
                study.study.sampler = fixed_sampler(dict(source.params))
        try:
            with Heartbeat(self.storage, slot.trial_id):
                if rung is not None and rung.index > 0 and source is None:
                    outcome = TrialOutcome(
                        "FAIL",
                        None,
                        [],
                        {},
                        0,
                        0,
                        0.0,
                        f"nothing to promote: fewer configurations completed "
                        f"rung {rung.index - 1} than rung {rung.index} has slots",
                    )
                else:
                    outcome = run_trial(
                        for_draw(self.protocol, draw), self.prepared, cell, slot.trial, slot.slot, hooks, rung
                    )
        except BaseException:
            with suppress(StoreUnavailableError):  # a store that is gone gets nothing back; the original is raised
                study.abandon(slot, "interrupted")
            with suppress(StoreUnavailableError):
                hooks.interrupted()
                self.mlflow.end(run_id, "KILLED")
            raise
        self.progress.skip((self.plan.budget.folds - hooks.folds_run) * self.plan.budget.slot_iterations(slot.slot))
        # MLflow first, Optuna last: a trial Optuna holds as finished always has its MLflow record (a worker
        # stopped in between trains the trial again, and its MLflow run, found by key, keeps the values)
        self.mlflow.log(
            run_id,
            params=outcome.params,
            metrics={
                f"val_{self.primary}": outcome.value if outcome.value is not None else math.nan,
                "iterations": outcome.iterations,
                "samples_seen": outcome.samples_seen,
                "wall_time_s": outcome.wall_time_s,
            },
            tags={"state": outcome.state, "reason": outcome.reason[:500]},
        )
        self.mlflow.end(run_id, outcome.state)
        state = TrialState[outcome.state]
        try:
            for key, value in {**trial_attrs(outcome, self.protocol, rung), **self.code}.items():
                slot.trial.set_user_attr(key, value)
            study.study.tell(slot.trial, outcome.value if state == TrialState.COMPLETE else None, state=state)
        except optuna.exceptions.UpdateFinishedTrialError:
            self.line(_taken_over(cell.id, f"trial {slot.slot}"))
            return
        self.progress.recorded(self._done_iterations()[0])
        self.progress.trial(
            cell.id,
            slot.slot,
            self.plan.budget.for_cell(cell).slots,
            outcome.state,
            outcome.value,
            self.primary,
            outcome.iterations,
            outcome.wall_time_s,
            outcome.reason,
        )
        # the trial's time: its loops, its validation scoring, its runs' set-up, and records (the rest)
        inside = outcome.wall_time_s - hooks.records_s  # run_trial's own, less the hooks' MLflow records
        self.ledger.add("training", outcome.train_s)
        self.ledger.add("validation", outcome.score_s)
        self.ledger.add("run set-up", inside - outcome.train_s - outcome.score_s)
        self.ledger.add("records", time.perf_counter() - began - inside)
        self.longest_s = max(self.longest_s, time.perf_counter() - began)

    # ---- one final seed

    def _final(self, cell: Cell, study: SlotStudy, slot: Slot, best: Any, draw: int, index: int) -> None:
        """Final seed ``index`` (its place in ``final.seeds``) of a cell with the best trial's parameters
        (bench.sweep.final_run), recorded in ``slot`` of its study (of tuning draw ``draw``: its winner, its
        seeds); the first seed of the first draw also writes the cell's artifacts."""
        began = time.perf_counter()
        seed = self.protocol.final_seeds[index]
        if index == 0:
            self.mlflow.artifact(
                self._cell_run(cell),
                f"best_params_draw{draw}.json" if draw else "best_params.json",
                text=json.dumps(
                    {"trial": best.user_attrs["slot"], f"val_{self.primary}": best.value, "params": best.params},
                    indent=2,
                    sort_keys=True,
                ),
            )
        record = _FinalSlot(self, cell, study, slot, best, seed, draw)
        run = train_final(
            for_draw(self.protocol, draw),
            self.prepared,
            cell,
            best.params,
            seed,
            record,
            mlflow=self.mlflow,
            progress=self.progress,
            step=self.step,
            artifacts=tables.cell_dir(self.results, cell.id) if index == 0 and draw == 0 else None,
            keep=self.protocol.spec.final.keep_models,
            # under final.mode folds each fold model stops on its own fold; a retrained seed has no validation
            stop_after=None
            if self.plan.budget.final_mode == "folds"
            else final_iterations(self.protocol, best.user_attrs.get("best_iterations", [])),
        )
        result = run.result
        self.progress.recorded(self._done_iterations()[0])
        self.progress.final(cell.id, seed, result.state, run.metrics, self.primary, result.wall_time_s, result.reason)
        # the final's time: its loop, its test scoring and artifacts, its set-up, and records (the rest)
        self.ledger.add("training", result.train_s)
        self.ledger.add("test", result.score_s + run.artifacts_s)
        self.ledger.add("run set-up", result.wall_time_s - result.train_s - result.score_s)
        self.ledger.add("records", time.perf_counter() - began - result.wall_time_s - run.artifacts_s)
        self.longest_s = max(self.longest_s, time.perf_counter() - began)

    def _floor_rows(self) -> dict[int, dict[str, Any]]:
        """The floor's rows, each seed scored by one worker: seeds are slots of the study
        ``<protocol>:<shared key>:floor`` (adding a cell scores no seed again), claimed as trials are, the row
        stored on its trial; a worker then waits for the seeds others hold, so no seed is scored twice
        (`benchmarks/bench_sweep_time.py` times the floor's share)."""
        from bench.sweep.floor import floor_row

        seeds = self.protocol.final_seeds
        name = f"{self.protocol.name}:{self.protocol.shared_key}:floor"
        return self._shared_rows(name, lambda slot: floor_row(self.protocol, self.prepared, seeds[slot]))

    def _cell_floor_rows(self) -> dict[tuple[str, int], dict[str, Any]]:
        """A learned-metric cell's own floor (its untrained trunk and metric, ranked by g: minutes a seed on a
        CPU), each seed scored by one worker as the floor's are: slots of the study ``<cell's study>:floor``."""
        from bench.sweep.floor import cell_floor_row, learned_metric_cells

        seeds = self.protocol.final_seeds
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for cell in learned_metric_cells(self.protocol, self.plan.cells):

            def score(slot: int, cell: Cell = cell) -> dict[str, Any]:
                return cell_floor_row(self.protocol, self.prepared, cell, seeds[slot])

            rows = self._shared_rows(f"{study_name(self.protocol, cell)}:floor", score)
            out.update({(cell.id, seed): row for seed, row in rows.items()})
        return out

    def _shared_rows(self, name: str, score: Callable[[int], dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Rows keyed by final seed, one per slot of the study ``name`` (a slot per final seed), each scored by
        the worker that claims it (``score(slot)``) and stored on its trial; then the rows others hold, once
        every slot is done."""
        seeds = self.protocol.final_seeds
        study = SlotStudy(self.storage, name, len(seeds))
        while (slot := self._claim(study)) is not None:
            try:
                with Heartbeat(self.storage, slot.trial_id), self.ledger.timing("floor"):
                    row = score(slot.slot)
            except BaseException:
                study.abandon(slot, "interrupted")
                raise
            with self.ledger.timing("records"):
                slot.trial.set_user_attr("row", row)
                study.study.tell(slot.trial, 0.0)
        while True:
            with self.ledger.timing("records"):
                if study.finished():
                    break
            with self.ledger.timing("waiting"):
                time.sleep(min(self.options.poll_s, 2.0))
        return {seeds[s]: dict(t.user_attrs["row"]) for s, t in study.counted().items() if "row" in t.user_attrs}

    def _floor_records(self, floor: Any) -> None:
        """One MLflow run per floor seed (kind ``floor``), so a leaderboard rebuilt from MLflow alone has it; a
        learned-metric cell's own floor (a ``cell`` column) is kind ``cell_floor``, tagged with its cell."""
        cells = {c.id: c for c in self.plan.cells}
        for row in floor.to_dict("records"):
            seed = int(row["seed"])
            cell = str(row["cell"]) if "cell" in row else None
            tags = (
                {"kind": "floor", "seed": seed} if cell is None else {"kind": "cell_floor", "cell": cell, "seed": seed}
            )
            run_id = self.mlflow.run(
                self.mlflow.key(None, "floor", seed) if cell is None else self.mlflow.key(cells[cell], "floor", seed),
                f"floor seed {seed}" if cell is None else f"floor of {cell} seed {seed}",
                tags={**tags, "state": "COMPLETE", **self.code},
                shared=True,
            )
            self.mlflow.log(run_id, metrics={m: row[m] for m in self.metrics})
            self.mlflow.end(run_id, "COMPLETE")

    def step(self, it: int, total: int, loss: float) -> None:
        """Every progress step of a training run: honour a stop request and the time limit, then show progress."""
        if STOP.is_set():
            raise KeyboardInterrupt
        self._check_time(0.0)
        self.progress.iteration(it, total, loss)


class _FinalSlot(Record):
    """A final seed's record: its slot of the cell's finals study (held by a heartbeat while it trains,
    given back if interrupted), the attributes the tables are rebuilt from, the primary metric told."""

    def __init__(self, sweep: Sweep, cell: Cell, study: SlotStudy, slot: Slot, best: Any, seed: int, draw: int) -> None:
        super().__init__(
            sweep.mlflow.key(cell, f"{_draw_prefix(draw)}seed{seed}"),
            f"{_draw_prefix(draw, ' ')}final seed {seed}",
            {"cell": cell.id, "kind": "final", "seed": seed, **({"draw": draw} if draw else {})},
            parent=sweep._cell_run(cell),
            params={"best_trial": best.user_attrs["slot"]},
        )
        self.sweep, self.study, self.slot, self.best, self.draw = sweep, study, slot, best, draw
        self.slot_cell = cell.id

    def held(self) -> Heartbeat:
        return Heartbeat(self.sweep.storage, self.slot.trial_id)

    def abandon(self) -> None:
        with suppress(StoreUnavailableError):
            self.study.abandon(self.slot, "interrupted")

    def write(self, run: FinalRun) -> None:
        import optuna
        from optuna.trial import TrialState

        s, best, result = self.sweep, self.best, run.result
        attrs = {
            "seed": run.seed,
            "draw": self.draw,
            "params": best.params,
            "val_value": best.value,
            "best_trial": best.user_attrs["slot"],
            "metrics": run.metrics,
            "iterations": result.iterations,
            "samples_seen": result.samples_seen,
            "wall_time_s": round(result.wall_time_s, 3),
            "train_fingerprint": s.fingerprints["train"],
            "test_fingerprint": s.fingerprints["test"],
            "reason": result.reason,
            **s.code,
        }
        if run.folds:  # final.mode folds: the fold models scored alone, and what each trained
            attrs["separate"] = run.separate
            attrs["fold_iterations"] = [r.iterations for r in run.folds]
        state = TrialState[result.state]
        try:
            for key, value in attrs.items():
                self.slot.trial.set_user_attr(key, value)
            self.study.study.tell(
                self.slot.trial, run.metrics.get(s.primary) if state == TrialState.COMPLETE else None, state=state
            )
        except optuna.exceptions.UpdateFinishedTrialError:
            s.line(_taken_over(self.slot_cell, f"final seed {run.seed}"))


class _TrialHooks(Hooks):
    """MLflow child runs per fold and progress for one trial."""

    def __init__(self, sweep: Sweep, cell: Cell, trial_run: str, draw: int = 0) -> None:
        self.sweep, self.cell, self.trial_run, self.draw = sweep, cell, trial_run, draw
        self.fold_run: str | None = None
        self.folds_run = 0
        self.records_s = 0.0  # seconds of the MLflow records below, inside the trial's run_trial

    def _timed(self, fn: Any) -> None:
        began = time.perf_counter()
        try:
            fn()
        finally:
            self.records_s += time.perf_counter() - began

    def fold_started(self, slot: int, fold: int, seed: int, train_split: Any, val_split: Any) -> None:
        self._timed(lambda: self._fold_started(slot, fold, seed, train_split, val_split))

    def _fold_started(self, slot: int, fold: int, seed: int, train_split: Any, val_split: Any) -> None:
        s = self.sweep
        self.fold_run = s.mlflow.run(
            s.mlflow.key(self.cell, f"{_draw_prefix(self.draw)}trial{slot}", f"fold{fold}"),
            f"{_draw_prefix(self.draw, ' ')}trial {slot} {fold_label(fold)}",
            self.trial_run,
            tags={
                "cell": self.cell.id,
                "kind": "fold",
                "trial": slot,
                **({"draw": self.draw} if self.draw else {}),
                "fold": fold,
                "train_fingerprint": train_split.fingerprint,
                "validation_fingerprint": val_split.fingerprint,
            },
        )
        s.mlflow.log(self.fold_run, params={"seed": seed})
        s.progress.run_started(s.plan.budget.slot_iterations(slot))

    def iteration(self, it: int, total: int, loss: float) -> None:
        self.sweep.step(it, total, loss)

    def fold_finished(self, slot: int, fold: int, result: RunResult) -> None:
        self._timed(lambda: self._fold_finished(slot, fold, result))

    def _fold_finished(self, slot: int, fold: int, result: RunResult) -> None:
        s = self.sweep
        assert self.fold_run is not None  # fold_started opened it
        self.folds_run += 1
        s.progress.run_finished()
        metrics = {f"val_{k}": v for k, v in result.metrics.items()}
        s.mlflow.log(
            self.fold_run,
            metrics={
                **metrics,
                "iterations": result.iterations,
                "samples_seen": result.samples_seen,
                "final_loss": result.final_loss,
                "wall_time_s": result.wall_time_s,
            },
            tags={"state": result.state, "reason": result.reason[:500]},
        )
        s.mlflow.end(self.fold_run, result.state)
        self.fold_run = None

    def interrupted(self) -> None:
        if self.fold_run is not None:
            self.sweep.mlflow.end(self.fold_run, "KILLED")


def _exists(storage: Any, name: str) -> bool:
    """Whether the storage holds a study of this name."""
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


def _draw_prefix(draw: int, sep: str = "-") -> str:
    """What names a record of tuning draw ``draw`` apart (MLflow keys and run names): nothing for draw 0, so a
    sweep without tuning.repeats keeps its names."""
    return f"draw{draw}{sep}" if draw else ""


def _of_draw(draw: int, draws: int) -> str:
    return f" in tuning draw {draw}" if draws > 1 else ""


def _taken_over(cell: str, what: str) -> str:
    """The line said when a worker's slot was failed as stale while it trained (its heartbeats could not reach
    the storage for longer than the grace period): the replacement trains it, this result is dropped."""
    return (
        f"{cell} {what}: taken over by another worker while the storage was unreachable (no heartbeat for "
        "longer than the grace period); its replacement is the record, this result is dropped"
    )


def run_protocol(path: str | Path | Protocol, options: Options) -> SweepResult:
    """Run (or resume) a protocol and return its tables (also written under `options.results_dir`).

    A BenchError names the cells refused by the budget audit; an interrupted
    sweep raises KeyboardInterrupt after giving its running trial back, and
    the same call resumes it.
    """
    STOP.clear()  # a stop asked of an earlier sweep in this process is not this one's
    protocol = path if isinstance(path, Protocol) else load_protocol(path)
    outcome = Sweep(protocol, options).run()
    if outcome.refused:
        first = next(iter(outcome.refused.items()))
        raise BenchError(
            f"refused to report {len(outcome.refused)} cell(s) whose budget differs from the protocol's "
            f"(see {outcome.results / tables.MANIFEST}): {first[0]}: {first[1]}"
        )
    return SweepResult.read(
        outcome.results, outcome.cells, outcome.wall_time_s, outcome.recorded_iterations, outcome.total_iterations
    )
