"""Batch-hard mining (`bench.miners.batch_hard`) by hand."""

from __future__ import annotations

import torch
from _triplet_refs import _as_set

from bench.registry import build_miner


def test_batch_hard_picks_farthest_positive_and_nearest_negative():
    x = torch.tensor([[0.0], [1.0], [3.0], [1.5], [10.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 1, 2])
    a, p, n = build_miner("batch_hard", normalize=False)(x, y)
    assert _as_set((a, p, n)) == {(0, 2, 3), (1, 2, 3), (2, 0, 3)}  # 3 and 4 have no positive
