"""Cross-check of own losses and miners against pytorch-metric-learning.

Each check pairs an own method with the PML settings that make both equal,
runs it over many random float64 cases, and reports the largest relative
difference of the values and of the gradients with respect to the
embeddings. `dmlbench crosscheck` prints the table and fails on any
difference above the tolerance. Plugin entries that declare a reference
(`bench.registry.register(..., reference=...)`) are checked against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

TOLERANCE = 1e-9


@dataclass
class CheckResult:
    """One own method against its PML counterpart: the worst relative differences over ``cases``."""

    name: str  # e.g. "triplet + batch_hard"
    pml_settings: str  # the PML call that makes them equal
    cases: int
    max_rel_value: float
    max_rel_grad: float
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.max_rel_value <= TOLERANCE and self.max_rel_grad <= TOLERANCE


def rel_diff(a, b) -> float:
    """max|a - b| / max(max|a|, max|b|): the norm-wise relative error.

    Taken over the whole tensor rather than element by element, so that a
    gradient entry that is 1e-17 in one library and 0 in the other does not
    count as a 100% difference.
    """
    import torch

    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-300)
    return float((a - b).abs().max()) / scale


def all_checks(cases: int = 50, seed: int = 0) -> Iterable[CheckResult]:
    from bench.crosscheck import losses, plugins, triplets

    providers: list[Callable[..., Iterable[CheckResult]]] = [losses.checks, triplets.checks, plugins.checks]
    for provider in providers:
        yield from provider(cases=cases, seed=seed)
