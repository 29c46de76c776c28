"""Margin-based online hard negative mining (Chen et al., Beyond triplet loss, CVPR 2017, sec. 3.3).

The margins follow the batch: ``alpha1 = w1 * (mu_n - mu_p)`` and
``alpha2 = w2 * (mu_n - mu_p)`` (``w1 = 1``, ``w2 = 0.5`` in the paper, and
``w1 > w2`` is required, as ``alpha1 > alpha2``),
``mu_p`` / ``mu_n`` the means of ``G`` over the batch's positive / negative
pairs (ordered pairs, no self-pairs), where ``G`` is the value the quadruplet
loss puts in its terms (`QuadrupletLoss.distance_matrix`: the paper's
``g^2``, for the learned metric too). As the paper writes them, the
margins are clipped at 0 (``max(w (mu_n - mu_p), 0)``): when negatives are
on average nearer than positives the margins are 0, not negative.
``clip_margins=False`` keeps the negative values (dmlbench's behaviour
before issue 23, a departure kept for comparison). During the first ``warmup_iterations`` calls (and whenever a batch has no
positive or no negative pair) fixed margins are used: a fresh learned
metric gives ``g`` near 0.5 everywhere, hence adaptive margins near 0. The
fixed ones are ``alpha1`` / ``alpha2`` when given, else ``w1`` / ``w2``
times one unit of ``G`` (the paper's 1 and 0.5 at the default weights), so
the weights act in warm-up too.

The miner's margins travel with the tuples and replace the quadruplet
loss's: with this miner the loss's ``alpha1`` / ``alpha2`` change nothing
(the registry entry says so with ``supplies``), and the weights are what a
search tunes. They are live: the violating set, hence the gradient's
direction, moves with them.

Only the quadruplets that violate the margins are returned, i.e. whose loss
``[G(i,j) - G(i,k) + alpha1]_+ + [G(i,j) - G(l,k) + alpha2]_+`` is
positive, and the margins travel with them (``Quadruplets.alpha1/alpha2``)
so the loss uses the same ones. By default every violating quadruplet is
returned, as the method prescribes (a P x K = 16 x 4 batch holds about
0.65 M quadruplets; 32 x 4 about 5.7 M). ``max_tuples`` bounds the cost for
large batches: ``keep="random"`` (default) takes a uniform sample of the
violating ones, which keeps the method's selection unbiased;
``keep="hardest"`` takes the largest losses (ties in (i, j, l, k) order).
The hardest cap is not the method: on Omniglot (Conv-4, 64-d, 16 x 4
batches, 400 iterations) the 8,192 hardest of a batch collapsed the
embedding to MAP@R 0.03 where all violating quadruplets reached 0.26, the
fate of hardest-negative triplet mining too.

Metric: see `bench.miners._common.LossMetric`. Candidates are scanned in
chunks of positive pairs (about 1 M candidates each).

Bound to a loss that sums violating quadruplets in closed form (the
quadruplet loss: ``sums_violating``), the uncapped miner lists nothing: it
returns `bench.tuples.ViolatingQuadruplets` (its margins and how many
violate), and the loss sums every quadruplet's terms, to which the others
add 0. The same loss and gradient up to float rounding
(`tests/losses/test_quadruplet.py`), without the O(B^4) indices: 0.8 s a step
became a few ms at 32 x 4 (`benchmarks/bench_margohnm.py`).
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
