"""Margin-based online hard negative mining (Chen et al., Beyond triplet loss, CVPR 2017, sec. 3.3).

Margins follow the batch: ``alpha1 = max(w1 (mu_n - mu_p), 0)``, ``alpha2 = max(w2 (mu_n - mu_p), 0)``
(the paper's ``w1 = 1``, ``w2 = 0.5``; ``w1 > w2`` so that ``alpha1 > alpha2``), with ``mu_p`` / ``mu_n``
the means of ``G`` (`QuadrupletLoss.distance_matrix`, the paper's ``g^2``) over the batch's ordered
positive / negative pairs. ``clip_margins=False`` keeps negative margins (a departure, for comparison).
During the first ``warmup_iterations`` calls, and for a batch without a positive or a negative pair, the
margins are fixed: ``alpha1`` / ``alpha2`` when given, else ``w1`` / ``w2`` units of ``G``, since a fresh
learned metric gives ``g`` near 0.5 everywhere and adaptive margins near 0.

Returned: the quadruplets whose loss ``[G(i,j) - G(i,k) + alpha1]_+ + [G(i,j) - G(l,k) + alpha2]_+`` is
positive, every one of them as the method prescribes, with the margins attached
(``Quadruplets.alpha1/alpha2``): they replace the loss's own (the registry's ``supplies``), so the
weights are what a search tunes. ``max_tuples`` caps the count: ``keep="random"`` (default) samples the
violating ones uniformly, which keeps the selection unbiased; ``keep="hardest"`` keeps the largest
losses (ties in (i, j, l, k) order), which is not the method and can collapse the embedding as
hardest-negative triplet mining does. Candidates are scored in chunks of about 1 M.

Bound to a loss that sums violating quadruplets in closed form (``sums_violating``: the quadruplet
loss), the uncapped miner returns `bench.tuples.ViolatingQuadruplets` (margins and count) instead of
O(B^4) indices: a non-violating quadruplet adds 0, so the loss and its gradient are the same up to float
rounding. Metric: `bench.miners._common.LossMetric`.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.losses.quadruplet import all_quadruplet_totals
from bench.miners._common import BenchError, BenchMiner, LossMetric, check_bool, check_int, check_number
from bench.tuples import Quadruplets, ViolatingQuadruplets

_CHUNK = 1 << 20  # candidate quadruplets scored at once
KEEP = ("random", "hardest")


class MargOHNMMiner(LossMetric, BenchMiner):
    """Quadruplets violating batch-adaptive margins, with the margins attached."""

    def __init__(
        self,
        warmup_iterations: int = 100,
        alpha1: float | None = None,
        alpha2: float | None = None,
        w1: float = 1.0,
        w2: float = 0.5,
        distance: Any = "squared_euclidean",
        normalize: bool = True,
        max_tuples: int | None = None,
        keep: str = "random",
        clip_margins: bool = True,
    ) -> None:
        super().__init__(distance, normalize)
        self.clip_margins = check_bool("clip_margins", clip_margins)
        self.warmup_iterations = check_int("warmup_iterations", warmup_iterations, 0)
        self.w1 = check_number("w1", w1, low=0.0)
        self.w2 = check_number("w2", w2, low=0.0)
        if not self.w1 > self.w2:
            raise BenchError(f"w1 must be greater than w2 (alpha1 > alpha2), got w1={w1!r}, w2={w2!r}")
        self.alpha1 = self.w1 if alpha1 is None else check_number("alpha1", alpha1)
        self.alpha2 = self.w2 if alpha2 is None else check_number("alpha2", alpha2)
        self.max_tuples = check_int("max_tuples", max_tuples, 1, allow_none=True)
        if keep not in KEEP:
            raise BenchError(f"keep must be one of {', '.join(KEEP)}, got {keep!r}")
        self.keep = keep
        self._calls = 0

    def margins(self, dist: torch.Tensor, labels: torch.Tensor, warm: bool) -> tuple[float, float]:
        """The adaptive (clipped at 0 unless ``clip_margins`` is off) or, warming up, the fixed margins;
        fills mu_p / mu_n in ``stats``."""
        same = labels[:, None] == labels[None, :]
        off_diagonal = ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
        pos, neg = dist[same & off_diagonal], dist[~same]
        if len(pos) == 0 or len(neg) == 0:
            return self.alpha1, self.alpha2
        mu_p, mu_n = float(pos.mean()), float(neg.mean())
        self.stats.update(mu_p=mu_p, mu_n=mu_n)
        if warm:
            return self.alpha1, self.alpha2
        alpha1, alpha2 = self.w1 * (mu_n - mu_p), self.w2 * (mu_n - mu_p)
        if self.clip_margins:
            alpha1, alpha2 = max(alpha1, 0.0), max(alpha2, 0.0)
        return alpha1, alpha2

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> Quadruplets | ViolatingQuadruplets:
        """The violating quadruplets, carrying this batch's margins so that the loss applies them; left
        unlisted for a bound loss that sums them itself."""
        self._calls += 1
        warm = self._calls <= self.warmup_iterations
        dist = self.distances(embeddings)
        alpha1, alpha2 = self.margins(dist, labels, warm)
        if self.max_tuples is None and getattr(self._loss, "sums_violating", False):
            total, _, count = all_quadruplet_totals(dist, labels, alpha1, alpha2)
            self.stats.update(
                alpha1=alpha1,
                alpha2=alpha2,
                warmup=float(warm),
                num_violating=float(count),
                num_tuples=float(count),
                mean_loss=float(total) / count if count else 0.0,
            )
            return ViolatingQuadruplets(len(labels), alpha1, alpha2, count)
        found, losses, violating = violating_quadruplets(dist, labels, alpha1, alpha2, self.max_tuples, self.keep)
        self.stats.update(
            alpha1=alpha1,
            alpha2=alpha2,
            warmup=float(warm),
            num_violating=float(violating),
            num_tuples=float(len(found[0])),
            mean_loss=float(losses.mean()) if len(losses) else 0.0,
        )
        i, j, l, k = found  # noqa: E741 - the paper's names
        return Quadruplets(i, j, l, k, alpha1=alpha1, alpha2=alpha2)


def violating_quadruplets(
    dist: torch.Tensor,
    labels: torch.Tensor,
    alpha1: float,
    alpha2: float,
    max_tuples: int | None = None,
    keep: str = "random",
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, int]:
    """The violating quadruplets (all, or ``max_tuples`` of them chosen by ``keep``), their losses,
    and how many violated in all. Uncapped, or capped above how many violate, they come in (i, j, l, k)
    order; cut to ``max_tuples``, highest key first (the loss for ``hardest``, a uniform draw from torch's
    generator for ``random``). Keeping all in index order keeps the list the same on every device: the
    random keys come from the device's own generator, and ordering by them listed the same quadruplets in
    another order on a GPU than on the CPU."""
    n = len(labels)
    same = labels[:, None] == labels[None, :]
    a, p = torch.where(same & ~torch.eye(n, dtype=torch.bool, device=labels.device))
    empty = torch.empty(0, dtype=torch.long, device=labels.device)
    parts: list[tuple[torch.Tensor, ...]] = []
    part_losses: list[torch.Tensor] = []
    part_keys: list[torch.Tensor] = []
    violating = 0
    step = max(1, _CHUNK // max(1, n * n))
    for start in range(0, len(a), step):
        i, j = a[start : start + step], p[start : start + step]
        other = ~same[i]  # (q, B): samples of a class other than y_i
        valid = other[:, :, None] & other[:, None, :] & ~same[None, :, :]  # (q, l, k)
        positive = dist[i, j][:, None, None]
        loss = torch.relu(positive - dist[i][:, None, :] + alpha1) + torch.relu(positive - dist[None] + alpha2)
        q, l, k = torch.where(valid & (loss > 0))  # noqa: E741 - (i, j, l, k) order
        violating += len(q)
        parts.append((i[q], j[q], l, k))
        part_losses.append(loss[q, l, k])
        if max_tuples is not None:
            key = part_losses[-1] if keep == "hardest" else torch.rand(len(q), device=dist.device)
            if len(key) > max_tuples:  # only a chunk's own top max_tuples can win overall
                top = torch.topk(key, max_tuples, sorted=False).indices.sort().values  # keep (i, j, l, k) order
                parts[-1], part_losses[-1], key = tuple(t[top] for t in parts[-1]), part_losses[-1][top], key[top]
            part_keys.append(key)
            if sum(len(t) for t in part_keys) > 4 * max_tuples:  # bound memory
                parts, part_losses, part_keys = _top(parts, part_losses, part_keys, max_tuples)
    if not parts:
        return (empty,) * 4, dist.new_empty(0), 0
    if max_tuples is not None and violating > max_tuples:
        parts, part_losses, _ = _top(parts, part_losses, part_keys, max_tuples)
    return _cat(parts, empty), torch.cat(part_losses), violating


def _cat(parts: list[tuple[torch.Tensor, ...]], empty: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(torch.cat([p[f] for p in parts]) if parts else empty for f in range(4))


def _top(
    parts: list[tuple[torch.Tensor, ...]],
    losses: list[torch.Tensor],
    keys: list[torch.Tensor],
    m: int,
) -> tuple[list[tuple[torch.Tensor, ...]], list[torch.Tensor], list[torch.Tensor]]:
    """The ``m`` candidates with the highest keys (stable: ties keep (i, j, l, k) order), highest first."""
    key = torch.cat(keys)
    order = torch.sort(key, descending=True, stable=True).indices[:m]
    idx = tuple(t[order] for t in _cat(parts, key.new_empty(0, dtype=torch.long)))
    return [idx], [torch.cat(losses)[order]], [key[order]]
