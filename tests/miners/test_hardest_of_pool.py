"""Hardest of a random pool (`bench.miners.hardest_of_pool`): the kept tuples, valid draws, dataset level."""

from __future__ import annotations

import pytest
import torch
from _quadruplet_refs import embeddings, ref_matrix, ref_terms

from bench.errors import BenchError
from bench.losses.quadruplet import QuadrupletLoss
from bench.miners.hardest_of_pool import HardestOfPoolMiner, draw_quadruplets, draw_triplets
from bench.tuples import Quadruplets


def ref_pool_losses(pool, g, kind, margin=0.2, alpha1=1.0, alpha2=0.5) -> list[float]:
    if kind == "triplet":
        return [max(float(g[a][p]) - float(g[a][n]) + margin, 0.0) for a, p, n in zip(*(t.tolist() for t in pool))]
    quads = list(zip(*(t.tolist() for t in pool)))
    return [float(v) for v in ref_terms(g, quads, alpha1, alpha2)]


@pytest.mark.parametrize("kind", ["quadruplet", "triplet"])
def test_hardest_of_pool_keeps_exactly_the_hardest(kind: str) -> None:
    labels = torch.arange(6).repeat_interleave(3)
    emb = embeddings(len(labels), seed=8).detach()
    miner = HardestOfPoolMiner(pool_size=60, num_hardest=10, num_random=5, kind=kind, seed=3)
    out = miner(emb, labels)
    assert isinstance(out, Quadruplets) == (kind == "quadruplet") and len(out) == (6 if kind == "quadruplet" else 3)
    draw = draw_quadruplets if kind == "quadruplet" else draw_triplets
    pool = draw(labels, 60, torch.Generator().manual_seed(3))
    losses = ref_pool_losses(pool, ref_matrix(emb, "squared_euclidean", True), kind)
    rows = list(zip(*(t.tolist() for t in pool)))
    order = sorted(range(60), key=lambda t: -losses[t])  # stable: ties (repeated tuples, zeros) in pool order
    assert losses[order[9]] > 0 and len(set(rows)) > 40
    kept = list(zip(*(t.tolist() for t in out[: len(rows[0])])))
    assert kept[:10] == [rows[t] for t in order[:10]]
    rest = [rows[t] for t in order[10:]]
    assert len(kept) == 15 and all(r in rest for r in kept[10:])
    assert miner.stats["num_tuples"] == 15
    assert miner.stats["hardest_loss"] == pytest.approx(sum(losses[t] for t in order[:10]) / 10, rel=1e-9)
    again = HardestOfPoolMiner(pool_size=60, num_hardest=10, num_random=5, kind=kind, seed=3)(emb, labels)
    assert all(torch.equal(a, b) for a, b in zip(out[:3], again[:3]))


def test_random_tuples_are_valid_and_cover_the_classes() -> None:
    labels = torch.tensor([3, 3, 1, 1, 1, 7, 2, 2, 9, 9, 9, 9])
    g = torch.Generator().manual_seed(0)
    i, j, l, k = draw_quadruplets(labels, 3000, g)
    assert bool(
        (
            (labels[i] == labels[j])
            & (i != j)
            & (labels[l] != labels[k])
            & (labels[l] != labels[i])
            & (labels[k] != labels[i])
        ).all()
    )
    assert set(i.tolist()) == set(range(12)) - {5}  # the singleton class 7 is never an anchor
    assert set(l.tolist()) == set(k.tolist()) == set(range(12))
    a, p, n = draw_triplets(labels, 3000, g)
    assert bool(((labels[a] == labels[p]) & (a != p) & (labels[a] != labels[n])).all())
    assert all(len(t) == 0 for t in draw_quadruplets(torch.tensor([0, 0, 1, 1]), 10, g))
    assert all(len(t) == 0 for t in draw_triplets(torch.tensor([0, 1, 2]), 10, g))


def test_hardest_of_pool_dataset_level() -> None:
    labels = torch.arange(20).repeat_interleave(5)
    table = embeddings(100, dim=8, seed=9).detach()
    calls: list[torch.Tensor] = []

    def embed(idx: torch.Tensor) -> torch.Tensor:
        calls.append(idx)
        return table[idx]

    loss = QuadrupletLoss(alpha1=0.6, alpha2=0.3, distance="euclidean")
    miner = HardestOfPoolMiner(pool_size=40, num_hardest=8, num_random=4)
    assert miner.dataset_level
    miner.bind_loss(loss)
    samples, q = miner.batch(0, embed, labels, torch.Generator().manual_seed(5))
    pool = draw_quadruplets(labels, 40, torch.Generator().manual_seed(5))
    assert len(calls) == 1 and torch.equal(calls[0], torch.unique(torch.cat(pool)))
    kept = list(zip(*(samples[t].tolist() for t in q[:4])))
    assert torch.equal(torch.unique(samples[torch.cat(list(q[:4]))]), samples)  # every sample is used
    assert len(kept) == 12 and len(samples) <= 48
    losses = ref_pool_losses(pool, ref_matrix(table, "euclidean", True), "quadruplet", alpha1=0.6, alpha2=0.3)
    rows = list(zip(*(t.tolist() for t in pool)))
    order = sorted(range(40), key=lambda t: -losses[t])
    assert kept[:8] == [rows[t] for t in order[:8]]
    value = loss(table[samples].clone().requires_grad_(), labels[samples], q)  # positions within samples
    assert float(value.detach()) == pytest.approx(sum(losses[rows.index(r)] for r in kept) / 12, rel=1e-9)
    with pytest.raises(BenchError, match="3 classes"):
        miner.batch(0, embed, torch.tensor([0, 0, 1, 1]), torch.Generator())
