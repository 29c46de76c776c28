"""Synchronous successive halving over a cell's trial slots (`bench.plan.rungs`): which configuration a slot of
rung i >= 1 trains, once rung i - 1 is finished.

Slots are numbered rung by rung (rung 0's ``n_0`` first). A slot of rung
i >= 1 is claimed only when every slot of rung i - 1 holds a finished trial;
its configuration is the j-th best of rung i - 1 (by validation value, ties
to the lower slot; failed and pruned trials never promoted), j its place in
its rung. Where fewer configurations completed than rung i has slots, the
slots left over record a failure with nothing trained, so every cell still
records the same slots and budgets.
"""

from __future__ import annotations

import warnings
from typing import Any

from bench.plan.rungs import rung_of, rung_start
from bench.sweep.tuning._objective import Rung

Schedule = tuple[tuple[int, int], ...]


def rung_finished(schedule: Schedule, counted: dict[int, Any], rung: int) -> bool:
    """Whether every slot of ``rung`` holds a finished trial."""
    start = rung_start(schedule, rung)
    slots = range(start, start + schedule[rung][0])
    return all(s in counted and counted[s].state.is_finished() for s in slots)


def ready(schedule: Schedule, counted: dict[int, Any], slot: int) -> bool:
    """Whether slot ``slot`` may train now: rung 0 always, a later rung once the one before it is finished."""
    rung = rung_of(schedule, slot)
    return rung == 0 or rung_finished(schedule, counted, rung - 1)


def ranked(schedule: Schedule, counted: dict[int, Any], rung: int) -> list[Any]:
    """Rung ``rung``'s completed trials, best first (ties: the lower slot)."""
    start = rung_start(schedule, rung)
    trials = [counted[s] for s in range(start, start + schedule[rung][0]) if s in counted]
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    return sorted(complete, key=lambda t: (-t.value, t.user_attrs["slot"]))


def promoted(schedule: Schedule, counted: dict[int, Any], slot: int) -> Any:
    """The trial of rung i - 1 whose configuration slot ``slot`` (of rung i >= 1) trains, or None: fewer
    configurations completed than the rung has slots."""
    rung = rung_of(schedule, slot)
    place = slot - rung_start(schedule, rung)
    best = ranked(schedule, counted, rung - 1)[: schedule[rung][0]]
    return best[place] if place < len(best) else None


def rung_for(schedule: Schedule, slot: int, parent: Any) -> Rung:
    """The `Rung` a slot trains: its index, its iterations, and the rung-0 slot of its configuration."""
    rung = rung_of(schedule, slot)
    if parent is None:
        seed_slot = slot
    else:
        seed_slot = parent.user_attrs.get("seed_slot", parent.user_attrs["slot"])
    return Rung(rung, schedule[rung][1], seed_slot)


def top_slots(schedule: Schedule, counted: dict[int, Any]) -> dict[int, Any]:
    """The trials of the top rung: the cell's winner is the best of them."""
    start = rung_start(schedule, len(schedule) - 1)
    return {s: t for s, t in counted.items() if s >= start}


def fixed_sampler(params: dict[str, Any]) -> Any:
    """A sampler that gives a promoted slot its configuration's values (Optuna's PartialFixedSampler)."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.PartialFixedSampler(params, optuna.samplers.RandomSampler(0))
