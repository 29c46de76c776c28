"""Offline mining (`bench.miners.offline`) against a loop reference; pool batches and refresh."""

from __future__ import annotations

import itertools

import pytest
import torch
from _triplet_refs import _as_set, _pk, distance_matrix

from bench.registry import build_miner


def _offline_reference(x, y, margin, strategy):
    d = distance_matrix(x)
    chosen = []
    for a, p in itertools.product(range(len(y)), repeat=2):
        if a == p or y[a] != y[p]:
            continue
        negs = [n for n in range(len(y)) if y[n] != y[a]]
        if not negs:
            continue
        semi = [n for n in negs if 0 < d[a, n] - d[a, p] <= margin] if strategy == "semihard" else []
        n = min(semi or negs, key=lambda m: (float(d[a, m]), m))
        chosen.append((a, p, n, float(d[a, p] - d[a, n] + margin) > 0))
    violating = [t[:3] for t in chosen if t[3]]
    return set(violating) if violating else {t[:3] for t in chosen}


@pytest.mark.parametrize("strategy", ["hard", "semihard"])
def test_offline_mining_matches_loop_reference(strategy):
    x, y = _pk(7, 3, 5, 11)
    y[-1] = 99  # a singleton: an anchor without positive
    miner = build_miner("offline", strategy=strategy, margin=0.4, chunk_size=4)
    got = _as_set(miner(x, y))
    assert got == _offline_reference(x, y, 0.4, strategy)
    assert 0 < miner.stats["fraction_positive"] <= 1


def test_offline_batches_serve_pool_triplets_and_refresh():
    x, y = _pk(10, 4, 6, 5)
    calls = []

    def embed(indices):
        calls.append(indices.clone())
        return x[indices]

    miner = build_miner("offline", refresh_every=3, subset_size=24, triplets_per_batch=8)
    assert miner.dataset_level
    g = torch.Generator().manual_seed(0)
    for step in range(7):
        samples, (a, p, n) = miner.batch(step, embed, y, g)
        assert len(a) == 8
        sy = y[samples]
        assert bool((sy[a] == sy[p]).all() and (sy[a] != sy[n]).all() and (a != p).all())
        pool = set(zip(*(t.tolist() for t in miner._pool)))
        assert {(int(samples[i]), int(samples[j]), int(samples[k])) for i, j, k in zip(a, p, n)} <= pool
    assert len(calls) == 3  # steps 0, 3, 6
    assert all(len(c) == 24 for c in calls)
    assert not torch.equal(calls[0], calls[1])
