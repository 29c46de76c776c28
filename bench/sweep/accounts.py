"""What a sweep worker has done and has left, its time limit and stop requests.

Done and left are read from the shared storage, so they count every
worker's records: a trial slot finished, a final seed finished (a seed
range's rule stopped counts the seeds it did not need as done, as a cell
with no completed trial counts all of them). ``--stop-after``: no slot is
claimed once the longest trial or seed this worker has run would end past
the limit, and a unit still running at the limit is given back (`TimeUp`).
The wall time is accounted by `bench.clock.Ledger` (`time_table`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from bench.plan import Cell
from bench.plan.seeds import stops_at
from bench.sweep import tables
from bench.sweep.tuning import Slot, SlotStudy, best_trial, extra_seed_study, top_slots
from bench.sweep.worker import Worker

STOP = threading.Event()


class TimeUp(KeyboardInterrupt):
    """A worker's ``--stop-after`` limit reached with work left: raised where an interruption is (so the
    running trial, if any, is given back and the tables are written as after Ctrl-C); ``remaining`` says
    what is left (`Accounts.remaining`)."""

    def __init__(self, remaining: dict[str, Any]) -> None:
        super().__init__("time limit reached")
        self.remaining = remaining


def request_stop() -> None:
    """Ask a running sweep to stop as after Ctrl-C: its running trial is given back, then it raises
    KeyboardInterrupt. For signal handlers: the KeyboardInterrupt a handler raises can be lost (when it
    lands in a garbage-collection callback Python only prints it and training runs on), so the sweep
    also checks this flag at every progress step of a training run."""
    STOP.set()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM as a stop request for the work inside: a KeyboardInterrupt where the signal
    lands, and the `STOP` flag that every training step and every claim checks, since that KeyboardInterrupt
    is lost when it lands in a garbage-collection or weakref callback (Python then prints "Exception ignored"
    and goes on; that notice is kept off stderr). A stop asked as the work ends still ends it as interrupted:
    Ctrl-C always means exit 130, never a run that went on to exit 0. Handlers only in the main thread, the
    one place Python allows them; restored on the way out."""
    STOP.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        request_stop()
        raise KeyboardInterrupt

    def unraisable(info: Any) -> None:
        if not (isinstance(info.exc_value, KeyboardInterrupt) and STOP.is_set()):
            hook(info)

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook
    for s in before:
        signal.signal(s, interrupt)
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        sys.unraisablehook = hook
    if STOP.is_set():
        raise KeyboardInterrupt


class Counts(NamedTuple):
    """A sweep's store as a worker counts it (`Accounts._done_iterations`)."""

    done: int  # allotted iterations recorded (a run stopped early spends its allotment)
    finished: set[str]  # cells whose finals are all recorded
    trained: int  # iterations the recorded runs trained
    left: int  # iterations the runs not yet recorded are expected to train


class Expected:
    """Iterations trained and expected: where early stopping or pruning ends runs before their allotment, the
    time left is the pace per trained iteration times what the unfinished runs will train, each expected to
    train its allotment scaled by what the finished runs of its kind trained of theirs (trials of the same
    allotment, a successive-halving rung; a cell's final seeds by its own, else by every cell's), its whole
    allotment while none of its kind has finished. A failed run's count is trained but says nothing of how
    long its kind trains (a diverging cell's trials fail at once); one without a recorded count (a worker
    killed mid-run) trained an unknown share and counts in neither."""

    def __init__(self) -> None:
        self.trained = 0
        self.spent: dict[Any, list[int]] = {}  # kind -> [trained, allotted] of its finished runs
        self.pending: list[tuple[Any, Any, int]] = []  # (kind, the kind to fall back on, allotment)

    def unit(self, kind: Any, fallback: Any, allotted: int, trial: Any) -> None:
        """One run (``trial`` None: not started): finished, it counts; else it is pending."""
        if trial is None or not trial.state.is_finished():
            self.pending.append((kind, fallback, allotted))
            return
        got = trial.user_attrs.get("iterations")
        if isinstance(got, int):
            self.trained += got
            if trial.state.name == "FAIL":
                return
            for k in (kind, fallback):
                if k is not None:
                    pair = self.spent.setdefault(k, [0, 0])
                    pair[0] += got
                    pair[1] += allotted

    def left(self) -> int:
        total = 0.0
        for kind, fallback, allotted in self.pending:
            trained, of = self.spent.get(kind) or self.spent.get(fallback) or (1, 1)
            total += allotted * (trained / of if of else 1.0)
        return round(total)


class Accounts(Worker):
    """A worker with its accounts: iterations done and left, claims under the time limit, stop requests."""

    def _best(self, cell: Cell, draw: int) -> Any:
        """The draw's best trial by validation value; under successive halving the best of the top rung."""
        counted = self.tuning[cell.id][draw].counted()
        return best_trial(top_slots(self.plan.budget.rungs, counted) if self.plan.budget.rungs else counted)

    def _no_winner(self, cell: Cell, draw: int) -> bool:
        return self.tuning[cell.id][draw].finished() and self._best(cell, draw) is None

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

    def _done_iterations(self) -> Counts:
        """Allotted iterations already recorded, the cells whose finals are all recorded, and for the time left
        the iterations the finished runs trained and those the unfinished ones are expected to train
        (`Expected`)."""
        b = self.plan.budget
        done, finished = 0, set()
        expected = Expected()
        for cell in self.plan.cells:
            cb = b.for_cell(cell)
            over = 0  # the cell's draws that are over: finals all recorded, or no trial completed
            for r, tuning in enumerate(self.tuning[cell.id]):
                counted = tuning.counted()
                trials = [s for s, t in counted.items() if t.state.is_finished()]
                values, stopped = self._seed_values(cell, r)
                no_winner = self._no_winner(cell, r)
                # a seed range that stopped early counts the seeds it did not need as done, as a cell with no
                # winner counts all its seeds
                done += sum(b.slot_iterations(s) for s in trials) * b.folds
                done += (b.seeds if no_winner or stopped else len(values)) * b.per_final
                over += no_winner or stopped
                for s in range(tuning.n):
                    allotted = b.folds * cb.slot_iterations(s)
                    expected.unit(("trial", allotted), None, allotted, counted.get(s))
                seeds = [t for study in self._seed_studies(cell, r) for t in study.counted().values()]
                for t in seeds:
                    expected.unit(("final", cell.id), "final", b.per_final, t)
                if not (no_winner or stopped):
                    unfinished = cb.seeds - sum(t.state.is_finished() for t in seeds)
                    for _ in range(max(unfinished, 0)):
                        expected.unit(("final", cell.id), "final", b.per_final, None)
            if over == b.draws:
                finished.add(cell.id)
        return Counts(done, finished, expected.trained, expected.left())

    def remaining(self) -> dict[str, Any]:
        """What the sweep has left: cells, trials and final seeds not yet recorded (across workers), the
        iterations they hold, and the time they would take at this worker's pace so far (None: no pace yet)."""
        b = self.plan.budget
        done, finished, *_ = self._done_iterations()
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

    def time_table(self, wall_s: float) -> dict[str, Any]:
        """This worker's wall time accounted (`bench.clock.Ledger`), as the manifest's ``time`` holds it: the
        worker it is of (the last worker to finish writes it), its seconds and shares by account."""
        return {"worker": f"{platform.node()}:{os.getpid()}", **self.ledger.table(wall_s)}

    def _claim(self, study: SlotStudy, *sampler: Any) -> Slot | None:
        if STOP.is_set():  # a stop whose KeyboardInterrupt was lost (`stop_on_signals`): nothing new is begun
            raise KeyboardInterrupt
        with self.ledger.timing("records"):
            if self.deadline is not None and study.open_slots():
                self._check_time(self.longest_s)
            slot = study.claim(*sampler)
            if slot is not None:
                self._join()
            return slot

    def _join(self) -> None:
        """This worker's part (`provenance.hardware`) joins the manifest with its first claimed unit, on disk at
        once: a worker killed in that unit has still done part of the work."""
        if self.part in self.manifest["hardware"]:
            return
        self.manifest["hardware"].append(self.part)
        if tables.read_manifest(self.results) is not None:  # else the first table written brings it
            tables.add_part(self.results, self.part)

    def _check_time(self, ahead_s: float) -> None:
        """Raise `TimeUp` when the limit falls within ``ahead_s`` seconds from now."""
        if self.deadline is not None and time.perf_counter() + ahead_s >= self.deadline:
            raise TimeUp(self.remaining())

    def step(self, it: int, total: int, loss: float) -> None:
        """Every progress step of a training run: honour a stop request and the time limit, then show progress."""
        if STOP.is_set():
            raise KeyboardInterrupt
        self._check_time(0.0)
        self.progress.iteration(it, total, loss)


def _exists(storage: Any, name: str) -> bool:
    """Whether the storage holds a study of this name."""
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True
