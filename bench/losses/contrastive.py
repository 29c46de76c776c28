"""Contrastive loss (Hadsell, Chopra, LeCun, CVPR 2006) in three forms.

``D`` is the chosen distance between the (optionally L2-normalised)
embeddings of a pair; ``squared_euclidean`` is PML's ``LpDistance(power=2)``,
so ``distance`` carries the power and no separate ``power`` parameter exists.

* ``form="pml"`` (default) - PML's ``ContrastiveLoss``: positive pairs
  ``[D - pos_margin]_+``, negative pairs ``[neg_margin - D]_+``. Positive
  and negative terms are reduced *separately* and the two results added, as
  PML's ``MultipleReducers`` does (default reduction ``avg_nonzero``).
* ``form="hadsell"`` - the paper: ``w * [D - pos_margin]_+^2`` for positive
  pairs and ``(1 - w) * [neg_margin - D]_+^2`` for negative pairs (the paper
  has ``pos_margin = 0`` and ``w = 1/2``); all pair terms reduced together
  (default ``mean``: the paper's average over pairs).
* ``form="hadsell_squared"`` - the widespread variant on squared distances
  (Caffe's ``legacy_version``): ``w * [D^2 - pos_margin]_+`` and
  ``(1 - w) * [neg_margin - D^2]_+``, reduced together.

For ``distance="cosine"`` (``D = 1 - cos``) PML's ``CosineSimilarity`` is
matched by PML margins ``1 - pos_margin`` and ``1 - neg_margin``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bench.losses.base import BenchLoss, as_pairs, check_choice, check_number

FORMS = ("pml", "hadsell", "hadsell_squared")
_DEFAULT_REDUCTION = {"pml": "avg_nonzero", "hadsell": "mean", "hadsell_squared": "mean"}


class ContrastiveLoss(BenchLoss):
    """Pulls positive pairs within ``pos_margin`` and pushes negative pairs beyond ``neg_margin``.

    ``reduction=None`` picks the form's own default (see the module docstring).
    """

    def __init__(
        self,
        pos_margin: float = 0.0,
        neg_margin: float = 1.0,
        distance: Any = "euclidean",
        normalize: bool = True,
        reduction: Any = None,
        form: str = "pml",
        pos_weight: float = 0.5,
    ) -> None:
        form = check_choice("form", form, FORMS)
        super().__init__(distance, normalize, _DEFAULT_REDUCTION[form] if reduction is None else reduction)
        self.form = form
        self.pos_margin = check_number("pos_margin", pos_margin)
        self.neg_margin = check_number("neg_margin", neg_margin)
        self.pos_weight = check_number("pos_weight", pos_weight, low=0.0, high=1.0)

    def compute(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        """Positive and negative pair terms over the given pairs (every pair without a miner); form 'pml'
        reduces each side apart and adds them, as PML does; the other forms reduce all pairs together."""
        a1, p, a2, n = as_pairs(indices_tuple, labels)
        dist = self.distance.matrix(embeddings)
        pos, neg = self.pair_terms(dist[a1, p], dist[a2, n])
        self.record(torch.cat([pos, neg]))
        self.stats["num_pos_pairs"], self.stats["num_neg_pairs"] = float(len(pos)), float(len(neg))
        if self.form == "pml":
            return self.reducer(pos, embeddings) + self.reducer(neg, embeddings)
        return self.reducer(torch.cat([pos, neg]), embeddings)

    def pair_terms(self, d_pos: torch.Tensor, d_neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-pair losses of the positive and of the negative pairs, before any reduction."""
        if self.form == "pml":
            return F.relu(d_pos - self.pos_margin), F.relu(self.neg_margin - d_neg)
        w = self.pos_weight
        if self.form == "hadsell":
            return w * F.relu(d_pos - self.pos_margin) ** 2, (1 - w) * F.relu(self.neg_margin - d_neg) ** 2
        return w * F.relu(d_pos**2 - self.pos_margin), (1 - w) * F.relu(self.neg_margin - d_neg**2)
