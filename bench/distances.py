"""Pairwise distance matrices shared by every loss and miner.

Losses and miners work on *distances* (smaller = closer). Cosine is turned
into the distance ``1 - cos``, so that every margin formula reads the same
way for all three kinds: ``D(a,p) - D(a,n) + m`` equals PML's
``s(a,n) - s(a,p) + m`` for a similarity.

Euclidean distances go through ``torch.cdist``: it is the kernel PML uses, so
rounding in degenerate batches (duplicate embeddings) matches theirs, and its
backward pass gives a zero gradient at zero distance instead of NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DISTANCES = ("euclidean", "squared_euclidean", "cosine")


def check_distance(name: str) -> str:
    if name not in DISTANCES:
        from bench.errors import BenchError

        raise BenchError(f"unknown distance {name!r}: expected one of {', '.join(DISTANCES)}")
    return name


def pairwise(x: torch.Tensor, y: torch.Tensor | None = None, kind: str = "euclidean") -> torch.Tensor:
    """Distance matrix ``D[i, j] = d(x_i, y_j)`` of shape (len(x), len(y))."""
    y = x if y is None else y
    if kind == "euclidean":
        return torch.cdist(x, y)
    if kind == "squared_euclidean":
        return torch.cdist(x, y) ** 2
    if kind == "cosine":
        return 1.0 - F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).T
    check_distance(kind)
    raise AssertionError("unreachable")


def paired(x: torch.Tensor, y: torch.Tensor, kind: str = "euclidean") -> torch.Tensor:
    """Row-wise distances ``d(x_i, y_i)``, for tuples gathered from a batch."""
    if kind == "cosine":
        return 1.0 - (F.normalize(x, dim=-1) * F.normalize(y, dim=-1)).sum(-1)
    d = torch.linalg.vector_norm(x - y, dim=-1)
    return d**2 if kind == "squared_euclidean" else d
