"""Hard-negative mining: every triplet whose negative is no farther than its positive.

PML's ``TripletMarginMiner(type_of_triplets='hard')`` selects
``D(a,n) - D(a,p) <= 0`` and ``<= margin``: for any margin >= 0 (the only
margins a search would try) the second condition adds nothing, so the
margin changes no triplet (checked for 0.01, 0.3 and 1.0). This miner has
no margin parameter and no search space: a tuned margin here would only
replicate one configuration. The triplet loss's own margin still acts on
the mined triplets.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.miners._common import BenchMiner, select_triplets, triplet_margins


class HardMiner(BenchMiner):
    """Equals PML ``TripletMarginMiner(margin >= 0, type_of_triplets='hard')`` with the same distance."""

    def __init__(self, distance: Any = "euclidean", normalize: bool = True) -> None:
        super().__init__(distance, normalize)

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The triplets whose negative is at most as far as the positive (``D(a,n) <= D(a,p)``)."""
        a, p, tm, negative, _ = triplet_margins(embeddings, labels, self.distance)
        keep = negative & (tm <= 0)
        self.stats["num_candidates"] = float(torch.count_nonzero(negative))
        return select_triplets(a, p, keep)
