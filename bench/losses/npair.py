"""Multi-class N-pair loss (Sohn, NeurIPS 2016), with the paper's L2 penalty on embeddings.

From the positive pairs of the batch (or of the index tuple) one pair is
kept per class: the first one in row-major order, i.e. with no tuple the
class's first sample as anchor and its second as positive. This is exactly
how PML's ``NPairsLoss`` picks (``np.unique(..., return_index=True)`` over
``labels[anchors]``), so values agree on every batch. For the N kept pairs::

    loss_i = log(1 + sum_{j != i} exp(s(f_i, f_j^+) - s(f_i, f_i^+)))

the cross-entropy of the N x N similarity matrix with the diagonal as
targets, reduced over the N anchors (default ``mean``). ``s`` is the dot
product (``distance="dot"``, the paper's), or ``-D`` for a distance of
bench.distances; with ``normalize=True`` (PML's default) the dot product is
the cosine similarity.

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

from bench.distances import DISTANCES, pairwise
from bench.losses._common import (
    BenchLoss,
    REDUCTIONS,
    as_pairs,
    check_bool,
    check_choice,
    check_number,
    maybe_normalize,
    reduce,
    zero_loss,
)

SIMILARITIES = ("dot",) + DISTANCES


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
        distance: str = "dot",
        normalize: bool = True,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        self.l2_reg = check_number("l2_reg", l2_reg, low=0.0)
        self.distance = check_choice("distance", distance, SIMILARITIES)
        self.normalize = check_bool("normalize", normalize)
        self.reduction = check_choice("reduction", reduction, REDUCTIONS)

    def compute(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        a1, p, _, _ = as_pairs(indices_tuple, labels)
        a, pos = one_pair_per_class(a1, p, labels)
        self.stats["num_pairs"] = float(len(a))
        if len(a) == 0:
            self.record(embeddings.new_zeros(0))
            return zero_loss(embeddings)
        x = maybe_normalize(embeddings, self.normalize)
        if self.distance == "dot":
            logits = x[a] @ x[pos].T
        else:
            logits = -pairwise(x[a], x[pos], kind=self.distance)
        losses = F.cross_entropy(logits, torch.arange(len(a), device=a.device), reduction="none")
        self.record(losses)
        loss = reduce(losses, self.reduction, embeddings)
        if self.l2_reg:
            penalty = (embeddings[a].pow(2).sum(1) + embeddings[pos].pow(2).sum(1)).mean()
            self.stats["l2_penalty"] = float(penalty.detach())
            loss = loss + self.l2_reg * penalty
        return loss
