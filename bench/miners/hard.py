"""Hard-negative mining: every triplet whose negative is no farther than its positive.

PML's ``TripletMarginMiner(type_of_triplets='hard')``, inequality and all:
``D(a,n) - D(a,p) <= 0`` and ``<= margin`` (the margin only bites when it is
negative).
"""

from __future__ import annotations

import torch

from bench.miners._common import BenchMiner, check_distance_params, check_number, select_triplets, triplet_margins


class HardMiner(BenchMiner):
    """Equals PML ``TripletMarginMiner(margin, type_of_triplets='hard')`` with the same distance."""

    def __init__(self, margin: float = 0.2, distance: str = "euclidean", normalize: bool = True) -> None:
        super().__init__()
        self.margin = check_number("margin", margin)
        self.distance, self.normalize = check_distance_params(distance, normalize)

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, p, tm, negative, _ = triplet_margins(embeddings, labels, self.distance, self.normalize)
        keep = negative & (tm <= self.margin) & (tm <= 0)
        self.stats["num_candidates"] = float(torch.count_nonzero(negative))
        return select_triplets(a, p, keep)
