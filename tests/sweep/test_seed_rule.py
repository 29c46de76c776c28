"""Final seeds as a range (bench.plan.seeds): the precision-only stopping rule, and its coverage simulated."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from bench.plan.seeds import half_width, seeds_wanted, stops_at
from bench.stats import t_interval


def test_the_half_width_is_the_t_intervals() -> None:
    values = [0.40, 0.42, 0.43, 0.45]
    s = np.std(values, ddof=1)
    assert half_width(values) == pytest.approx(st.t.ppf(0.975, 3) * s / 2)
    assert half_width([0.4]) == math.inf and half_width([0.4, None, math.nan]) == math.inf  # failed seeds left out
    assert half_width([0.4, 0.4, 0.4]) == pytest.approx(0.0, abs=1e-12)
    iv = t_interval(values)
    assert half_width(values) == pytest.approx((iv.high - iv.low) / 2)  # the tables' own interval


def test_seeds_are_asked_for_one_at_a_time_until_precise_or_the_maximum() -> None:
    lo, hi, h = 3, 6, 0.01
    assert seeds_wanted([], lo, hi, h) == 3 and seeds_wanted([0.5, 0.6], lo, hi, h) == 3
    tight = [0.500, 0.501, 0.502]
    assert stops_at(tight, lo, hi, h) == 3 and seeds_wanted(tight, lo, hi, h) == 3  # precise at the minimum
    wide = [0.40, 0.50, 0.60]
    assert stops_at(wide, lo, hi, h) is None and seeds_wanted(wide, lo, hi, h) == 4
    assert seeds_wanted([*wide, 0.5, 0.5], lo, hi, h) == 6 and stops_at([*wide, 0.5, 0.5, 0.5], lo, hi, h) == 6
    # the first n at which the rule holds decides, whatever seeds were recorded after it
    assert stops_at([*tight, 0.9, 0.1], lo, hi, h) == 3
    # a failed seed counts against the maximum and gives no value
    assert seeds_wanted([0.5, None, 0.6], lo, hi, h) == 4
    assert stops_at([0.5, None, 0.6, 0.5, 0.6, 0.5], lo, hi, h) == 6  # a failed seed still counts against max


def _simulate(sweeps: int, lo: int, hi: int, h: float, sigma: float, seed: int) -> tuple[float, float, float]:
    """(coverage of the true mean by the stopped interval, mean seeds, share stopped by precision) over sweeps
    whose seeds are normal noise around a true mean, each stopped by the rule itself (`stops_at`)."""
    rng = np.random.default_rng(seed)
    mu = 0.45
    covered, used, precise = 0, 0, 0
    for _ in range(sweeps):
        values = list(rng.normal(mu, sigma, hi))
        n = stops_at(values, lo, hi, h)
        assert n is not None
        kept = values[:n]
        w = half_width(kept)
        covered += abs(np.mean(kept) - mu) <= w
        used += n
        precise += w <= h
    return covered / sweeps, used / sweeps, precise / sweeps


# (min, h / sigma) -> the lowest coverage the design may show (2,000 sweeps: a Monte Carlo error of ~0.005)
DESIGNS = {(3, 0.6): 0.895, (3, 1.0): 0.91, (3, 2.0): 0.925, (5, 0.6): 0.905, (5, 1.0): 0.93}


@pytest.mark.parametrize("lo, h_over_sigma", sorted(DESIGNS))
def test_stopping_on_precision_keeps_the_coverage_near_nominal(lo: int, h_over_sigma: float) -> None:
    """2,000 simulated cells a design: seeds N(0.45, 0.01^2), at most 10, stopping at a half-width of h.

    What the simulation shows: the rule looks at s alone, and a cell stops when its s happens to be small,
    so the reported 95% interval is a little too narrow. Measured (these seeds): min 3: 0.907 at h = 0.6 sigma
    (39% of cells stop by precision), 0.922 at 1 sigma, 0.937 at 2 sigma (every cell stops at 3.7 seeds on
    average); min 5: 0.918 at 0.6 sigma, 0.941 at 1 sigma. The dip is largest where about half the cells stop
    early, smaller with a larger minimum (s is then less biased by the stop).
    No rule of this family (an upper bound on s, a stricter level for stopping, a confirming seed, Stein's
    two-stage count) lifts the standard interval's worst case above ~0.925 at min 3."""
    sigma = 0.01
    coverage, mean_seeds, precise = _simulate(
        2000, lo, 10, h_over_sigma * sigma, sigma, seed=lo * 100 + int(h_over_sigma * 10)
    )
    assert DESIGNS[(lo, h_over_sigma)] <= coverage <= 0.965, coverage
    assert lo <= mean_seeds <= 10
    if h_over_sigma >= 1.0:
        assert precise > 0.8 and mean_seeds < 10  # the range saves seeds where the answer is precise early
