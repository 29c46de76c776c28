"""Cross-check of own losses and miners against pytorch-metric-learning.

Each check pairs an own method with the PML settings that make both equal,
runs it over many random float64 cases, and reports the largest relative
difference of the values and of the gradients with respect to the
embeddings. `dmlbench crosscheck` prints the table and fails on any
difference above the tolerance. Plugin entries that declare a reference
(`bench.registry.register(..., reference=...)`) are checked against it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from bench.crosscheck.base import TOLERANCE, CheckResult, rel_diff

__all__ = ["TOLERANCE", "CheckResult", "all_checks", "rel_diff"]


def all_checks(cases: int = 50, seed: int = 0) -> Iterable[CheckResult]:
    from bench.crosscheck import losses, plugins, triplets

    providers: list[Callable[..., Iterable[CheckResult]]] = [losses.checks, triplets.checks, plugins.checks]
    for provider in providers:
        yield from provider(cases=cases, seed=seed)
