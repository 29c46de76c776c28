"""A sweep's tuning phase: one trial slot of a cell trained, recorded in MLflow and told to its Optuna study.

The trial itself is `bench.sweep.tuning.run_trial`; here are its records: a
child MLflow run per trial and per fold (`_TrialHooks`), MLflow first and
Optuna last, so a trial Optuna holds as finished always has its MLflow
record. Under successive halving a slot trains its rung's iterations, a
promoted slot its configuration's values, and a slot whose rung waits for
the one before it is not claimed (or given back at once).
"""

from __future__ import annotations

import math
import time
from contextlib import suppress
from typing import Any

from bench.data.splits import fold_label
from bench.plan import Cell
from bench.resume import RunState, resumed_tag
from bench.stores.retry import StoreUnavailableError
from bench.sweep.accounts import Accounts
from bench.sweep.seeds import for_draw
from bench.sweep.tuning import (
    Heartbeat,
    Hooks,
    RunResult,
    Slot,
    SlotStudy,
    TrialOutcome,
    fixed_sampler,
    held,
    promoted,
    ready,
    run_trial,
    rung_for,
    trial_attrs,
)
from bench.sweep.worker import draw_prefix, taken_over


class TrialPhase(Accounts):
    """A worker's trials: claim a slot (the rungs allowing), train it, record it."""

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

    def _trial(self, cell: Cell, study: SlotStudy, slot: Slot, draw: int) -> None:
        import optuna
        from optuna.trial import TrialState

        began = time.perf_counter()
        parent = self._cell_run(cell)
        run_id = self.mlflow.run(
            self.mlflow.key(cell, f"{draw_prefix(draw)}trial{slot.slot}"),
            f"{draw_prefix(draw, ' ')}trial {slot.slot}",
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
            self.line(taken_over(cell.id, f"trial {slot.slot}"))
            return
        counts = self._done_iterations()
        self.progress.recorded(counts.done, counts.trained, counts.left)
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


class _TrialHooks(Hooks):
    """MLflow child runs per fold and progress for one trial."""

    def __init__(self, sweep: Accounts, cell: Cell, trial_run: str, draw: int = 0) -> None:
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
            s.mlflow.key(self.cell, f"{draw_prefix(self.draw)}trial{slot}", f"fold{fold}"),
            f"{draw_prefix(self.draw, ' ')}trial {slot} {fold_label(fold)}",
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

    def run_state(self, slot: int, fold: int) -> RunState:
        s = self.sweep
        return s.run_state(self.cell, s.mlflow.key(self.cell, f"{draw_prefix(self.draw)}trial{slot}", f"fold{fold}"))

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
            tags={"state": result.state, "reason": result.reason[:500], **resumed_tag(result.resumed)},
        )
        s.mlflow.end(self.fold_run, result.state)
        self.fold_run = None

    def interrupted(self) -> None:
        if self.fold_run is not None:
            self.sweep.mlflow.end(self.fold_run, "KILLED")
