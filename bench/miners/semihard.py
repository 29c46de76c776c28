"""Semi-hard mining (Schroff et al. 2015): negatives farther than the positive but within the margin.

A negative is semi-hard for ``(a, p)`` when ``0 < D(a,n) - D(a,p) <= margin``
(PML's exact inequality). Two readings of "semi-hard mining" circulate and
give different training signals, so both are offered:

* ``semantics="all"`` - every semi-hard triplet (PML
  ``TripletMarginMiner(type_of_triplets='semihard')``);
* ``semantics="nearest"`` - per positive pair ``(a, p)`` one triplet, with
  the nearest semi-hard negative, falling back to the hardest (nearest)
  negative when none is semi-hard (FaceNet's online selection). TF-Addons
  differs in the fallback: it takes the farthest negative nearer than the
  positive.

"nearest" sorts each anchor's negatives once and binary-searches ``D(a,p)``:
``O(B^2 log B)`` time, ``O(B^2 K)`` memory. `nearest_negatives` also serves
the dataset-level `OfflineMiner`, on chunks of anchors against the dataset.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.losses.triplet import triplet_matrix
from bench.miners._common import BenchMiner, check_choice, check_number, select_triplets, triplet_margins

SEMANTICS = ("all", "nearest")


def nearest_negatives(
    mat: torch.Tensor,
    row_index: torch.Tensor,
    row_labels: torch.Tensor,
    labels: torch.Tensor,
    margin: float,
    strategy: str,
) -> tuple[torch.Tensor, ...]:
    """One triplet per positive pair whose anchor is a row of ``mat``.

    ``mat`` is (C, N): distances from the anchors ``row_index`` (labels
    ``row_labels``) to all N samples. ``strategy`` "hard" takes the nearest
    negative; "semihard" the nearest with ``0 < D(a,n) - D(a,p) <= margin``,
    else the nearest. Ties go to the lowest index. Anchors without a negative
    are skipped. Returns (a, p, n) as indices into the N samples.
    """
    cols = torch.arange(mat.shape[1], device=mat.device)
    same = row_labels[:, None] == labels[None, :]
    row, p = torch.where(same & (cols[None, :] != row_index[:, None]))
    inf = torch.tensor(float("inf"), dtype=mat.dtype, device=mat.device)
    sorted_d, order = torch.where(same, inf, mat).sort(dim=1, stable=True)
    has_negative = torch.isfinite(sorted_d[row, 0])
    row, p = row[has_negative], p[has_negative]
    n = order[row, 0]
    if strategy == "semihard" and len(row):
        d_ap = mat[row, p]
        rows_d = sorted_d[row]
        first_farther = torch.searchsorted(rows_d, d_ap[:, None], right=True).squeeze(1)
        at = first_farther.clamp(max=mat.shape[1] - 1)
        candidate = rows_d.gather(1, at[:, None]).squeeze(1)
        # rounding of x - d_ap is monotone in x, so if the first farther negative
        # exceeds the margin, every farther one does
        semi = (first_farther < mat.shape[1]) & (candidate - d_ap <= margin) & torch.isfinite(candidate)
        n = torch.where(semi, order[row].gather(1, at[:, None]).squeeze(1), n)
    return row_index[row], p, n


class SemiHardMiner(BenchMiner):
    """Semi-hard triplets; ``semantics`` picks PML's (all) or FaceNet's (nearest per pair)."""

    def __init__(
        self, margin: float = 0.2, semantics: str = "all", distance: Any = "euclidean", normalize: bool = True
    ) -> None:
        super().__init__(distance, normalize)
        self.margin = check_number("margin", margin)
        self.semantics = check_choice("semantics", semantics, SEMANTICS)

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``semantics='all'``: every negative within ``(D(a,p), D(a,p) + margin]``, as PML;
        ``'nearest'``: per positive pair, the nearest such negative, as FaceNet."""
        if self.semantics == "nearest":
            mat = triplet_matrix(embeddings, self.distance)
            rows = torch.arange(len(labels), device=mat.device)
            return nearest_negatives(mat, rows, labels, labels, self.margin, "semihard")
        a, p, tm, negative, _ = triplet_margins(embeddings, labels, self.distance)
        keep = negative & (tm <= self.margin) & (tm > 0)
        self.stats["num_candidates"] = float(torch.count_nonzero(negative))
        return select_triplets(a, p, keep)
