"""Successive halving's rung schedule (tuning.strategy) and final seeds as a range: planning and validation."""

from __future__ import annotations

import pytest
from _shared import RUNNER_TINY

from bench.errors import BenchError
from bench.plan import plan
from bench.plan.rungs import rung_of, rung_start, rungs
from bench.protocol import parse_protocol

STRATEGY = "tuning: {trials: 4, strategy: {type: successive_halving, min_iterations: 4, eta: 2}}"
RANGE = "final: {seeds: {min: 2, max: 4, half_width: 0.01}}"


def _text(strategy: str | None = STRATEGY, seeds: str | None = RANGE, iterations: int = 12) -> str:
    text = RUNNER_TINY.replace("ITERATIONS", str(iterations))
    if strategy is not None:
        text = text.replace("tuning: {trials: 2}", strategy)
    if seeds is not None:
        text = text.replace("final: {seeds: [0, 1]}", seeds)
    return text


def test_rungs_grow_by_eta_up_to_the_top_rung() -> None:
    assert rungs(27, 112, 3, 1000) == ((27, 112), (9, 336), (3, 1000))
    assert rungs(9, 100, 3, 300) == ((9, 100), (3, 300))
    assert rungs(4, 4, 2, 12) == ((4, 4), (2, 8), (1, 12))
    assert rungs(2, 1, 3, 27) == ((2, 1), (1, 3), (1, 9), (1, 27))  # at least one configuration a rung
    assert rungs(5, 50, 3, 50) == ((5, 50),)  # min at the top: every trial at full fidelity
    schedule = rungs(4, 4, 2, 12)
    assert [rung_of(schedule, s) for s in range(7)] == [0, 0, 0, 0, 1, 1, 2]
    assert [rung_start(schedule, r) for r in range(3)] == [0, 4, 6]
    with pytest.raises(IndexError):
        rung_of(schedule, 7)


def test_the_plan_counts_every_rung_the_same_in_every_cell() -> None:
    b = plan(parse_protocol(_text(seeds=None))).budget
    assert b.rungs == ((4, 4), (2, 8), (1, 12))
    assert b.slots == 7 and b.trial_count == 7 and b.tuning_runs == 7
    assert b.tuning_iterations == 4 * 4 + 2 * 8 + 12  # 44, against 4 full trials' 48
    assert [b.slot_iterations(s) for s in range(7)] == [4, 4, 4, 4, 8, 8, 12]
    assert b.total_iterations == 44 + 2 * 12
    from bench.commands.plan import format_plan

    text = format_plan(plan(parse_protocol(_text(seeds=None))))
    assert "budget, the same for every cell: (4 x 4 + 2 x 8 + 1 x 12) x 1 fold(s) + 2 seeds x 12 iterations" in text
    assert "synchronous successive halving (eta 2)" in text and "44 tuning iterations in every cell" in text


def test_a_seed_range_plans_its_minimum_and_maximum() -> None:
    p = plan(parse_protocol(_text(strategy=None)))
    b = p.budget
    assert (b.seeds, b.seeds_min, b.half_width, b.adaptive_seeds) == (4, 2, 0.01, True)
    assert p.protocol.final_seeds == [0, 1, 2, 3]
    assert b.min_total_iterations == 2 * 12 + 2 * 12 and b.total_iterations == 2 * 12 + 4 * 12
    assert p.at_min is not None and p.at_min.mid_s < p.estimate.mid_s
    from bench.commands.plan import format_plan

    text = format_plan(p)
    assert "+ 2 to 4 seeds x 12 iterations = 48 to 72 iterations (a seed range: its minimum to its maximum)" in text
    assert "at least 2 and at most 4, stopping once the 95% interval of map_at_r has a half-width of at most 0.01" in (
        text
    )
    assert "seed range: the estimate above is the maximum, every cell to 4 seeds; if every cell stops at 2:" in text
    assert b.record()["seeds_min"] == 2 and "rungs" not in b.record()


def test_without_the_new_keys_the_hash_and_the_budget_record_are_todays() -> None:
    plain = parse_protocol(_text(strategy=None, seeds=None))
    assert parse_protocol(_text(strategy="tuning: {trials: 2, strategy: null}", seeds=None)).hash == plain.hash
    assert parse_protocol(_text(seeds=None)).hash != plain.hash
    b = plan(plain).budget
    assert set(b.record()) == {
        "trials", "folds", "iterations", "batch_size", "seeds", "early_stopping", "final_runs", "draws"
    }  # fmt: skip


@pytest.mark.parametrize(
    "strategy, seeds, where",
    [
        (
            "tuning: {trials: 4, pruner: {type: median}, strategy: {type: successive_halving, min_iterations: 4}}",
            None,
            "tuning.pruner",
        ),
        ("tuning: {trials: 4, strategy: {type: successive_halving, min_iterations: 12}}", None, "min_iterations"),
        (
            "tuning: {trials: 4, strategy: {type: successive_halving, min_iterations: 4, max_iterations: 13}}",
            None,
            "max_iterations",
        ),
        ("tuning: {trials: 4, strategy: {type: hyperband, min_iterations: 4}}", None, "type"),
        ("tuning: {trials: 4, strategy: {type: successive_halving, min_iterations: 4, eta: 1}}", None, "eta"),
        (None, "final: {seeds: {min: 5, max: 4, half_width: 0.01}}", "final.seeds.min"),
        (None, "final: {seeds: {min: 1, max: 4, half_width: 0.01}}", "final.seeds"),
        (None, "final: {seeds: {min: 2, max: 4, half_width: 0}}", "final.seeds"),
        (None, "final: {seeds: {min: 2, max: 4}}", "final.seeds"),
    ],
)
def test_bad_strategies_and_ranges_are_refused_in_one_message(strategy, seeds, where) -> None:
    with pytest.raises(BenchError) as e:
        parse_protocol(_text(strategy=strategy, seeds=seeds))
    assert where in str(e.value)


def test_early_stopping_must_check_within_the_first_rung() -> None:
    stop = "early_stopping: {check_every: 6, patience: 2, max_iterations: 12, metric: map_at_r}"
    text = _text(seeds=None).replace("iterations: 12}", f"iterations: 12, {stop}}}")
    with pytest.raises(BenchError, match="check_every=6"):
        parse_protocol(text)
    ok = parse_protocol(text.replace("min_iterations: 4", "min_iterations: 6"))
    assert plan(ok).budget.rungs == ((4, 6), (2, 12))
