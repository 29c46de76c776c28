"""Tuning a cell: its data, the trial objective, trial slots in a shared Optuna study, the search strategy.

Three rules of the fair protocol are enforced here, in code:

* Test classes are never seen while tuning (`TestClassGuard`, in ``_data``).
* Every cell gets the same number of trials (`SlotStudy`, in ``_slots``).
* A run is a function of (protocol seed, slot, fold) or (protocol seed,
  final seed), the same for every cell (``_seeds``: common random numbers),
  so a resumed sweep reproduces an uninterrupted one and cells are paired.

The rooms: ``_data`` (prepare, Prepared, TestClassGuard), ``_objective``
(suggest, split_params, train_and_score, run_trial; the scoring is
bench.evaluation's), ``_slots`` (SlotStudy, Heartbeat, owner records,
storage), ``_search_strategy`` (Optuna's TPE sampler and pruner),
``_seeds``, ``_halving`` (synchronous successive halving's rungs over the slots). Import from ``bench.sweep.tuning``; the private
modules may move.
"""

from bench.sweep.tuning._data import (
    Prepared,
    TestClassGuard,
    TestLeakError,
    load_sides,
    make_guard,
    prepare,
    select_sides,
    small_classes_notice,
)
from bench.sweep.tuning._halving import fixed_sampler, promoted, ready, rung_for, top_slots
from bench.sweep.tuning._objective import (
    Hooks,
    Rung,
    RunResult,
    TrialOutcome,
    final_config,
    final_fold_config,
    final_iterations,
    run_trial,
    train_and_score,
    trial_attrs,
)
from bench.sweep.tuning._search_strategy import make_pruner, make_sampler
from bench.sweep.tuning._seeds import derive_seed, final_seed, for_draw
from bench.sweep.tuning._slots import (
    ATTR_SURPLUS,
    Heartbeat,
    Slot,
    SlotStudy,
    best_trial,
    extra_seed_study,
    held,
    open_storage,
    study_name,
)

# what is used outside the package (TrialOutcome: run_trial's return type); the rest stays in its room
__all__ = [
    "ATTR_SURPLUS",
    "Heartbeat",
    "Hooks",
    "Prepared",
    "RunResult",
    "Rung",
    "Slot",
    "SlotStudy",
    "TestClassGuard",
    "TestLeakError",
    "TrialOutcome",
    "best_trial",
    "derive_seed",
    "extra_seed_study",
    "final_config",
    "final_fold_config",
    "final_iterations",
    "final_seed",
    "fixed_sampler",
    "for_draw",
    "held",
    "load_sides",
    "make_guard",
    "make_pruner",
    "make_sampler",
    "open_storage",
    "prepare",
    "promoted",
    "ready",
    "rung_for",
    "run_trial",
    "select_sides",
    "small_classes_notice",
    "study_name",
    "top_slots",
    "train_and_score",
    "trial_attrs",
]
