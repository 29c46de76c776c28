"""Batch-hard mining (Hermans et al. 2017): per anchor the farthest positive and the nearest negative.

One triplet per anchor that has both a positive and a negative; anchors
lacking either are skipped. Ties go to the lowest index, as ``torch.max`` /
``torch.min`` give them, which is what PML's ``BatchHardMiner`` returns too.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.losses.triplet import triplet_matrix
from bench.miners._common import BenchMiner
from bench.tuples import diff_class, same_class


class BatchHardMiner(BenchMiner):
    """Equals PML ``BatchHardMiner()`` with the same distance."""

    def __init__(self, distance: Any = "euclidean", normalize: bool = True) -> None:
        super().__init__(distance, normalize)

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One triplet per anchor that has both: its farthest positive and its nearest negative."""
        mat = triplet_matrix(embeddings, self.distance)
        pos, neg = same_class(labels), diff_class(labels)
        inf = torch.tensor(float("inf"), dtype=mat.dtype, device=mat.device)
        p_dist, p = torch.where(pos, mat, -inf).max(dim=1)
        n_dist, n = torch.where(neg, mat, inf).min(dim=1)
        keep = pos.any(dim=1) & neg.any(dim=1)
        a = torch.arange(len(labels), device=mat.device)[keep]
        if keep.any():
            self.stats["mean_hardest_positive"] = float(p_dist[keep].mean())
            self.stats["mean_hardest_negative"] = float(n_dist[keep].mean())
        return a, p[keep], n[keep]
