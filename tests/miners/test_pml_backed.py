"""Miners backed by PML (`bench.miners.pml_backed`): PML's pairs and stats."""

from __future__ import annotations

import torch
from _pair_loss_refs import batch

from bench.registry import build_miner


def test_pml_backed_miner_returns_pml_pairs_and_stats():
    from pytorch_metric_learning.miners import MultiSimilarityMiner

    x, y = batch(16, 5, 4)
    miner = build_miner("pml:multi_similarity", epsilon=0.3)
    ours, theirs = miner(x, y), MultiSimilarityMiner(epsilon=0.3)(x, y)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert miner.stats["num_tuples"] == len(ours[0]) + len(ours[2]) > 0
