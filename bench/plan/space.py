"""A search space in one line: what a cell's trials tune, as `plan` and `list` print it.

A distribution is the protocol's (`bench.spec.schema`): ``{type: float | int,
low, high, log?, step?}`` or ``{type: categorical, choices}``; a cell's space
names ``loss.<param>`` and ``miner.<param>`` (`bench.plan.Cell.search_space`),
a registry entry's default space its bare parameter names.
"""

from __future__ import annotations

from typing import Any

__all__ = ["describe_distribution", "describe_space"]


def describe_distribution(dist: dict[str, Any]) -> str:
    """``float [0.01, 1] log``, ``int [1, 8] step 2``, ``{a, b}``: a distribution in a few characters."""
    if dist.get("type") == "categorical":
        return "{" + ", ".join(_value(c) for c in dist["choices"]) + "}"
    text = f"{dist.get('type', '?')} [{_value(dist['low'])}, {_value(dist['high'])}]"
    if dist.get("log"):
        text += " log"
    if dist.get("step") is not None:
        text += f" step {_value(dist['step'])}"
    return text


def describe_space(space: dict[str, dict[str, Any]]) -> str:
    """Every searched parameter of ``space`` with its distribution, ``; ``-separated ("nothing" if empty)."""
    if not space:
        return "nothing (fixed parameters only)"
    return "; ".join(f"{name} {describe_distribution(dist)}" for name, dist in space.items())


def _value(v: Any) -> str:
    if v is None:
        return "null"
    return f"{v:g}" if isinstance(v, float) else str(v)
