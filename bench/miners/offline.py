"""Offline mining (FaceNet's offline variant): mine the training split, not the batch.

Every ``refresh_every`` steps the training split (or a random subset of
``subset_size`` samples, FaceNet's way of keeping it affordable) is embedded
without gradients, and one triplet per positive pair is chosen globally:
``strategy="hard"`` the nearest negative, ``"semihard"`` the nearest
semi-hard negative (falling back to the nearest), exactly as
`SemiHardMiner(semantics="nearest")` does within a batch. Triplets that have
no loss at mining time are dropped (unless none has, so that training can go
on). Each step then serves ``triplets_per_batch`` triplets drawn from that
pool; the samples they touch form the batch.

Anchors are processed in chunks against the whole set, so memory stays at
``chunk_size x N`` distances, never ``N x N``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bench.losses.triplet import triplet_matrix
from bench.miners._common import BenchError, BenchMiner, check_choice, check_int, check_number
from bench.miners.semihard import nearest_negatives
from bench.tuples import Quadruplets

STRATEGIES = ("hard", "semihard")


class OfflineMiner(BenchMiner):
    """Dataset-level miner: global hard / semi-hard triplets, refreshed every ``refresh_every`` steps."""

    dataset_level = True

    def __init__(
        self,
        margin: float = 0.2,
        strategy: str = "semihard",
        refresh_every: int = 100,
        subset_size: int | None = None,
        triplets_per_batch: int = 64,
        distance: Any = "euclidean",
        normalize: bool = True,
        chunk_size: int = 256,
    ) -> None:
        super().__init__(distance, normalize)
        self.margin = check_number("margin", margin)
        self.strategy = check_choice("strategy", strategy, STRATEGIES)
        self.refresh_every = check_int("refresh_every", refresh_every)
        self.subset_size = check_int("subset_size", subset_size, allow_none=True)
        self.triplets_per_batch = check_int("triplets_per_batch", triplets_per_batch)
        self.chunk_size = check_int("chunk_size", chunk_size)
        self._pool: tuple[torch.Tensor, ...] | None = None
        self._refreshed_at = 0

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Global mining over all given embeddings, anchors in chunks."""
        found = []
        for start in range(0, len(labels), self.chunk_size):
            rows = torch.arange(start, min(start + self.chunk_size, len(labels)), device=embeddings.device)
            mat = triplet_matrix(embeddings[rows], self.distance, embeddings)
            a, p, n = nearest_negatives(mat, rows, labels[rows], labels, self.margin, self.strategy)
            d_ap = mat[a - start, p]
            d_an = mat[a - start, n]
            found.append((a, p, n, d_ap - d_an + self.margin > 0))
        a, p, n, violating = (torch.cat(parts) for parts in zip(*found))
        self.stats["num_candidates"] = float(len(a))
        self.stats["fraction_positive"] = float(violating.float().mean()) if len(a) else 0.0
        if violating.any():
            a, p, n = a[violating], p[violating], n[violating]
        return a, p, n

    def batch(
        self, step: int, embed: Callable[[torch.Tensor], torch.Tensor], labels: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Sample indices of the training split and the triplets among them (positions in those indices)."""
        if self._pool is None or step - self._refreshed_at >= self.refresh_every:
            self._refresh(step, embed, labels, generator)
        assert self._pool is not None
        pool_a, pool_p, pool_n = self._pool
        if len(pool_a) == 0:
            raise BenchError("offline mining found no triplet: every class needs two samples and a negative")
        chosen = torch.randperm(len(pool_a), generator=generator)[: self.triplets_per_batch].to(pool_a.device)
        flat = torch.stack([pool_a[chosen], pool_p[chosen], pool_n[chosen]])
        sample_indices, positions = torch.unique(flat, return_inverse=True)
        return sample_indices, (positions[0], positions[1], positions[2])

    def _refresh(
        self, step: int, embed: Callable[[torch.Tensor], torch.Tensor], labels: torch.Tensor, generator: torch.Generator
    ) -> None:
        total = len(labels)
        if self.subset_size is None or self.subset_size >= total:
            indices = torch.arange(total)
        else:
            indices = torch.randperm(total, generator=generator)[: self.subset_size].sort().values
        with torch.no_grad():
            embeddings = embed(indices)
        found = self(embeddings, labels[indices.to(labels.device)].to(embeddings.device))
        assert isinstance(found, tuple) and not isinstance(found, Quadruplets)  # its own mine() gives triplets
        a, p, n = found
        indices = indices.to(a.device)
        self._pool = (indices[a], indices[p], indices[n])
        self._refreshed_at = step
        self.stats["pool_size"] = float(len(a))
