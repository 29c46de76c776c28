"""Supervised InfoNCE / NT-Xent (Oord et al. 2018; Chen et al., SimCLR 2020) in O(B^2) memory.

For each positive pair ``(a, p)`` against the negative pairs ``(a, n)`` of
its anchor, with ``s = S / temperature`` and ``S`` the distance object's
similarity (``cos`` for cosine, ``-D`` for the Lp kinds)::

    loss_ap = -log( exp(s_ap) / (exp(s_ap) + sum_n exp(s_an)) )

reduced over the positive pairs (default ``mean``). With the default cosine
distance this is PML's ``NTXentLoss(temperature)`` over ``CosineSimilarity``;
with a Euclidean distance it is PML's NT-Xent over ``LpDistance`` (which
negates distances the same way). A positive pair whose anchor has no negative pair
costs zero, and a batch without positive or without negative pairs gives
zero, as in PML.

PML builds a positive x negative matrix (seconds and gigabytes at B=512);
here each anchor's negatives are summed once, a masked log-sum-exp over the
B x B similarity matrix ``r_a = log sum_n exp(s_an)``, and each positive
pair costs ``softplus(r_a - s_ap)``, the same loss written so that it stays
accurate when it is tiny (no ``log(x) - log(y)`` cancellation). A negative
pair given twice in a tuple counts twice, as in PML.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bench.losses.base import (
    BenchLoss,
    check_number,
    masked_row_logsumexp,
    positives_and_negatives,
)


class InfoNCELoss(BenchLoss):
    """Softmax of each positive pair against its anchor's negatives, at a temperature."""

    def __init__(
        self, temperature: float = 0.07, distance: Any = "cosine", normalize: bool = True, reduction: Any = "mean"
    ) -> None:
        super().__init__(distance, normalize, reduction)
        self.temperature = check_number("temperature", temperature, low=0.0, strict=True)

    def compute(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        """Per positive pair, its logit against the log-sum-exp of the anchor's negatives, all B^2 logits
        computed once."""
        a1, p, negatives = positives_and_negatives(indices_tuple, labels, embeddings)
        if len(a1) == 0 or not negatives.any():
            return self.nothing(embeddings)
        logits = self.distance.similarity(embeddings) / self.temperature
        per_anchor, _ = masked_row_logsumexp(logits, negatives)
        positive = logits[a1, p]
        losses = F.softplus(per_anchor[a1] - positive, threshold=50.0)
        self.record(losses)
        return self.reducer(losses, embeddings)
