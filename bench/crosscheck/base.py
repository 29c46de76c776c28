"""What every cross-check returns, and how two results are compared: one norm-wise relative difference."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TOLERANCE", "CheckResult", "rel_diff"]

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
