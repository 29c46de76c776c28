"""One sweep worker's state and set-up, before its first trial: what every phase of a sweep reads.

`Worker.__init__` makes every refusal `validate` makes (bench.sweep.preflight)
before any record is written or moved; `setup` resolves the precision, claims
the results folder (another version's moved aside), opens the MLflow records
and the Optuna studies (one tuning and one finals study per cell and tuning
draw), discards the ``--redo`` cells and fills the manifest. The phases
(bench.sweep.trial_phase, final_phase, floor_phase) and the accounts
(bench.sweep.accounts) build on it; bench.sweep.runner orchestrates them.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.clock import Ledger
from bench.data.query_gallery import QueryGallery
from bench.devices import describe
from bench.errors import BenchError
from bench.metrics.geometry import geometry
from bench.plan import Cell, Plan, cell_key, plan
from bench.protocol import Protocol
from bench.resume import FOLDER as RESUME_DIR
from bench.resume import RunState, clear_kind, state_path
from bench.stores import provenance, tracking
from bench.stores.mlflow_runs import MlflowRecords
from bench.stores.urls import default_url, redact
from bench.sweep import tables
from bench.sweep.precision import resolve_precision
from bench.sweep.preflight import refuse, short_classes_notice
from bench.sweep.prepare import Prepared, small_classes_notice
from bench.sweep.progress import Progress
from bench.sweep.records import collect, metric_names
from bench.sweep.tuning import SlotStudy, make_pruner, open_storage, study_name

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
    stop_after_s: float | None = None  # wall-time limit of this worker (`bench.sweep.accounts.TimeUp`); None: none
    device: str | None = None  # training.device overridden (`Protocol.with_device`); None: the protocol's


def _query_counts(test: Any) -> dict[str, Any]:
    """A query/gallery test's queries and how many have a match in the gallery: the others are skipped by
    the ranking metrics (as PML skips them), so a table says what its numbers average over."""
    if not isinstance(test, QueryGallery):
        return {}
    return {"test_queries": {"total": len(test.query), "with_a_match": test.matched_queries()}}


def chosen_cells(protocol: Protocol, cells: tuple[str, ...]) -> set[str]:
    """The planned cells ``--cells`` names (empty: all); a name the plan does not hold is refused, one line."""
    if not cells:
        return set()
    known = [c.id for c in plan(protocol).cells]
    unknown = [c for c in cells if c not in known]
    if unknown:
        raise BenchError(f"--cells: no cell {unknown[0]!r} in {protocol.name}; cells: {', '.join(known)}")
    return set(cells)


class Worker:
    """One worker's pass over a protocol: its protocol, plan, data, stores, ledger and manifest; any number
    of workers may run against the same storage."""

    progress: Progress  # set when the sweep starts (`Sweep.run`); `line` logs before it

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
        # the running units' saved states (`bench.resume`), one folder per cell: a unit given back goes on
        # from its state when claimed again by a worker that reads this results folder
        self.resume_dir = self.results / RESUME_DIR
        self.storage = open_storage(self.storage_url)
        self.primary = protocol.primary
        self.metrics = metric_names(protocol.spec.evaluation)

    def setup(self) -> None:
        """Load the data, make the results directory this protocol's (moving another version aside), open
        the MLflow records and the Optuna studies, and discard the --redo cells: all before the first trial."""
        if self.options.cells:  # a job rewrites its folder's tables with its own cells alone
            outside = sorted(
                tables.cells_kept(self.results, self.protocol.shared_hash, self.protocol.data) - set(self.options.cells)
            )
            if outside:
                raise BenchError(
                    f"--cells: {self.results} holds the tables of {len(outside)} cell(s) outside this job "
                    f"({', '.join(outside[:3])}{' ...' if len(outside) > 3 else ''}), which a job would drop from "
                    "them: give each job its own --results-dir (`dmlbench merge` joins them; docs/cluster.md)"
                )
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
        # this worker's CPU, threads and the device it trains on (with --device, the override too): the
        # manifest lists every part's, so a sweep resumed on a lent GPU says which parts trained there
        self.part = {
            **provenance.hardware(),
            "device": self.code["device"],
            **({"device_override": self.options.device} if self.options.device else {}),
        }
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
            # one entry per worker start that claims a unit (`Accounts._claim`): a resumed sweep says where each
            # part ran, and a start that found nothing left to do is no part of it
            "hardware": list(earlier),
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
        shutil.rmtree(self.resume_dir / tables.check_cell_id(cell.id), ignore_errors=True)
        self.line(f"redo {cell.id}: discarded {studies} Optuna studies and {runs} MLflow runs")

    def run_state(self, cell: Cell, key: str) -> RunState:
        """Where the unit with MLflow key ``key`` (a trial's fold, a final seed) of ``cell`` saves its state."""
        return RunState(state_path(self.resume_dir / tables.check_cell_id(cell.id), key), key, on_resume=self._resumed)

    def _resumed(self, it: int) -> None:
        if hasattr(self, "progress"):  # set once the sweep's work begins (`Sweep.run`)
            self.progress.resumed(it)

    def clear_states(self, cell: Cell) -> None:
        """A cell's units all recorded: no state of them is left to go on from (one a unit left here before
        it ended on another machine is removed)."""
        clear_kind(self.resume_dir / tables.check_cell_id(cell.id))

    def _cell_run(self, cell: Cell) -> str:
        """The cell's parent MLflow run, opened once per worker."""
        if cell.id not in self.cell_runs:
            self.cell_runs[cell.id] = self.mlflow.cell_run(cell)
        return self.cell_runs[cell.id]

    def _write(self, finished: bool) -> dict[str, str]:
        with self.ledger.timing("tables"):
            records = collect(self.plan, self.storage)
            return tables.write(self.plan, records, self.results, self.manifest, finished=finished)


def draw_prefix(draw: int, sep: str = "-") -> str:
    """What names a record of tuning draw ``draw`` apart (MLflow keys and run names): nothing for draw 0, so a
    sweep without tuning.repeats keeps its names."""
    return f"draw{draw}{sep}" if draw else ""


def of_draw(draw: int, draws: int) -> str:
    return f" in tuning draw {draw}" if draws > 1 else ""


def taken_over(cell: str, what: str) -> str:
    """The line said when a worker's slot was failed as stale while it trained (its heartbeats could not reach
    the storage for longer than the grace period): the replacement trains it, this result is dropped."""
    return (
        f"{cell} {what}: taken over by another worker while the storage was unreachable (no heartbeat for "
        "longer than the grace period); its replacement is the record, this result is dropped"
    )
