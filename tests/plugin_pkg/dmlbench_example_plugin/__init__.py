"""An example plugin loss: the triplet margin loss over every valid triplet, written without PML.

It declares PML's ``TripletMarginLoss`` as its reference, so ``dmlbench
crosscheck`` compares both (same default margin, Euclidean distance on
normalised embeddings, mean over the triplets that violate the margin).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from bench.registry import register
from bench.tuples import all_triplets, pairs_to_triplets


@register(
    "loss",
    "plugin_triplet",
    tuples="triplets",
    reference="pml:TripletMarginLoss",
    search_space={"margin": {"type": "float", "low": 0.01, "high": 0.5, "log": True}},
)
class PluginTripletLoss(torch.nn.Module):
    """Triplet margin loss, mean over the violating triplets (an example plugin)."""

    def __init__(self, margin: float = 0.05) -> None:
        super().__init__()
        if not margin >= 0:
            raise ValueError(f"margin must be >= 0, got {margin!r}")
        self.margin = float(margin)

    def forward(
        self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: tuple[torch.Tensor, ...] | None = None
    ) -> torch.Tensor:
        if indices_tuple is None:
            a, p, n = all_triplets(labels)
        elif len(indices_tuple) == 4:
            a, p, n = pairs_to_triplets(tuple(indices_tuple))
        else:
            a, p, n = indices_tuple
        x = F.normalize(embeddings, dim=1)
        d = torch.cdist(x, x)
        violation = torch.relu(d[a, p] - d[a, n] + self.margin)
        positive = violation > 0
        if not bool(positive.any()):
            return embeddings.sum() * 0.0  # keeps the graph: zero gradient, not none
        return violation[positive].mean()
