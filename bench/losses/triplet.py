"""The triplet loss (Schroff et al. 2015; Hermans et al. 2017), hard or soft margin.

Per triplet ``[D(a,p) - D(a,n) + margin]_+``, or the soft form
``log(1 + exp(D(a,p) - D(a,n) + margin))`` (PML's ``smooth_loss``; with
``margin=0`` it is Hermans et al.'s soft margin). ``squared_euclidean``
gives FaceNet's ``D^2`` form.

Without an index tuple every valid triplet of the batch counts, but no
``B^3`` mask is ever built: the positive pairs ``(a, p)`` (``B*(K-1)`` of
them in a PK batch) are laid against all ``B`` candidates as one
``(pairs, B)`` matrix, ``O(B^2 K)`` memory.

Only differences ``D(a,p) - D(a,n)`` enter, so the loss (and every triplet
miner, through `triplet_matrix`) works on the distance object's ``shifted``
matrix: ``D`` itself for the Lp kinds, ``-cos`` for cosine (``D`` up to a
constant, and exactly PML's similarity margin).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bench.distances import Distance
from bench.errors import BenchError
from bench.losses.base import BenchLoss, check_bool, check_number, flat_gather
from bench.tuples import is_pairs, is_triplets, pairs_to_triplets, same_class


def triplet_matrix(x: torch.Tensor, distance: Distance, y: torch.Tensor | None = None) -> torch.Tensor:
    """``D`` up to a constant, what triplet formulas subtract (see the module docstring)."""
    return distance.shifted(x, y)


def anchor_positive_pairs(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every ordered positive pair, in (a, p) lexicographic order (PML's triplet order)."""
    anchors, positives = torch.where(same_class(labels))
    return anchors, positives


class TripletLoss(BenchLoss):
    """``[D(a,p) - D(a,n) + margin]_+`` (or its softplus) over triplets, PML-compatible defaults."""

    def __init__(
        self,
        margin: float = 0.05,
        distance: Any = "euclidean",
        normalize: bool = True,
        soft: bool = False,
        reduction: Any = "avg_nonzero",
    ) -> None:
        super().__init__(distance, normalize, reduction)
        self.margin = check_number("margin", margin)
        self.soft = check_bool("soft", soft)

    def extra_repr(self) -> str:
        """What ``repr(loss)`` shows: every setting that changes the value."""
        return f"margin={self.margin}, distance={self.distance!r}, soft={self.soft}, reduction={self.reducer!r}"

    def _per_tuple(self, violation: torch.Tensor) -> torch.Tensor:
        return F.softplus(violation) if self.soft else F.relu(violation)

    def compute(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        """Given triplets (pairs are turned into every triplet they form), densely when a miner left
        its (pairs, B) mask; every triplet of the batch when ``indices_tuple`` is None."""
        if indices_tuple is None:
            return self._all_triplets(embeddings, labels)
        if is_pairs(indices_tuple):
            indices_tuple = pairs_to_triplets(indices_tuple)
        if not is_triplets(indices_tuple):
            raise BenchError("triplet loss needs triplets (a, p, n) or pairs (a1, p, a2, n), got quadruplets")
        mask = getattr(indices_tuple, "mask", None)
        if mask is not None and mask.device == embeddings.device and mask.shape[1:] == (len(embeddings),):
            anchors, positives = indices_tuple.pairs
            return self._dense(embeddings, anchors, positives, mask)
        a, p, n = (t.to(embeddings.device) for t in indices_tuple)
        if len(a) == 0:
            return self.nothing(embeddings)
        mat = triplet_matrix(embeddings, self.distance)
        losses = self._per_tuple(flat_gather(mat, a, p) - flat_gather(mat, a, n) + self.margin)
        self.record(losses)
        return self.reducer(losses, embeddings)

    def _all_triplets(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        a, p = anchor_positive_pairs(labels)
        return self._dense(embeddings, a, p, labels[a][:, None] != labels[None, :])

    def _dense(
        self, embeddings: torch.Tensor, a: torch.Tensor, p: torch.Tensor, negative: torch.Tensor
    ) -> torch.Tensor:
        """Triplets ``(a[i], p[i], n)`` for each ``negative[i, n]``, as one (pairs, B) matrix.

        No B^3 mask, no per-triplet gather or scatter, no compaction: the
        masked sum divided by the count equals each reduction of PML.
        """
        mat = triplet_matrix(embeddings, self.distance)
        violation = flat_gather(mat, a, p)[:, None] - mat.index_select(0, a) + self.margin
        # a product with the mask, not torch.where: same values and gradient for finite losses, 4x
        # cheaper on a (pairs, B) matrix forward and backward; counts with count_nonzero, not a bool sum
        # (which first copies the mask to int64)
        losses = self._per_tuple(violation) * negative.to(violation.dtype)
        with torch.no_grad():
            count = int(torch.count_nonzero(negative))
            num_positive = int(torch.count_nonzero(losses > 0))
        self.stats["num_tuples"] = float(count)
        self.stats["fraction_positive"] = num_positive / count if count else 0.0
        return self.reducer.divide(losses.sum(), count, num_positive, embeddings)
