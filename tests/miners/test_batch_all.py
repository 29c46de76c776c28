"""Batch-all mining (`bench.miners.batch_all`) by hand."""

from __future__ import annotations

import pytest
import torch

from bench.registry import build_loss, build_miner


def test_batch_all_fraction_positive_by_hand():
    # 1-D embeddings, no normalisation: distances are |x_i - x_j|
    x = torch.tensor([[0.0], [0.1], [1.0], [0.3]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])
    margin = 0.25
    # triplets (a,p,n) and D(a,p) - D(a,n) + margin:
    # (0,1,2): .1-1+.25<0  (0,1,3): .1-.3+.25=.05>0  (1,0,2): .1-.9+.25<0  (1,0,3): .1-.2+.25=.15>0
    # (2,3,0): .7-1+.25<0  (2,3,1): .7-.9+.25=.05>0  (3,2,0): .7-.3+.25>0  (3,2,1): .7-.2+.25>0
    miner = build_miner("batch_all", margin=margin, normalize=False)
    t = miner(x, y)
    assert len(t[0]) == 8 and miner.stats["num_tuples"] == 8
    assert miner.stats["fraction_positive"] == pytest.approx(5 / 8)
    loss = build_loss("triplet", margin=margin, normalize=False)
    value = loss(x, y, t)
    assert loss.stats["fraction_positive"] == pytest.approx(5 / 8)
    assert float(value) == pytest.approx((0.05 + 0.15 + 0.05 + 0.65 + 0.75) / 5)
    assert float(loss(x, y)) == pytest.approx(float(value))  # no tuple: the same every-triplet loss
