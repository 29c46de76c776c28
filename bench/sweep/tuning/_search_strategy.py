"""How a cell's search proceeds: the TPE sampler (seeded per slot) and the pruner the protocol names.

Not to be confused with bench/data/samplers.py, the P x K batch sampler: this
module is about Optuna's samplers, which propose parameter values.
"""

from __future__ import annotations

import warnings
from typing import Any

from bench.plan import Cell
from bench.protocol import Protocol
from bench.sweep.seeds import sampler_seed


def make_sampler(protocol: Protocol, cell: Cell, slot: int) -> Any:
    """TPE seeded by (protocol seed, cell, slot): the draw for a slot does not depend on how many times
    the sweep was interrupted before it."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=sampler_seed(protocol.seed, cell.id, slot),
            n_startup_trials=protocol.spec.tuning.startup_trials,
            constant_liar=True,
        )


def make_pruner(protocol: Protocol) -> Any:
    """The pruner of ``tuning.pruner``; trials report at step ``fold x iterations + iteration``."""
    import optuna

    p = protocol.spec.tuning.pruner
    if p.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.warmup_steps)
    if p.type == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_resource, reduction_factor=p.reduction_factor)
    return optuna.pruners.NopPruner()
