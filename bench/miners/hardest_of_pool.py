"""Hardest of a random pool (Craeymeersch's quadruplet experiment on Omniglot).

Draw ``pool_size`` random valid tuples (the original: 100), score each by
its loss, keep the ``num_hardest`` with the largest loss (16) plus
``num_random`` others drawn uniformly from the rest of the pool (16), so
training sees hard tuples without only ever seeing the hardest (which are
often label noise or outliers).

Random valid tuples: the anchor ``i`` uniformly among samples whose class has
another sample, ``j`` uniformly among the other samples of that class, ``k``
uniformly among samples of other classes, and for quadruplets ``l``
uniformly among samples of neither ``y_i`` nor ``y_k``. Drawing is exact
and vectorised (index arithmetic over the samples sorted by class), never by
rejection, so a run with a seeded ``torch.Generator`` always reproduces.

Losses used to rank: ``kind="quadruplet"``: ``[G(i,j) - G(i,k) + alpha1]_+ +
[G(i,j) - G(l,k) + alpha2]_+``; ``kind="triplet"``: ``[D(a,p) - D(a,n) +
margin]_+``. After ``bind_loss(loss)`` with a quadruplet loss the ranking
uses that loss's metric (``distance_matrix``) and margins; otherwise the
miner's own ``distance``, ``normalize`` and margins.

Two ways to use it:

* batch level, ``miner(embeddings, labels)``: the pool is drawn from the
  batch, with the miner's own generator (seeded by ``seed``);
* dataset level (ARCHITECTURE.md), ``batch(step, embed, labels,
  generator)``: the pool is drawn from the whole training split, only the
  pool's samples (at most 4 * pool_size) are embedded, and the kept tuples
  come back in positions of the returned ``sample_indices``. The training
  loop takes this path when ``dataset_level`` is true (the default; pass
  ``dataset_level=False`` to mine inside the P x K batches instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bench.losses.quadruplet import quadruplet_terms
from bench.miners._common import BenchError, BenchMiner, LossMetric, check_bool, check_choice, check_int, check_number
from bench.tuples import IndexTuple, Quadruplets

KINDS = ("quadruplet", "triplet")
Tuples = tuple[torch.Tensor, ...]


class HardestOfPoolMiner(LossMetric, BenchMiner):
    """Keep the hardest tuples of a random pool, plus random ones."""

    def __init__(
        self,
        pool_size: int = 100,
        num_hardest: int = 16,
        num_random: int = 16,
        kind: str = "quadruplet",
        margin: float = 0.2,
        alpha1: float = 1.0,
        alpha2: float = 0.5,
        distance: Any = "squared_euclidean",
        normalize: bool = True,
        dataset_level: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(distance, normalize)
        self.pool_size = check_int("pool_size", pool_size, 1)
        self.num_hardest = check_int("num_hardest", num_hardest, 0)
        self.num_random = check_int("num_random", num_random, 0)
        if self.num_hardest + self.num_random > self.pool_size:
            raise BenchError(f"num_hardest + num_random ({num_hardest} + {num_random}) exceeds pool_size {pool_size}")
        if self.num_hardest + self.num_random == 0:
            raise BenchError("num_hardest + num_random must be at least 1")
        self.kind = check_choice("kind", kind, KINDS)
        self.margin = check_number("margin", margin)
        self.alpha1 = check_number("alpha1", alpha1)
        self.alpha2 = check_number("alpha2", alpha2)
        self.dataset_level = check_bool("dataset_level", dataset_level)
        self.seed = check_int("seed", seed, 0)
        self._generator = torch.Generator().manual_seed(seed)

    def bind_loss(self, loss: Any) -> None:
        """Rank quadruplets with the quadruplet loss's own metric and margins (triplets: the miner's own)."""
        super().bind_loss(loss if self.kind == "quadruplet" else None)

    def tuple_losses(self, dist: torch.Tensor, tuples: Tuples) -> torch.Tensor:
        """The per-tuple loss the pool is ranked by, on a matrix over the tuples' samples."""
        if self.kind == "triplet":
            a, p, n = tuples
            return torch.relu(dist[a, p] - dist[a, n] + self.margin)
        alpha1, alpha2 = (
            (self._loss.alpha1, self._loss.alpha2) if self._loss is not None else (self.alpha1, self.alpha2)
        )
        return quadruplet_terms(dist, Quadruplets(*tuples), alpha1, alpha2)

    def draw(self, labels: torch.Tensor, generator: torch.Generator) -> Tuples:
        """``pool_size`` random valid tuples of ``kind`` (indices into ``labels``), drawn on the CPU so that
        the seed gives the same pool on any device."""
        drawer = draw_quadruplets if self.kind == "quadruplet" else draw_triplets
        return drawer(labels.cpu(), self.pool_size, generator)

    def select(self, losses: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Positions in the pool: the hardest first, then the random ones."""
        keep = select_hardest(losses.cpu(), self.num_hardest, self.num_random, generator)
        self.stats.update(
            pool_size=float(len(losses)),
            pool_fraction_positive=float((losses > 0).float().mean()) if len(losses) else 0.0,
            hardest_loss=float(losses[keep[: self.num_hardest]].mean()) if len(keep) else 0.0,
            num_tuples=float(len(keep)),
        )
        return keep

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> IndexTuple:
        """Batch-level use: a pool drawn among this batch's labels, its hardest tuples plus random ones."""
        pool = self.draw(labels, self._generator)
        dist = self.distances(embeddings)
        device = embeddings.device
        keep = self.select(self.tuple_losses(dist, tuple(t.to(device) for t in pool)), self._generator)
        return _wrap(self.kind, tuple(t[keep].to(device) for t in pool))

    def batch(
        self, step: int, embed: Callable[[torch.Tensor], torch.Tensor], labels: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, IndexTuple]:
        """Pool drawn from the whole training split; returns (sample_indices, tuples in their positions)."""
        self.stats = {}
        labels = labels.cpu()
        pool = self.draw(labels, generator)
        if len(pool[0]) == 0:
            need = 3 if self.kind == "quadruplet" else 2
            raise BenchError(f"hardest_of_pool needs {need} classes and one with two samples in the training split")
        members = torch.unique(torch.cat(pool))
        with torch.no_grad():
            emb = embed(members)
            dist = self.distances(emb.detach())
            local = tuple(torch.searchsorted(members, t).to(emb.device) for t in pool)
            keep = self.select(self.tuple_losses(dist, local), generator)
        kept = tuple(t[keep] for t in pool)
        sample_indices = torch.unique(torch.cat(kept))
        # the positions index the batch's embeddings, so they go where the embeddings are (a quadruplet loss
        # on CUDA failed on CPU positions); the sample indices stay on the CPU with the pool
        return sample_indices, _wrap(
            self.kind, tuple(torch.searchsorted(sample_indices, t).to(emb.device) for t in kept)
        )


def _wrap(kind: str, tuples: Tuples) -> IndexTuple:
    return Quadruplets(*tuples) if kind == "quadruplet" else tuple(tuples)


def select_hardest(losses: torch.Tensor, num_hardest: int, num_random: int, generator: torch.Generator) -> torch.Tensor:
    """The ``num_hardest`` largest losses (ties: pool order), then ``num_random`` of the rest at random."""
    order = torch.sort(losses, descending=True, stable=True).indices
    rest = order[num_hardest:]
    pick = torch.randperm(len(rest), generator=generator)[:num_random]
    return torch.cat([order[:num_hardest], rest[pick]])


class _ByClass:
    """Samples sorted by class, so 'a sample of class c' or 'of neither c nor d' is index arithmetic."""

    def __init__(self, labels: torch.Tensor) -> None:
        self.order = torch.sort(labels, stable=True).indices
        classes, self.count = torch.unique_consecutive(labels[self.order], return_counts=True)
        self.start = torch.cumsum(self.count, 0) - self.count
        self.cls = torch.searchsorted(classes, labels)  # class number of each sample
        self.rank = torch.empty_like(self.order)
        self.rank[self.order] = torch.arange(len(labels))  # position of each sample in sorted order
        self.size = len(labels)

    def uniform(self, high: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One integer uniform in [0, high) per entry (high >= 1)."""
        u = torch.rand(high.shape, generator=generator, dtype=torch.float64)
        return torch.minimum((u * high).long(), high - 1)

    def anchors(self, n: int, classes_needed: int, generator: torch.Generator) -> torch.Tensor | None:
        eligible = torch.where(self.count[self.cls] >= 2)[0]
        if len(eligible) == 0 or len(self.count) < classes_needed:
            return None
        return eligible[self.uniform(torch.full((n,), len(eligible)), generator)]

    def other_of_same_class(self, i: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        c = self.cls[i]
        offset = 1 + self.uniform(self.count[c] - 1, generator)
        return self.order[self.start[c] + (self.rank[i] - self.start[c] + offset) % self.count[c]]

    def outside(self, excluded: list[torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        """A sample of none of the ``excluded`` classes (per entry; the classes distinct)."""
        blocks = torch.stack([torch.stack([self.start[c], self.count[c]]) for c in excluded])  # (m, 2, n)
        blocks = torch.gather(blocks, 0, blocks[:, :1].argsort(0).expand_as(blocks))  # by start
        pos = self.uniform(self.size - blocks[:, 1].sum(0), generator)
        for start, count in blocks:
            pos = pos + (pos >= start) * count
        return self.order[pos]


def _positive_pairs(
    labels: torch.Tensor, n: int, classes_needed: int, generator: torch.Generator
) -> tuple[_ByClass, tuple[torch.Tensor, torch.Tensor] | None]:
    """``n`` random positive pairs (None when fewer than ``classes_needed`` classes or no pair exist)."""
    by = _ByClass(labels)
    i = by.anchors(n, classes_needed, generator)
    return by, None if i is None else (i, by.other_of_same_class(i, generator))


def _empty(size: int) -> Tuples:
    return tuple(torch.empty(0, dtype=torch.long) for _ in range(size))


def draw_triplets(labels: torch.Tensor, n: int, generator: torch.Generator) -> Tuples:
    """``n`` random valid triplets ``(a, p, n)`` (empty when the labels allow none)."""
    by, pairs = _positive_pairs(labels, n, 2, generator)
    if pairs is None:
        return _empty(3)
    a, p = pairs
    return a, p, by.outside([by.cls[a]], generator)


def draw_quadruplets(labels: torch.Tensor, n: int, generator: torch.Generator) -> Tuples:
    """``n`` random valid quadruplets ``(i, j, l, k)`` (empty when the labels allow none)."""
    by, pairs = _positive_pairs(labels, n, 3, generator)
    if pairs is None:
        return _empty(4)
    i, j = pairs
    k = by.outside([by.cls[i]], generator)
    l = by.outside([by.cls[i], by.cls[k]], generator)  # noqa: E741
    return i, j, l, k
