"""Tuning a cell: the trial objective, trial slots in a shared Optuna study, the search strategy.

Two rules of the fair protocol are enforced here, in code:

* Every cell gets the same number of trials (`SlotStudy`, in ``_slots``).
* A trial is a function of (protocol seed, slot, fold) and its parameters, the
  same for every cell (common random numbers: `bench.sweep.seeds`), so a
  resumed sweep reproduces an uninterrupted one and cells are paired.

Test classes never reach a trial: the data a trial reads are
`bench.sweep.prepare`'s, checked by its `TestClassGuard` on every fold.

The rooms: ``_objective`` (suggest, split_params, train_and_score, run_trial;
the scoring is bench.evaluation's), ``_slots`` (SlotStudy, Heartbeat, owner
records, storage), ``_search_strategy`` (Optuna's TPE sampler and pruner),
``_halving`` (synchronous successive halving's rungs over the slots). Import
from ``bench.sweep.tuning``; the private modules may move.
"""

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
    "RunResult",
    "Rung",
    "Slot",
    "SlotStudy",
    "TrialOutcome",
    "best_trial",
    "extra_seed_study",
    "final_config",
    "final_fold_config",
    "final_iterations",
    "fixed_sampler",
    "held",
    "make_pruner",
    "make_sampler",
    "open_storage",
    "promoted",
    "ready",
    "rung_for",
    "run_trial",
    "study_name",
    "top_slots",
    "train_and_score",
    "trial_attrs",
]
