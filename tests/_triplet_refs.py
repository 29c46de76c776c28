"""Loop references and batches shared by the loss and miner tests (tests/losses/, tests/miners/)."""

from __future__ import annotations

import torch

from bench import distances
from bench.losses.triplet import triplet_matrix


def distance_matrix(x: torch.Tensor, distance: str = "euclidean") -> torch.Tensor:
    """What the triplet loss and miners compare: D up to a constant (-cos for cosine)."""
    return triplet_matrix(x, distances.resolve(distance))


def _pk(p: int, k: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(p * k, dim, generator=g, dtype=torch.float64), torch.arange(p).repeat_interleave(k)


def _as_set(triplets) -> set[tuple[int, int, int]]:
    return set(zip(*(t.tolist() for t in triplets)))
