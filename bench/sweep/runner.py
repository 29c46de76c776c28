"""Running a protocol: tune every cell, retrain the best with the final seeds, score the floor, write the tables.

`Sweep` only orchestrates, in this order per worker: set-up
(bench.sweep.worker), every cell's trials (bench.sweep.trial_phase; the trial
objective, slots and search strategy are bench.sweep.tuning's), its final
seeds (bench.sweep.final_phase; a seed's training, scoring and artifacts
bench.sweep.final_run's, shared with the budget check), the floor
(bench.sweep.floor_phase, scored by bench.sweep.floor), the tables
(bench.sweep.tables). What is done and left, the time limit and stop
requests are bench.sweep.accounts'; the data bench.sweep.prepare's; the
seeds bench.sweep.seeds'; MLflow runs bench.stores.mlflow_runs'.

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

import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from bench.errors import BenchError
from bench.plan import Cell
from bench.protocol import Protocol, load_protocol
from bench.stores.retry import StoreUnavailableError
from bench.sweep import tables
from bench.sweep.accounts import STOP
from bench.sweep.final_phase import FinalPhase
from bench.sweep.floor_phase import FloorPhase
from bench.sweep.progress import Progress
from bench.sweep.result import SweepResult
from bench.sweep.seeds import for_draw
from bench.sweep.trial_phase import TrialPhase
from bench.sweep.tuning import make_sampler
from bench.sweep.worker import Options, of_draw

# `run_protocol(path, Options(...)) -> SweepResult` is the Python entry point (docs/python-api.md)
__all__ = ["Options", "Sweep", "SweepOutcome", "SweepResult", "run_protocol"]


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


class Sweep(TrialPhase, FinalPhase, FloorPhase):
    """One worker's pass over a protocol (`Worker`), its phases in order: every cell's trials, then its final
    seeds, then the floor; any number of workers may run against the same storage."""

    def run(self) -> SweepOutcome:
        """The sweep to its end: every planned cell tuned and run on its final seeds (resuming what a store
        already holds), then the tables written; returns what ran and where the tables are."""
        start = self.born
        self.setup()
        counts = self._done_iterations()
        self.progress = Progress(len(self.plan.cells), self.plan.total_iterations, counts.done, self.options.quiet)
        self.progress.recorded(counts.done, counts.trained, counts.left)
        self.progress.cell_done(len(counts.finished))
        self.ledger.add("start-up", time.perf_counter() - start)
        self.trained_from = (time.perf_counter(), counts.done)
        try:
            pending = [c for c in self.plan.cells if c.id not in counts.finished]
            for cell in self.plan.cells:  # finished before this worker began (elsewhere, perhaps): no state to keep
                if cell.id in counts.finished:
                    self.clear_states(cell)
            while pending:
                waiting = []
                for cell in pending:
                    if self._work(cell):
                        self.progress.cell_done()
                        self.clear_states(cell)
                        self._write(finished=False)
                    else:
                        waiting.append(cell)
                # nothing to claim in any cell: a floor seed instead, else wait for the other workers
                if waiting and len(waiting) == len(pending) and not self.floor_while_waiting():
                    self.line(
                        f"waiting for other workers: {', '.join(c.id for c in waiting[:3])}"
                        + (" ..." if len(waiting) > 3 else "")
                    )
                    self._check_time(0.0)
                    with self.ledger.timing("waiting"):
                        time.sleep(self.options.poll_s)
                pending = waiting
            self.floor()
            self.manifest["finished"] = tables.now()
            self.manifest["time"] = self.time_table(time.perf_counter() - start)
            refused = self._write(finished=True)
        except KeyboardInterrupt:
            # the cells left open are marked KILLED where the store lets us: one away, or locked by the call the
            # interrupt cut short, gets nothing (the rerun reopens them and resumes), and no traceback hides
            # the interruption
            with suppress(Exception):
                for run_id in self.cell_runs.values():
                    self.mlflow.end(run_id, "KILLED")
            with suppress(StoreUnavailableError):
                self._write(finished=False)
            raise
        finally:
            self.progress.close()
        return SweepOutcome(
            self.results,
            refused,
            len(self.plan.cells),
            time.perf_counter() - start,
            counts.done,
            self.plan.total_iterations,
        )

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
                self.line(f"{cell.id}: no trial completed{of_draw(r, b.draws)}, nothing to retrain")
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
