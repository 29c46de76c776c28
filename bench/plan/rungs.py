"""The rung schedule of multi-fidelity tuning (``tuning.strategy: successive_halving``), the same for every cell.

Synchronous successive halving (Jamieson and Talwalkar 2016): rung 0 trains
``n_0 = tuning.trials`` configurations for ``r = min_iterations`` iterations
each; rung i + 1 trains the best ``n_{i+1} = max(1, n_i // eta)`` of rung i
(by validation score, ties to the lower slot) for ``eta`` times as long, up
to the top rung's ``max_iterations`` (default ``training.iterations``):

    b_i = r * eta^i for i < S,   b_S = max_iterations,   S = min{i : r * eta^i >= max_iterations}

A rung starts only when the one before it is finished, so which
configurations are promoted never depends on the order trials finished in
or on how many workers ran them, and the tuning of every cell trains
exactly ``folds x sum_i n_i b_i`` iterations. (Optuna's
SuccessiveHalvingPruner is asynchronous: a trial is promoted or pruned when
it reaches a rung, against the trials that reached it before, so the number
pruned and the iterations spent depend on arrival order, and two cells would
spend different budgets.) A promoted configuration is trained again from its
start for ``b_{i+1}`` iterations, with the same seed and the learning-rate
schedule of the whole training budget, so its first ``b_i`` iterations repeat
rung i's run exactly: the result is that of resuming it, the cost is counted
as trained (``b_{i+1}``, not ``b_{i+1} - b_i``).
"""

from __future__ import annotations

from bench.spec import TuningSpec


def rung_schedule(tuning: TuningSpec) -> tuple[tuple[int, int], ...]:
    """((configurations, iterations) per rung) of a protocol's tuning, or () without ``tuning.strategy``."""
    s = tuning.strategy
    return () if s is None else rungs(tuning.trials, s.min_iterations, s.eta, s.max_iterations)


def rungs(trials: int, min_iterations: int, eta: int, max_iterations: int) -> tuple[tuple[int, int], ...]:
    """The rungs as (configurations, iterations each), rung 0 first; see the module docstring."""
    if min_iterations >= max_iterations:
        return ((trials, max_iterations),)
    out = []
    n, b = trials, min_iterations
    while b < max_iterations:
        out.append((n, b))
        n, b = max(1, n // eta), b * eta
    out.append((n, max_iterations))
    return tuple(out)


def rung_of(schedule: tuple[tuple[int, int], ...], slot: int) -> int:
    """The rung of a tuning slot: rung 0's slots are 0..n_0-1, rung 1's the next n_1, and so on."""
    start = 0
    for i, (n, _) in enumerate(schedule):
        if slot < start + n:
            return i
        start += n
    raise IndexError(f"slot {slot} is past the last rung ({start} slots)")


def rung_start(schedule: tuple[tuple[int, int], ...], rung: int) -> int:
    """The first slot of a rung."""
    return sum(n for n, _ in schedule[:rung])
