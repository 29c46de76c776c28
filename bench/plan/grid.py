"""A protocol's grid expanded into cells, the pairs dropped and why, and the budget.

A cell is one loss with one miner (or none). Pairs that make no sense are
dropped by what the registry says each method consumes and produces
(`bench.registry.incompatibility`); a miner's scope (`Entry.dataset_level`)
and the loss parameters its tuples supply (`Entry.supplies`, removed from
the cell's search space) come from its entry too, never from a hand-kept
list of names, so a new method is planned correctly from its registry entry
alone. Every cell gets the same budget by construction; `Budget` is also
what the results audit compares the recorded runs against.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from bench import registry
from bench.cell import method_params
from bench.errors import BenchError
from bench.plan.cost import (
    bounded_by_loader,
    dataset_size,
    estimate_cell,
    measured_cost,
    sized_test,
    sweep_overhead_s,
    trunk_cost,
)
from bench.plan.rungs import rung_schedule
from bench.plan.types import Budget, Cell, Dropped, Estimate, Plan
from bench.protocol import NO_MINER, Protocol
from bench.protocol.hashing import canonical_json
from bench.spec import FinalSpec, MethodSpec, ModelSpec

NOT_SELECTED = "not selected by the protocol (the loss's `miners` list)"


def plan(
    protocol: Protocol,
    step_s: float | None = None,
    check_multiple: float = 0,
    time_methods: bool = False,
    measure: bool = False,
    threads: int | None = None,
    loader_rate: float | None = None,
    stop_at: int | None = None,
    data_root: str | None = None,
) -> Plan:
    """Cells (loss x miner) in grid order, dropped pairs with their reasons, one budget for all.

    ``step_s`` is a training step time measured on one's own device (it replaces the cost table);
    ``check_multiple`` adds a budget check at that multiple to the time estimate; ``time_methods``
    times each cell's loss and miner (`bench.plan.method_cost`) and adds them to its steps; ``measure``
    times the protocol's trunk here (`bench.plan.measure`, a few seconds, on ``threads`` CPU threads) in
    place of the cost table, unless ``step_s`` is given or the protocol's device is not on this machine
    (then the table stays and ``Plan.cost_note`` says why). ``loader_rate``, images a second the data
    loader delivers, makes each step at least a batch's loading time (`bounded_by_loader`); without it,
    ``measure`` times the protocol's training loader here where its images are files (`measure_loader`,
    under ``data_root``), and a loader that cannot be timed is said in ``Plan.loader_note``. Under
    ``training.early_stopping`` the estimates are the maximum (every run trains the whole budget) and
    ``Plan.stopped`` the time when every run stops at ``stop_at`` iterations (default: the earliest a run
    can stop, ``check_every`` x (``patience`` + 1))."""
    spec = protocol.spec
    grid = spec.grid
    cells: list[Cell] = []
    dropped: list[Dropped] = []
    for loss_item in grid.losses:
        loss_entry = registry.get("loss", loss_item.name)
        allowed = loss_item.miners
        for miner_item in grid.miners:
            cell_id = f"{loss_item.label}+{miner_item.label}"
            miner_entry = None if miner_item.name == NO_MINER else registry.get("miner", miner_item.name)
            reason = registry.incompatibility(loss_entry, miner_entry)
            if reason:
                dropped.append(Dropped(cell_id, reason))
                continue
            if allowed is not None and miner_item.label not in allowed:
                dropped.append(Dropped(cell_id, NOT_SELECTED))
                continue
            cell = _cell(cell_id, loss_entry, loss_item, miner_entry, miner_item, spec.model)
            cells.append(replace(cell, digest=cell_digest(protocol, cell)))
    if not cells:  # a sweep of nothing would end "0 cells done", exit 0, with empty tables
        first = dropped[0]
        raise BenchError(
            f"{protocol.name}: the grid has no cell: every loss x miner pair was dropped "
            f"({len(dropped)}; first {first.cell}: {first.reason})"
        )
    training, validation = spec.training, spec.data.validation
    budget = Budget(
        trials=spec.tuning.trials,
        folds=validation.use,
        iterations=training.iterations,
        batch_size=training.batch_size,
        seeds=len(spec.final.seeds),
        early_stopping=training.early_stopping is not None,
        final_runs=validation.use if spec.final.mode == "folds" else 1,
        draws=spec.tuning.repeats,
        unsearched_one=spec.tuning.unsearched == "one",
        rungs=rung_schedule(spec.tuning),
        **seed_range(spec.final),
    )
    cost, cost_note, precision_note = trunk_cost(protocol, step_s), "", ""
    if measure and step_s is None:
        from bench.plan.measure import EMBED_BATCH, measure_trunk, unavailable  # torch: only when measuring

        why = unavailable(protocol)
        if why:
            cost_note = f"not measured here: the protocol trains on {why}"
        else:
            _, test_images = dataset_size(sized_test(spec.data.test), spec.data.test_classes)
            batch = min(EMBED_BATCH, int(test_images)) if test_images else EMBED_BATCH  # what the test embeds in
            timed, precision_note = _precision_here(protocol, threads)
            cost = measured_cost(protocol, measure_trunk(timed, threads=threads, embed_batch=batch))
    loader_source, not_timed = "", ""
    if measure and loader_rate is None:
        from bench.plan.measure import measure_loader

        loader_rate, loader_source = measure_loader(protocol, data_root)
        if loader_rate is None:
            not_timed = loader_source
    cost, loader_note = bounded_by_loader(protocol, cost, loader_rate, loader_source)
    loader_note = loader_note or not_timed
    method_s: dict[str, float] = {}
    if time_methods:
        from bench.plan.method_cost import time_cells  # imports torch: only when timing is asked for

        method_s = time_cells(protocol, tuple(cells))
    estimates = {
        c.id: estimate_cell(protocol, c, budget.for_cell(c), cost, check_multiple, method_s.get(c.id, 0.0))
        for c in cells
    }
    stopped = None
    stopping = training.early_stopping
    if stopping:
        at = min(stop_at or stopping.check_every * (stopping.patience + 1), budget.iterations)
        short = replace(budget, iterations=at)
        cut = [
            estimate_cell(protocol, c, short.for_cell(c), cost, check_multiple, method_s.get(c.id, 0.0)) for c in cells
        ]
        overhead = sweep_overhead_s(protocol, budget, cost)
        stopped = (
            at,
            Estimate(overhead + sum(e.low_s for e in cut), overhead + sum(e.high_s for e in cut), cost.measured),
        )
    at_min = None
    if budget.adaptive_seeds:
        least = replace(budget, seeds=budget.seeds_min, seeds_min=0)
        few = [estimate_cell(protocol, c, least, cost, check_multiple, method_s.get(c.id, 0.0)) for c in cells]
        overhead = sweep_overhead_s(protocol, budget, cost)
        at_min = Estimate(overhead + sum(e.low_s for e in few), overhead + sum(e.high_s for e in few), cost.measured)
    return Plan(
        protocol,
        tuple(cells),
        tuple(dropped),
        budget,
        estimates,
        cost,
        check_multiple,
        method_s,
        cost_note,
        sweep_overhead_s(protocol, budget, cost),
        precision_note,
        loader_note,
        stopped,
        at_min,
    )


def seed_range(final: FinalSpec) -> dict[str, Any]:
    """``final.seeds`` as a range: the budget's ``seeds_min`` and ``half_width`` (nothing for a fixed number)."""
    r = final.seed_range
    return {} if r is None else {"seeds_min": r.min, "half_width": r.half_width}


def _precision_here(protocol: Protocol, threads: int | None) -> tuple[Protocol, str]:
    """The protocol to time the trunk of, and a line on its precision here: for ``precision: auto`` what a
    sweep starting now would choose (`bench.plan.measure.choose_precision`), the protocol then in that
    precision; for a fixed one a warning when it is `SLOW_FACTOR` or more times slower than another."""
    from bench.plan.measure import choose_precision, slow_precision

    if protocol.precision_auto:
        choice = choose_precision(protocol, threads=threads)
        timed = ", ".join(f"{k} {v:.0f} ms" for k, v in choice.step_ms.items())
        return (
            protocol.with_precision(choice.precision, choice.channels_last),
            f"precision auto: a sweep starting here now would train in {choice.variant} ({timed} a step)",
        )
    return protocol, slow_precision(protocol, threads=threads) or ""


def cell_digest(protocol: Protocol, cell: Cell) -> str:
    """sha256 of what a cell's training depends on, and nothing else: the protocol's shared settings
    (`Protocol.shared_hash`: every section but the grid), the cell's id (its labels seed its sampler), its
    loss and miner, their fixed parameters and merged search space as the cell runs them (registry defaults
    included), and the plugin code of its loss and miner. The grid's other cells, and the ``miners`` list
    that selects cells, are not in it: adding or removing a cell changes no other cell's digest."""
    plugins = {}
    for kind, name in (("loss", cell.loss), ("miner", cell.miner)):
        entry = registry.get(kind, name) if name else None
        if entry is not None and entry.plugin:
            plugins[f"{kind}:{name}"] = {"version": entry.version, "sha256": entry.source_hash}
    body = {
        "shared": protocol.shared_hash,
        "cell": {
            "id": cell.id,
            "loss": cell.loss,
            "miner": cell.miner,
            "loss_params": cell.loss_params,
            "miner_params": cell.miner_params,
            "search_space": cell.search_space,
            "dataset_level": cell.dataset_level,
        },
        **({"plugins": plugins} if plugins else {}),
    }
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def _cell(
    cell_id: str,
    loss_entry: registry.Entry,
    loss_item: MethodSpec,
    miner_entry: registry.Entry | None,
    miner_item: MethodSpec,
    model: ModelSpec,
) -> Cell:
    """One cell: fixed parameters, and the searched ones less those the miner's tuples supply (dead there)."""
    supplied = miner_entry.supplies if miner_entry is not None else ()
    space = {f"loss.{k}": v for k, v in loss_item.search_space.items() if k not in supplied}
    miner_params: dict[str, Any] = {}
    dataset_level = False
    if miner_entry is not None:
        space.update({f"miner.{k}": v for k, v in miner_item.search_space.items()})
        miner_params = method_params(miner_entry, miner_item.params, model.normalize, model.distance)
        dataset_level = miner_entry.dataset_level(miner_params)
    return Cell(
        cell_id,
        loss_entry.name,
        miner_entry.name if miner_entry else None,
        method_params(loss_entry, loss_item.params, model.normalize, model.distance),
        miner_params,
        space,
        dataset_level,
    )
