"""Multi-class N-pair loss (Sohn, NeurIPS 2016), with the paper's L2 penalty on embeddings.

From the positive pairs of the batch (or of the index tuple) one pair is
kept per class: the first one in row-major order, i.e. with no tuple the
class's first sample as anchor and its second as positive. This is exactly
how PML's ``NPairsLoss`` picks (``np.unique(..., return_index=True)`` over
``labels[anchors]``), so values agree on every batch. For the N kept pairs::

    loss_i = log(1 + sum_{j != i} exp(s(f_i, f_j^+) - s(f_i, f_i^+)))

the cross-entropy of the N x N similarity matrix divided by ``temperature``
with the diagonal as targets, reduced over the N anchors (default
``mean``). ``s`` is the similarity of the distance object (`bench.distances`):
the dot product (``distance="dot"``, the paper's), ``cos`` or ``-D``; with
``normalize=True`` (PML's default) the dot product is the cosine similarity.

``temperature`` (default 1: the paper and PML) matters once embeddings are
normalised: with cosine logits in [-1, 1] a 16-class batch cannot go below
a loss of about 1.82 (chance: 2.77), so the loss keeps pushing every pair
however well it is ranked; a lower temperature sharpens the softmax and
changes which pairs the gradient weighs.

``l2_reg`` adds ``l2_reg * mean_i (||f_i||^2 + ||f_i^+||^2)`` over the kept
pairs, on the embeddings as given (before normalisation): Sohn's penalty,
which keeps unnormalised embeddings from growing to sharpen the softmax.
PML's ``LpRegularizer(power=2)`` averages over the whole batch instead, so
the two agree (with ``embedding_reg_weight = 2 * l2_reg``) when the batch
is exactly the N pairs, e.g. P classes x K=2.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bench.distances import SIMILARITIES
from bench.losses.base import BenchLoss, as_pairs, check_number


def one_pair_per_class(a: torch.Tensor, p: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first positive pair of each anchor class, classes in increasing label order."""
    if len(a) == 0:
        return a, p
    classes, inverse = torch.unique(labels[a], return_inverse=True)
    order = torch.arange(len(a), device=a.device)
    first = torch.full((len(classes),), len(a), dtype=order.dtype, device=a.device)
    first = first.scatter_reduce(0, inverse, order, reduce="amin")
    return a[first], p[first]


class NPairLoss(BenchLoss):
    """One positive per class against the positives of every other class, plus an L2 penalty."""

    def __init__(
        self,
        l2_reg: float = 0.0,
        distance: Any = "dot",
        normalize: bool = True,
        reduction: Any = "mean",
        temperature: float = 1.0,
    ) -> None:
        super().__init__(distance, normalize, reduction, allowed=SIMILARITIES)
        self.l2_reg = check_number("l2_reg", l2_reg, low=0.0)
        self.temperature = check_number("temperature", temperature, low=0.0, strict=True)

    def compute(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        """Cross-entropy of each class's one anchor against every class's positive, plus ``l2_reg``
        times the pairs' mean squared norms (anchor's plus positive's: Sohn's penalty)."""
        a1, p, _, _ = as_pairs(indices_tuple, labels)
        a, pos = one_pair_per_class(a1, p, labels)
        self.stats["num_pairs"] = float(len(a))
        if len(a) == 0:
            return self.nothing(embeddings)
        logits = self.distance.similarity(embeddings[a], embeddings[pos]) / self.temperature
        losses = F.cross_entropy(logits, torch.arange(len(a), device=a.device), reduction="none")
        self.record(losses)
        loss = self.reducer(losses, embeddings)
        if self.l2_reg:
            penalty = (embeddings[a].pow(2).sum(1) + embeddings[pos].pow(2).sum(1)).mean()
            self.stats["l2_penalty"] = float(penalty.detach())
            loss = loss + self.l2_reg * penalty
        return loss
