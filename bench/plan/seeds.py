"""Final seeds that stop when the answer is precise enough (``final.seeds: {min, max, half_width}``).

Seeds 0, 1, 2, ... are trained in that order, the same in every cell
(common random numbers). After each, the cell's 95% Student t interval of
the primary metric over its seeds so far is computed; the cell stops at the
first n >= ``min`` where the half-width t_{n-1, 0.975} s / sqrt(n) is at most
``half_width``, or at ``max``. The rule looks at the cell's own precision,
never at a difference between cells, so it needs no alpha correction; its
coverage stays near nominal (tests/test_seed_rule.py simulates it). A failed
seed counts against ``max`` and gives no value.

Which seeds run is a function of the recorded values alone (`seeds_wanted`),
so a resumed sweep, several workers and the audit all reach the same count.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

LEVEL = 0.95


@functools.lru_cache(maxsize=256)
def _t(df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + LEVEL / 2, df))


def half_width(values: Sequence[float | None]) -> float:
    """The 95% t interval's half-width over the values, t_{n-1, 0.975} s / sqrt(n), the interval the tables
    report (`bench.stats.t_interval`); None and NaN (a failed seed) left out; inf below two values."""
    clean = [v for v in values if v is not None and not math.isnan(v)]
    n = len(clean)
    if n < 2:
        return math.inf
    mean = sum(clean) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in clean) / (n - 1))
    return _t(n - 1) * s / math.sqrt(n)


def stops_at(values: Sequence[float | None], lo: int, hi: int, precision: float) -> int | None:
    """The number of seeds at which the rule stops over these seeds (in seed order), or None: not yet."""
    for n in range(lo, len(values) + 1):
        if n >= hi or half_width(values[:n]) <= precision:
            return n
    return None


def seeds_wanted(values: Sequence[float | None], lo: int, hi: int, precision: float) -> int:
    """How many seeds the cell needs given the first ``len(values)`` finished seeds' values: where the rule
    stops, or one more than recorded (``lo`` before that many are recorded)."""
    if len(values) < lo:
        return lo
    stop = stops_at(values, lo, hi, precision)
    return stop if stop is not None else min(len(values) + 1, hi)
