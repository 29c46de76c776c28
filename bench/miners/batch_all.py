"""Batch-all mining (Hermans et al. 2017): every valid triplet of the batch.

The triplets themselves need no distances; ``margin`` (set it to the loss's)
serves Hermans et al.'s statistic, ``stats['fraction_positive']``: the share
of triplets with a positive loss ``D(a,p) - D(a,n) + margin > 0``, which
tells how much of the batch still trains.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.miners._common import BenchMiner, check_number, select_triplets, triplet_margins


class BatchAllMiner(BenchMiner):
    """Equals PML ``TripletMarginMiner(margin=inf, type_of_triplets='all')`` (every valid triplet)."""

    def __init__(self, margin: float = 0.05, distance: Any = "euclidean", normalize: bool = True) -> None:
        super().__init__(distance, normalize)
        self.margin = check_number("margin", margin)

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every valid triplet; ``stats`` counts how many still violate ``margin`` (Hermans et al.'s
        fraction of active triplets)."""
        a, p, tm, negative, _ = triplet_margins(embeddings, labels, self.distance)
        count = int(torch.count_nonzero(negative))
        # loss > 0  <=>  D(a,p) - D(a,n) + margin > 0, written as the loss computes it
        positive = int(torch.count_nonzero(negative & (self.margin - tm > 0)))
        self.stats["num_tuples"] = float(count)
        self.stats["fraction_positive"] = positive / count if count else 0.0
        return select_triplets(a, p, negative)
