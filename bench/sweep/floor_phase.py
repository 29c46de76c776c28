"""A sweep's floor phase: the untrained trunk (and a learned-metric cell's untrained trunk and metric) scored
on every final seed, each seed by one worker, and recorded in MLflow.

The scoring and floor.csv / cell_floor.csv are `bench.sweep.floor`'s; here
the seeds are shared between workers: slots of the study
``<protocol>:<shared key>:floor`` (a cell's own: ``<cell's study>:floor``),
claimed as trials are, each row stored on its trial. The floor needs nothing
the cells make, so a worker with no cell work to claim (the others hold it)
scores a floor seed instead of waiting (`FloorPhase.floor_while_waiting`);
the floor phase then finds it done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.plan import Cell
from bench.sweep.accounts import Accounts
from bench.sweep.floor import cell_floor_row, floor_row, learned_metric_cells, update_cell_floor, update_floor
from bench.sweep.tuning import Heartbeat, SlotStudy, study_name


class FloorPhase(Accounts):
    """A worker's share of the floor: claim a seed, score it, then read the rows other workers scored."""

    _units: list[tuple[str, Callable[[int], dict[str, Any]]]] | None = None  # `_floor_units`, made once
    _floor_claimed = False  # every floor seed claimed (by any worker): `floor_while_waiting` looks no more
    _learned: list[Cell] | None = None  # `_learned_cells`, found once

    def floor(self) -> None:
        """floor.csv and cell_floor.csv updated with every final seed's rows, and their MLflow runs."""
        self._floor_records(update_floor(self.protocol, self.prepared, self.results, self._floor_rows()))
        rows = self._cell_floor_rows()  # times its own scoring, records and waiting: not inside "floor" again
        with self.ledger.timing("floor"):
            cell_floor = update_cell_floor(self.protocol, self.prepared, self.results, self.plan.cells, rows)
        self._floor_records(cell_floor)

    def floor_while_waiting(self) -> bool:
        """Score one floor seed not yet claimed (the floor's, then each learned-metric cell's own): what a
        worker does when every cell it could work on waits for other workers. False when none is left."""
        if self._floor_claimed:
            return False
        for (name, score), cell in zip(self._floor_units(), [None, *self._learned_cells()]):
            study = SlotStudy(self.storage, name, len(self.protocol.final_seeds))
            slot = self._claim(study)
            if slot is not None:
                self._score_slot(study, slot, score)
                whose = "the floor" if cell is None else f"{cell.id}'s own floor"
                self.line(f"{whose}, seed {self.protocol.final_seeds[slot.slot]}, scored while the cells wait")
                return True
        self._floor_claimed = True
        return False

    def _floor_units(self) -> list[tuple[str, Callable[[int], dict[str, Any]]]]:
        """The floor's studies and how a slot of each is scored: the floor, then every learned-metric cell's."""
        if self._units is not None:
            return self._units
        seeds = self.protocol.final_seeds
        units: list[tuple[str, Callable[[int], dict[str, Any]]]] = [
            (
                f"{self.protocol.name}:{self.protocol.shared_key}:floor",
                lambda slot: floor_row(self.protocol, self.prepared, seeds[slot]),
            )
        ]
        for cell in self._learned_cells():

            def score(slot: int, cell: Cell = cell) -> dict[str, Any]:
                return cell_floor_row(self.protocol, self.prepared, cell, seeds[slot])

            units.append((f"{study_name(self.protocol, cell)}:floor", score))
        self._units = units
        return units

    def _learned_cells(self) -> list[Cell]:
        """The learned-metric cells, whose own floors follow the floor's in `_floor_units` (found once)."""
        if self._learned is None:
            self._learned = learned_metric_cells(self.protocol, self.plan.cells)
        return self._learned

    def _floor_rows(self) -> dict[int, dict[str, Any]]:
        """The floor's rows, each seed scored by one worker: seeds are slots of the study
        ``<protocol>:<shared key>:floor`` (adding a cell scores no seed again), claimed as trials are, the row
        stored on its trial; a worker then waits for the seeds others hold, so no seed is scored twice
        (`benchmarks/bench_sweep_time.py` times the floor's share)."""
        name, score = self._floor_units()[0]
        return self._shared_rows(name, score)

    def _cell_floor_rows(self) -> dict[tuple[str, int], dict[str, Any]]:
        """A learned-metric cell's own floor (its untrained trunk and metric, ranked by g: seconds to minutes a
        seed on a CPU), each seed scored by one worker as the floor's are: slots of the study ``<cell's
        study>:floor``."""
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for cell, (name, score) in zip(self._learned_cells(), self._floor_units()[1:]):
            rows = self._shared_rows(name, score)
            out.update({(cell.id, seed): row for seed, row in rows.items()})
        return out

    def _shared_rows(self, name: str, score: Callable[[int], dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Rows keyed by final seed, one per slot of the study ``name`` (a slot per final seed), each scored by
        the worker that claims it (``score(slot)``) and stored on its trial; then the rows others hold, once
        every slot is done."""
        seeds = self.protocol.final_seeds
        study = SlotStudy(self.storage, name, len(seeds))
        while (slot := self._claim(study)) is not None:
            self._score_slot(study, slot, score)
        while True:
            with self.ledger.timing("records"):
                if study.finished():
                    break
            with self.ledger.timing("waiting"):
                time.sleep(min(self.options.poll_s, 2.0))
        return {seeds[s]: dict(t.user_attrs["row"]) for s, t in study.counted().items() if "row" in t.user_attrs}

    def _score_slot(self, study: SlotStudy, slot: Any, score: Callable[[int], dict[str, Any]]) -> None:
        """Score a claimed floor slot and store its row on its trial (given back if interrupted)."""
        try:
            with Heartbeat(self.storage, slot.trial_id), self.ledger.timing("floor"):
                row = score(slot.slot)
        except BaseException:
            study.abandon(slot, "interrupted")
            raise
        with self.ledger.timing("records"):
            slot.trial.set_user_attr("row", row)
            study.study.tell(slot.trial, 0.0)

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
