"""Tuned values at the edge of their search range.

When the best value of a parameter lies at one end of the range it was
searched in, the optimum may lie beyond it: the cell was compared with a
range that may have cut it short. The leaderboard warns instead of hiding
it. "At the edge" is within `EDGE` (5%) of the range's width from either
end, measured in log space for a log-scaled range (0.98 of [0.01, 1] is at
the top: 99.6% of the way in log space).

The ranges come from re-planning the protocol the results were run with
(`Results.plan`); without it nothing can be said, and the leaderboard says so.
"""

from __future__ import annotations

import math
from typing import Any

EDGE = 0.05


def position(value: float, space: dict[str, Any]) -> float:
    """Where `value` lies in a numeric range, 0 at `low` and 1 at `high` (log space for log ranges); NaN otherwise."""
    if space.get("type") not in ("float", "int"):
        return math.nan
    low, high = float(space["low"]), float(space["high"])
    v = float(value)
    if space.get("log") and low > 0 and v > 0:
        low, high, v = math.log(low), math.log(high), math.log(v)
    return (v - low) / (high - low) if high > low else math.nan


def warnings(params: dict[str, Any], space: dict[str, dict[str, Any]]) -> list[str]:
    """One line per tuned value within EDGE of an end of its range."""
    out = []
    for name, spec in space.items():
        if name not in params or not isinstance(params[name], (int, float)):
            continue
        where = position(params[name], spec)
        if not math.isfinite(where) or EDGE <= where <= 1 - EDGE:
            continue
        end = "low" if where < EDGE else "high"
        scale = ", log" if spec.get("log") else ""
        out.append(f"{name}={params[name]:.4g} at the {end} edge of [{spec['low']:g}, {spec['high']:g}{scale}]")
    return out
