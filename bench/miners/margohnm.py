"""Margin-based online hard negative mining (Chen et al., Beyond triplet loss, CVPR 2017, sec. 3.3).

The margins follow the batch: ``alpha1 = w1 * (mu_n - mu_p)`` and
``alpha2 = w2 * (mu_n - mu_p)`` (``w1 = 1``, ``w2 = 0.5`` in the paper),
``mu_p`` / ``mu_n`` the means of ``G`` over the batch's positive / negative
pairs (ordered pairs, no self-pairs), where ``G`` is the value the quadruplet
loss puts in its terms (`QuadrupletLoss.distance_matrix`: the paper's
``g^2``). The formula is kept as it is: when negatives are on average nearer
than positives the margins are negative (asking little) rather than clipped.
During the first ``warmup_iterations`` calls (and whenever a batch has no
positive or no negative pair) the fixed ``alpha1`` / ``alpha2`` are used: a
fresh learned metric gives ``g`` near 0.5 everywhere, hence margins near 0.

Only the quadruplets that violate the margins are returned, i.e. whose loss
``[G(i,j) - G(i,k) + alpha1]_+ + [G(i,j) - G(l,k) + alpha2]_+`` is
positive, and the margins travel with them (``Quadruplets.alpha1/alpha2``)
so the loss uses the same ones. A batch of P x K = 32 x 4 holds some 5.7 M
quadruplets, so at most ``max_tuples`` are returned: the hardest (largest
loss; ties in (i, j, l, k) order), which bounds the loss's cost.

Metric: after ``bind_loss(loss)`` with a loss that has ``distance_matrix``
(the quadruplet loss, learned metric included) the miner mines with it;
unbound it uses its own ``distance`` and ``normalize``. Candidates are
scanned in chunks of positive pairs (about 1 M candidates each).
"""

from __future__ import annotations

from typing import Any

import torch

from bench.miners._common import BenchError, BenchMiner, check_distance_params, check_number, distance_matrix
from bench.tuples import Quadruplets

_CHUNK = 1 << 20  # candidate quadruplets scored at once


class MargOHNMMiner(BenchMiner):
    """Quadruplets violating batch-adaptive margins, with the margins attached."""

    def __init__(
        self,
        warmup_iterations: int = 100,
        alpha1: float = 1.0,
        alpha2: float = 0.5,
        w1: float = 1.0,
        w2: float = 0.5,
        distance: str = "squared_euclidean",
        normalize: bool = True,
        max_tuples: int = 8192,
    ) -> None:
        super().__init__()
        self.warmup_iterations = _check_int("warmup_iterations", warmup_iterations, 0)
        self.alpha1 = check_number("alpha1", alpha1)
        self.alpha2 = check_number("alpha2", alpha2)
        self.w1 = check_number("w1", w1, low=0.0)
        self.w2 = check_number("w2", w2, low=0.0)
        self.distance, self.normalize = check_distance_params(distance, normalize)
        self.max_tuples = _check_int("max_tuples", max_tuples, 1)
        self._loss: Any = None
        self._calls = 0

    def bind_loss(self, loss: Any) -> None:
        """Mine with the loss's own metric when it exposes one (``distance_matrix``)."""
        self._loss = loss if hasattr(loss, "distance_matrix") else None

    def distances(self, embeddings: torch.Tensor) -> torch.Tensor:
        if self._loss is not None:
            return self._loss.distance_matrix(embeddings)
        return distance_matrix(embeddings, self.distance, self.normalize)

    def margins(self, dist: torch.Tensor, labels: torch.Tensor, warm: bool) -> tuple[float, float]:
        """The adaptive (or, warming up, the fixed) margins; fills mu_p / mu_n in ``stats``."""
        same = labels[:, None] == labels[None, :]
        off_diagonal = ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
        pos, neg = dist[same & off_diagonal], dist[~same]
        if len(pos) == 0 or len(neg) == 0:
            return self.alpha1, self.alpha2
        mu_p, mu_n = float(pos.mean()), float(neg.mean())
        self.stats.update(mu_p=mu_p, mu_n=mu_n)
        if warm:
            return self.alpha1, self.alpha2
        return self.w1 * (mu_n - mu_p), self.w2 * (mu_n - mu_p)

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> Quadruplets:
        self._calls += 1
        warm = self._calls <= self.warmup_iterations
        dist = self.distances(embeddings)
        alpha1, alpha2 = self.margins(dist, labels, warm)
        found, losses, violating = violating_quadruplets(dist, labels, alpha1, alpha2, self.max_tuples)
        self.stats.update(alpha1=alpha1, alpha2=alpha2, warmup=float(warm), num_violating=float(violating),
                          num_tuples=float(len(found[0])),
                          mean_loss=float(losses.mean()) if len(losses) else 0.0)
        return Quadruplets(*found, alpha1=alpha1, alpha2=alpha2)


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BenchError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def violating_quadruplets(dist: torch.Tensor, labels: torch.Tensor, alpha1: float, alpha2: float,
                          max_tuples: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, int]:
    """The (at most ``max_tuples``) hardest quadruplets with a positive loss, their losses, and
    how many violated in all. Returned hardest first."""
    n = len(labels)
    same = labels[:, None] == labels[None, :]
    a, p = torch.where(same & ~torch.eye(n, dtype=torch.bool, device=labels.device))
    empty = torch.empty(0, dtype=torch.long, device=labels.device)
    kept: tuple[torch.Tensor, ...] = (empty,) * 4
    kept_loss = dist.new_empty(0)
    violating = 0
    step = max(1, _CHUNK // max(1, n * n))
    for start in range(0, len(a), step):
        i, j = a[start:start + step], p[start:start + step]
        other = ~same[i]  # (q, B): samples of a class other than y_i
        valid = other[:, :, None] & other[:, None, :] & ~same[None, :, :]  # (q, l, k)
        positive = dist[i, j][:, None, None]
        loss = torch.relu(positive - dist[i][:, None, :] + alpha1) + torch.relu(positive - dist[None] + alpha2)
        loss = torch.where(valid, loss, 0)
        violating += int((loss > 0).sum())
        # only candidates that can enter the top max_tuples: at or above the chunk's max_tuples-th loss
        flat = loss.view(-1)
        floor = torch.topk(flat, min(max_tuples, flat.numel()), sorted=False).values.min()
        q, l, k = torch.where((loss > 0) & (loss >= floor))  # noqa: E741 - (i, j, l, k) order
        cand = (torch.cat([kept[0], i[q]]), torch.cat([kept[1], j[q]]), torch.cat([kept[2], l]),
                torch.cat([kept[3], k]))
        cand_loss = torch.cat([kept_loss, loss[q, l, k]])
        order = torch.sort(cand_loss, descending=True, stable=True).indices[:max_tuples]
        kept, kept_loss = tuple(t[order] for t in cand), cand_loss[order]
    return kept, kept_loss, violating
