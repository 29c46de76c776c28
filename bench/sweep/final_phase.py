"""A sweep's final-seed phase: a cell's final seeds retrained with its best trial's parameters and recorded.

Each seed is a slot of the cell's finals study (of its tuning draw), claimed
as trials are; its training, scoring and artifacts are
`bench.sweep.final_run.train_final`'s, its record here (`_FinalSlot`: the
attributes the tables are rebuilt from, the primary metric told). Under a
seed range (`bench.plan.seeds`) the seeds past the minimum are asked for one
at a time, in seed order, while the rule asks for another.
"""

from __future__ import annotations

import json
import time
from contextlib import suppress
from typing import Any

from bench.plan import Cell
from bench.plan.seeds import seeds_wanted
from bench.resume import RunState
from bench.stores.retry import StoreUnavailableError
from bench.sweep import tables
from bench.sweep.accounts import Accounts
from bench.sweep.final_run import FinalRun, Record, train_final
from bench.sweep.seeds import for_draw
from bench.sweep.tuning import Heartbeat, Slot, SlotStudy, final_iterations
from bench.sweep.worker import Worker, draw_prefix, taken_over


class FinalPhase(Accounts):
    """A worker's final seeds: claim a seed, train it, record it; a seed range's further seeds."""

    def _more_seeds(self, cell: Cell, draw: int, best: Any) -> bool:
        """A seed range's seeds past the minimum, one at a time in seed order while the rule asks for another
        (`bench.plan.seeds`); True once the rule stopped, False while another worker trains the next seed."""
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
        counts = self._done_iterations()
        self.progress.recorded(counts.done, counts.trained, counts.left)
        self.progress.final(cell.id, seed, result.state, run.metrics, self.primary, result.wall_time_s, result.reason)
        # the final's time: its loop, its test scoring and artifacts, its set-up, and records (the rest)
        self.ledger.add("training", result.train_s)
        self.ledger.add("test", result.score_s + run.artifacts_s)
        self.ledger.add("run set-up", result.wall_time_s - result.train_s - result.score_s)
        self.ledger.add("records", time.perf_counter() - began - result.wall_time_s - run.artifacts_s)
        self.longest_s = max(self.longest_s, time.perf_counter() - began)


class _FinalSlot(Record):
    """A final seed's record: its slot of the cell's finals study (held by a heartbeat while it trains,
    given back if interrupted), the attributes the tables are rebuilt from, the primary metric told."""

    def __init__(
        self, sweep: Worker, cell: Cell, study: SlotStudy, slot: Slot, best: Any, seed: int, draw: int
    ) -> None:
        super().__init__(
            sweep.mlflow.key(cell, f"{draw_prefix(draw)}seed{seed}"),
            f"{draw_prefix(draw, ' ')}final seed {seed}",
            {"cell": cell.id, "kind": "final", "seed": seed, **({"draw": draw} if draw else {})},
            parent=sweep._cell_run(cell),
            params={"best_trial": best.user_attrs["slot"]},
        )
        self.sweep, self.study, self.slot, self.best, self.draw = sweep, study, slot, best, draw
        self.cell, self.slot_cell = cell, cell.id

    def held(self) -> Heartbeat:
        return Heartbeat(self.sweep.storage, self.slot.trial_id)

    def abandon(self) -> None:
        with suppress(StoreUnavailableError):
            self.study.abandon(self.slot, "interrupted")

    def run_state(self) -> RunState:
        return self.sweep.run_state(self.cell, self.key)

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
            s.line(taken_over(self.slot_cell, f"final seed {run.seed}"))
