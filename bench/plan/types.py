"""What a plan is made of: the cells of a protocol's grid, the pairs dropped, the budget, the cost figures.

Types only: this module imports nothing of the sweep, so that everything that
names a cell (tuning, tables, reports) can import it without importing the
planner or its cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from bench.plan.rungs import rung_of
from bench.protocol import Protocol


@dataclass(frozen=True)
class TrunkCost:
    """Seconds per training step at the reference size, and per embedded image (no gradient)."""

    step_s: tuple[float, float]  # (low, high) at ref_batch and ref_pixels
    embed_s: float  # per image at ref_pixels
    ref_batch: int = 128
    ref_pixels: int = 28 * 28
    ref_hw: tuple[int, int] | None = None  # the measured image's height and width, when not square
    measured: bool = True
    source: str = ""  # where the figure comes from, printed beside the estimate
    threads: int | None = None  # CPU threads it was timed on here (None: not timed here)
    # how much slower than its CPU time the timed step ran (wall x threads / CPU seconds, at least 1): other
    # work on the machine; the figures not timed here (records, metrics, start-up) are stretched by it too
    slowdown: float = 1.0


@dataclass(frozen=True)
class Cell:
    """One loss with one miner: what a study tunes and the finals retrain."""

    id: str
    loss: str
    miner: str | None
    loss_params: dict[str, Any]
    miner_params: dict[str, Any]
    search_space: dict[str, dict[str, Any]]  # "loss.<name>" / "miner.<name>" -> distribution
    dataset_level: bool = False
    digest: str = ""  # sha256 of what the cell's training depends on (`bench.plan.grid.cell_digest`)

    @property
    def miner_label(self) -> str:
        return self.id.split("+", 1)[1]


def cell_key(protocol: Protocol, cell: Cell) -> str:
    """What a cell's records (Optuna studies, MLflow runs, table rows) are keyed by: 12 hex of its digest (the
    protocol's shared settings and the cell's own definition), then the data's 8 once the protocol is bound to
    them (`Protocol.with_data`), as ``Protocol.key12`` is for the whole protocol. Another cell added to or
    removed from the grid changes no other cell's key."""
    return f"{cell.digest[:12]}.{protocol.data[:8]}" if protocol.data else cell.digest[:12]


@dataclass(frozen=True)
class Dropped:
    """A grid cell left out of the plan, and why (an incompatible pair, or not selected)."""

    cell: str
    reason: str


@dataclass(frozen=True)
class Budget:
    """What every cell receives: trials x folds training runs in tuning, then per final seed one run (final
    mode ``retrain``) or one run per fold (``folds``: `final_runs` = folds)."""

    trials: int
    folds: int
    iterations: int  # per training run; under early stopping the most a run may train
    batch_size: int
    seeds: int
    early_stopping: bool = False  # runs may stop before `iterations` (training.early_stopping): a maximum
    final_runs: int = 1  # training runs per final seed: 1, or the folds under final.mode folds
    # tuning draws (tuning.repeats): the tuning stage run this many times with independent seeds, each draw's
    # winner trained on its own final seeds; `trials` and `seeds` are per draw
    draws: int = 1
    # tuning.strategy successive_halving: (configurations, iterations each) per rung (`bench.plan.rungs`); each
    # (configuration, rung) is a trial slot, rung 0's first. (): every trial trains ``iterations``
    rungs: tuple[tuple[int, int], ...] = ()
    # final.seeds as a range (`bench.plan.seeds`): at least seeds_min, at most ``seeds``, stopping at half_width.
    # 0: a fixed number, ``seeds``
    seeds_min: int = 0
    half_width: float = 0.0
    # tuning.unsearched: one: a cell that searches nothing gets one trial (its trials would differ by seed alone)
    unsearched_one: bool = False

    def trials_for(self, cell: Cell) -> int:
        """Trials of ``cell`` in each tuning draw: ``trials``, or 1 for a cell with nothing to search under
        ``tuning.unsearched: one``."""
        return 1 if self.unsearched_one and not cell.search_space else self.trials

    def trial_count_for(self, cell: Cell) -> int:
        """Trials ``cell`` records over every draw (its slots in each)."""
        return self.for_cell(cell).trial_count

    def for_cell(self, cell: Cell) -> Budget:
        """This budget as ``cell`` receives it: its own number of trials (`trials_for`)."""
        return replace(self, trials=self.trials_for(cell), unsearched_one=False)

    @property
    def final_mode(self) -> str:
        return "folds" if self.final_runs > 1 else "retrain"

    @property
    def slots(self) -> int:
        """Trial slots of one tuning draw: ``trials``, or under successive halving every rung's configurations."""
        return sum(n for n, _ in self.rungs) if self.rungs else self.trials

    def slot_iterations(self, slot: int) -> int:
        """The iterations one fold of trial slot ``slot`` trains (at most, under early stopping)."""
        if not self.rungs:
            return self.iterations

        return self.rungs[rung_of(self.rungs, slot)][1]

    @property
    def adaptive_seeds(self) -> bool:
        return self.seeds_min > 0

    @property
    def trial_count(self) -> int:
        """Trials a cell records: ``slots`` in each tuning draw."""
        return self.slots * self.draws

    @property
    def final_count(self) -> int:
        """Final seeds a cell records: ``seeds`` in each tuning draw."""
        return self.seeds * self.draws

    @property
    def tuning_runs(self) -> int:
        return self.trial_count * self.folds

    @property
    def tuning_iterations(self) -> int:
        if self.rungs:
            return self.draws * self.folds * sum(n * b for n, b in self.rungs)
        return self.tuning_runs * self.iterations

    @property
    def min_final_count(self) -> int:
        """Final seeds a cell records at the least: ``seeds_min`` (a range) or ``seeds``, in each tuning draw."""
        return (self.seeds_min or self.seeds) * self.draws

    @property
    def min_total_iterations(self) -> int:
        """The budget when every cell stops at its range's minimum of seeds (``total_iterations`` otherwise)."""
        return self.tuning_iterations + self.min_final_count * self.per_final

    def record(self) -> dict[str, object]:
        """The budget as the manifest keeps it: the keys of a strategy, a seed range or one trial for unsearched
        cells only where they are set, so a protocol without them records what it always did."""
        out = dict(vars(self))
        for key, default in (("rungs", ()), ("seeds_min", 0), ("half_width", 0.0), ("unsearched_one", False)):
            if out[key] == default:
                del out[key]
            elif key == "rungs":
                out[key] = [list(r) for r in self.rungs]
        return out

    @property
    def final_iterations(self) -> int:
        return self.final_count * self.final_runs * self.iterations

    @property
    def per_final(self) -> int:
        """The most iterations one final seed trains: its runs together."""
        return self.final_runs * self.iterations

    @property
    def total_iterations(self) -> int:
        return self.tuning_iterations + self.final_iterations

    @property
    def samples_seen(self) -> int:
        """An upper bound: dataset-level miners may serve smaller batches than P x K."""
        return self.total_iterations * self.batch_size


@dataclass(frozen=True)
class Estimate:
    """A wall-clock range in seconds; ``measured`` is False when a trunk's cost was scaled, not timed."""

    low_s: float
    high_s: float
    measured: bool

    @property
    def mid_s(self) -> float:
        return (self.low_s + self.high_s) / 2


@dataclass(frozen=True)
class Plan:
    """What a protocol will run: the cells, those dropped, the budget each cell gets and the time it
    should take (``estimates`` per cell id)."""

    protocol: Protocol
    cells: tuple[Cell, ...]
    dropped: tuple[Dropped, ...]
    budget: Budget
    estimates: dict[str, Estimate] = field(default_factory=dict)  # per cell id
    cost: TrunkCost | None = None  # the trunk cost the estimates used
    check_multiple: float = 0  # a budget check at this multiple is in the estimates (0: none)
    method_s: dict[str, float] = field(default_factory=dict)  # timed loss + miner seconds a step, per cell id
    cost_note: str = ""  # why the trunk was not timed here when that was asked for (e.g. no CUDA device)
    sweep_s: float = 0.0  # once a sweep, outside every cell: start-up, data, stores, the floor (in `estimate`)
    precision_note: str = ""  # `auto`'s choice here, or a fixed precision several times slower than another
    loader_note: str = ""  # with a loader rate given: whether the loader or the trunk bounds a step
    # under early stopping: (iterations, estimate) when every run stops there; `estimate` is the maximum
    stopped: tuple[int, Estimate] | None = None
    # final.seeds as a range: the estimate when every cell stops at the range's minimum (`estimate` is the maximum)
    at_min: Estimate | None = None

    @property
    def total_iterations(self) -> int:
        return sum(self.budget.for_cell(c).total_iterations for c in self.cells)

    @property
    def estimate(self) -> Estimate:
        values = list(self.estimates.values())
        return Estimate(
            self.sweep_s + sum(e.low_s for e in values),
            self.sweep_s + sum(e.high_s for e in values),
            all(e.measured for e in values),
        )

    def cell(self, cell_id: str) -> Cell:
        """The planned cell of this id, or of this reported row (`trained_cell`); KeyError for a dropped or
        unknown one."""
        cell_id = trained_cell(cell_id)
        for c in self.cells:
            if c.id == cell_id:
                return c
        raise KeyError(cell_id)

    def reported_ids(self, cell_id: str) -> list[str]:
        """The rows a cell has in the results tables: the cell itself, or under final.mode folds
        ``<cell>:concatenated`` and ``<cell>:separate`` (`EVALUATIONS`)."""
        if self.budget.final_mode != "folds":
            return [cell_id]
        return [f"{cell_id}:{e}" for e in EVALUATIONS]


# final.mode folds: each final seed is reported twice, its fold models concatenated and each scored alone (their
# mean), the Reality Check's "concatenated" and "separate" (docs/PROTOCOL.md)
EVALUATIONS = ("concatenated", "separate")


def trained_cell(row_cell: str) -> str:
    """The cell (of the plan, the trials, the records) a results row reports: ``<cell>:concatenated`` and
    ``<cell>:separate`` are two evaluations of one trained cell; any other id is the cell itself (a cell's
    own id never holds a colon: labels cannot)."""
    for e in EVALUATIONS:
        if row_cell.endswith(":" + e):
            return row_cell[: -len(e) - 1]
    return row_cell
