"""Quadruplet loss (Chen et al., Beyond triplet loss, CVPR 2017).

For a quadruplet ``(i, j, l, k)`` with ``y_i = y_j``, ``y_l != y_k`` and
``l``, ``k`` both of classes other than ``y_i``::

    [G(i,j) - G(i,k) + alpha1]_+  +  [G(i,j) - G(l,k) + alpha2]_+

the "strong" push (a triplet term) and the "weak" push, which asks a
positive pair to be closer than a negative pair sharing no sample with it;
``alpha1 > alpha2``.

What ``G`` is (the paper writes ``g^2``): the pairwise value returned by
`QuadrupletLoss.distance_matrix`:

* ``distance="squared_euclidean"`` (default): ``||a - b||^2``, the paper's
  Euclidean form (``g`` the Euclidean distance, ``G = g^2``);
* ``distance="euclidean"``: ``||a - b||`` (not squared);
* ``distance="cosine"``: ``1 - cos(a, b)``;
* ``learned_metric=True``: ``G = g^2`` with Chen et al.'s learned ``g`` in
  ``[0, 1]`` (`bench.losses.learned_metric`), squared as the paper's
  eqs. 2-4 write every term (and as both public re-implementations do);
  ``distance`` is then unused. ``pair_input`` says what the network sees of
  a pair: ``concat`` (default, the paper's ``[a; b]``) or
  ``difference_product`` (``[|a-b|; a*b]``, Koch et al.'s pair features: a
  documented departure that trains where ``concat`` does not, see
  docs/METHODS.md, *Learned metric*). The default stays the paper's so that
  a cell says ``pair_input: difference_product`` when it departs.
  A learned-metric cell is ranked by ``g`` at test time
  (`bench.evaluation`), through `QuadrupletLoss.pair_scorer`.

Embeddings are L2-normalised first when ``normalize`` (also before the
learned metric).

Tuples and reduction. A tuple is a quadruplet and its loss is the sum of
both terms (the formula above, read per quadruplet). Without an index tuple
the loss uses *every* valid quadruplet of the batch, so ``loss(e, y)``
equals ``loss(e, y, all_quadruplets(y))``; a triplet ``(i, j, k)`` thus
counts its strong term once for each valid ``l`` (``B - n_{y_i} - n_{y_k}``
of them: a constant ``B - 2K`` in a P x K batch). ``reduction``: ``mean``
over quadruplets, ``avg_nonzero`` over the quadruplets whose loss is
positive, ``sum``. With a `bench.tuples.Quadruplets` tuple only those are
used; its optional ``alpha1`` / ``alpha2`` (a number, a 0-d or a per-tuple
tensor, e.g. MargOHNM's adaptive margins) replace the loss's own margins.

Cost without a tuple (never the B^4 quadruplets): the strong term lives on
the (positive pairs) x B grid; the weak sum over ``l`` for each (positive
pair, ``k``) comes from the columns of the distance matrix sorted once, with
cumulative sums (``sum_{d < x} (x - d) = m x - prefix_m``), minus the
``l`` of class ``y_i``, summed directly. Memory O(B^2 + Q * K_max * B) with
``Q`` the positive pairs and ``K_max`` the largest class in the batch:
O(B^2 K^2) for a P x K batch (K = 4, B = 128: 0.2 M values); time adds a
B^2 log B sort.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bench.errors import BenchError
from bench.losses.base import (
    BenchLoss,
    check_bool,
    check_indices_tuple,
    check_inputs,
    check_number,
    flat_gather,
    take_rows,
)
from bench.losses.learned_metric import PAIR_INPUTS, LearnedMetric, PairScorer
from bench.tuples import Quadruplets, ViolatingQuadruplets

Margin = torch.Tensor | float


class QuadrupletLoss(BenchLoss):
    """Chen et al.'s strong + weak push, on a chosen distance or a learned metric."""

    sums_violating = True  # takes `ViolatingQuadruplets`: MargOHNM's selection, summed in closed form

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass with its own ``forward`` or ``compute`` may read indices: it gets listed quadruplets
        unless it says ``sums_violating = True`` itself."""
        super().__init_subclass__(**kwargs)
        if "sums_violating" not in cls.__dict__ and ({"forward", "compute"} & set(cls.__dict__)):
            cls.sums_violating = False

    def __init__(
        self,
        alpha1: float = 1.0,
        alpha2: float = 0.5,
        distance: Any = "squared_euclidean",
        learned_metric: bool = False,
        metric_hidden: int = 10,
        metric_layers: int = 3,
        pair_input: str = "concat",
        normalize: bool = True,
        reduction: Any = "mean",
    ) -> None:
        super().__init__(distance, normalize, reduction)
        self.alpha1 = check_number("alpha1", alpha1)
        self.alpha2 = check_number("alpha2", alpha2)
        if not self.alpha1 > self.alpha2:
            raise BenchError(f"alpha1 must be greater than alpha2, got alpha1={alpha1!r}, alpha2={alpha2!r}")
        self.metric: LearnedMetric | None = None
        if check_bool("learned_metric", learned_metric):
            hidden = int(check_number("metric_hidden", metric_hidden, low=1))
            layers = int(check_number("metric_layers", metric_layers, low=1))
            if hidden != metric_hidden or layers != metric_layers:
                raise BenchError(
                    f"metric_hidden and metric_layers must be integers, got {metric_hidden!r}, {metric_layers!r}"
                )
            if pair_input not in PAIR_INPUTS:
                raise BenchError(f"pair_input must be one of {', '.join(PAIR_INPUTS)}, got {pair_input!r}")
            self.metric = LearnedMetric(hidden, layers, pair_input)
        elif pair_input != "concat":
            raise BenchError(f"pair_input={pair_input!r} needs learned_metric: true (it is the learned metric's input)")

    def materialize(self, embedding_size: int) -> None:
        """Create the learned metric's weights for embeddings of this width now (no-op without one), so
        that the initial metric depends on the seed alone (the trainer calls it right after building)."""
        if self.metric is not None:
            self.metric.materialize(embedding_size)

    def pair_scorer(self) -> PairScorer | None:
        """What ranks test pairs by this loss's learned ``g`` (`bench.evaluation`); None without one."""
        return None if self.metric is None else PairScorer(self.metric, self.normalize)

    def distance_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(B, B) values ``G`` the loss's terms use (see the module docstring), differentiable: ``g^2`` for
        the learned metric."""
        if self.metric is None:
            return self.distance.matrix(embeddings)
        g = self.metric.matrix(F.normalize(embeddings, p=2, dim=1) if self.normalize else embeddings)
        return g * g

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any = None) -> torch.Tensor:
        """Only Quadruplets (or None, every quadruplet): triplets or pairs carry no second negative pair,
        so they are refused by name rather than misread."""
        if isinstance(indices_tuple, ViolatingQuadruplets):
            self.stats = {}
            check_inputs(embeddings, labels)
            if indices_tuple.batch_size != len(embeddings):
                raise BenchError(
                    f"ViolatingQuadruplets of a batch of {indices_tuple.batch_size}, got {len(embeddings)} embeddings"
                )
            return self.compute(embeddings, labels.to(embeddings.device), indices_tuple)
        if not isinstance(indices_tuple, Quadruplets):
            if indices_tuple is not None:
                given = (
                    {3: "triplets", 4: "pairs"}.get(len(indices_tuple), "a tuple")
                    if isinstance(indices_tuple, (tuple, list))
                    else type(indices_tuple).__name__
                )
                raise BenchError(f"quadruplet loss needs Quadruplets(i, j, l, k) from a quadruplet miner, got {given}")
            return super().forward(embeddings, labels, None)
        self.stats = {}
        check_inputs(embeddings, labels)
        check_quadruplets(indices_tuple, len(embeddings))
        return self.compute(embeddings, labels.to(embeddings.device), indices_tuple)

    def compute(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        """Given Quadruplets with their own margins (MargOHNM's); every quadruplet of the batch through
        cumulative sums when ``indices_tuple`` is None; ViolatingQuadruplets the same way at the miner's
        margins, counting the violating ones only (the others add 0 to the sum)."""
        dist = self.distance_matrix(embeddings)
        if indices_tuple is None or isinstance(indices_tuple, ViolatingQuadruplets):
            v = indices_tuple
            margins = (self.alpha1, self.alpha2) if v is None else (v.alpha1, v.alpha2)
            total, num, num_pos = all_quadruplet_totals(dist, labels, *margins)
            if v is not None and num_pos == 0:  # as the listed path given no tuple: no gradient to the metric
                return self.nothing(embeddings)
            num = num if v is None else num_pos
            self.stats["num_tuples"] = float(num)
            self.stats["fraction_positive"] = float(num_pos) / num if num else 0.0
            return self.reducer.divide(total, num, num_pos, embeddings)
        q = indices_tuple
        alpha1, alpha2 = (
            own if given is None else torch.as_tensor(given, dtype=dist.dtype, device=dist.device)
            for own, given in ((self.alpha1, q.alpha1), (self.alpha2, q.alpha2))
        )
        losses = quadruplet_terms(dist, q, alpha1, alpha2)
        self.record(losses)
        return self.reducer(losses, embeddings)


def check_quadruplets(q: Quadruplets, batch_size: int) -> tuple[Margin | None, Margin | None]:
    """Index fields inside the batch and of one length; margins finite, scalar or one per tuple."""
    check_indices_tuple(tuple(q[:4]), batch_size)  # a plain 4-tuple: integer vectors inside the batch
    lengths = [len(t) for t in q[:4]]
    if len(set(lengths)) != 1:
        raise BenchError(f"Quadruplets has index tensors of mismatched lengths {lengths}")
    for name in ("alpha1", "alpha2"):
        m = getattr(q, name)
        if m is None:
            continue
        if isinstance(m, (int, float)) and not isinstance(m, bool):
            check_number(f"Quadruplets.{name}", m)
            continue
        if not torch.is_tensor(m) or not m.is_floating_point() or m.shape not in ((), (lengths[0],)):
            shape = tuple(m.shape) if torch.is_tensor(m) else type(m).__name__
            raise BenchError(
                f"Quadruplets.{name} must be a number or a float tensor of shape () or ({lengths[0]},), got {shape}"
            )
        if not bool(torch.isfinite(m).all()):
            raise BenchError(f"Quadruplets.{name} must be finite")
    return q.alpha1, q.alpha2


def quadruplet_terms(dist: torch.Tensor, q: Quadruplets, alpha1: Margin, alpha2: Margin) -> torch.Tensor:
    """Per-quadruplet loss: strong term plus weak term, on a (B, B) matrix of ``G`` values."""
    positive = flat_gather(dist, q.i, q.j)  # not dist[q.i, q.j]: see flat_gather (reproducible backward)
    strong = torch.relu(positive - flat_gather(dist, q.i, q.k) + alpha1)
    weak = torch.relu(positive - flat_gather(dist, q.l, q.k) + alpha2)
    return strong + weak


def all_quadruplets(labels: torch.Tensor) -> Quadruplets:
    """Every valid quadruplet, lexicographic in (i, j, l, k); O(#quadruplets) memory, for references."""
    y = labels
    eye = torch.eye(len(y), dtype=torch.bool, device=y.device)
    same = y[:, None] == y[None, :]
    valid = (
        (same & ~eye)[:, :, None, None]  # y_i = y_j, i != j
        & ~same[:, None, :, None]  # y_l != y_i
        & ~same[:, None, None, :]  # y_k != y_i
        & ~same[None, None, :, :]
    )  # y_l != y_k
    i, j, l, k = torch.where(valid)  # noqa: E741
    return Quadruplets(i, j, l, k)


def class_members(same: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, ok)``, (B, K_max): the samples of each row's class (itself included), padded."""
    order = torch.sort((~same).to(torch.uint8), dim=1, stable=True).indices
    k_max = int(same.sum(1).max())
    idx = order[:, :k_max]
    return idx, same.gather(1, idx)


def all_quadruplet_totals(
    dist: torch.Tensor, labels: torch.Tensor, alpha1: float, alpha2: float
) -> tuple[torch.Tensor, int, int]:
    """Sum of the losses of every valid quadruplet, their number, and how many are positive.

    See the module docstring for the method and its cost. The sum stays
    differentiable with respect to ``dist``.
    """
    n = len(labels)
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(n, dtype=torch.bool, device=labels.device)
    a, p = torch.where(same & ~eye)  # positive pairs (i, j)
    if len(a) == 0:
        return dist.sum() * 0, 0, 0
    valid_k = ~same[a]  # (Q, B): k of another class than i
    class_size = same.sum(1)
    n_l = (n - class_size[a][:, None] - class_size[None, :]).clamp(min=0)  # valid l per (i, k)
    n_l = torch.where(valid_k, n_l, 0)
    num = int(n_l.sum())
    if num == 0:
        return dist.sum() * 0, 0, 0

    pos = flat_gather(dist, a, p)  # (Q,)
    strong = torch.relu(pos[:, None] - take_rows(dist, a) + alpha1)  # (Q, B)

    # weak term, first over every l of a class other than y_k: columns of dist sorted once
    x = pos + alpha2  # [x - G(l, k)]_+ > 0  <=>  G(l, k) < x
    by_k = torch.sort(dist.T.masked_fill(same, float("inf")), dim=1).values  # row k: G(., k), y_l != y_k
    prefix = torch.cat([by_k.new_zeros(n, 1), torch.cumsum(by_k.masked_fill(torch.isinf(by_k), 0), 1)], 1)
    below = torch.searchsorted(by_k, x.detach().expand(n, -1).contiguous())  # (B, Q): #G(l, k) < x
    weak_all = (below * x[None, :] - prefix.gather(1, below)).T  # (Q, B)
    count_all = below.T

    # ... then without the l of class y_i (those are not valid)
    idx, ok = class_members(same)
    g_own = take_rows(dist, idx[a])  # (Q, K_max, B): G(l, k) for l in class y_i
    hinge_own = torch.where(ok[a][:, :, None], torch.relu(x[:, None, None] - g_own), 0)
    weak = weak_all - hinge_own.sum(1)
    weak_pos = count_all - ((hinge_own > 0).sum(1))

    total = torch.where(valid_k, n_l * strong + weak, 0).sum()
    num_pos = int(torch.where(valid_k, torch.where(strong > 0, n_l, weak_pos), 0).sum())
    return total, num, num_pos
