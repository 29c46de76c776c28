"""Chen et al.'s learned metric (`bench.losses.learned_metric`) against a float64 loop."""

from __future__ import annotations

import math

import pytest
import torch
from _quadruplet_refs import PAIR_INPUTS, close, embeddings, ref_learned

from bench.losses.quadruplet import QuadrupletLoss
from bench.registry import build_loss


@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
def test_learned_metric_matrix_is_symmetric_probability_and_matches_loop(pair_input: str) -> None:
    torch.manual_seed(0)
    loss = QuadrupletLoss(learned_metric=True, metric_hidden=7, metric_layers=3, pair_input=pair_input).double()
    emb = embeddings(6, dim=5)
    x = torch.nn.functional.normalize(emb.detach(), dim=1)
    g = loss.metric.matrix(x)
    assert g.shape == (6, 6)
    assert bool(((g >= 0) & (g <= 1)).all())
    assert torch.equal(g, g.T)
    ref = ref_learned(loss, emb.detach())
    close(g.detach(), torch.stack([torch.stack(r) for r in ref]))
    # the loss's G is g squared (Chen et al.'s eqs. 2-4)
    big_g = loss.distance_matrix(emb).detach()
    close(big_g, torch.stack([torch.stack(r) for r in ref_learned(loss, emb.detach(), squared=True)]))
    close(loss.metric.paired(x[:3], x[3:]), g.detach()[torch.arange(3), torch.arange(3, 6)])
    close(loss.metric.scores(x[:2], x), g.detach()[:2])  # a block of rows: what ranking computes
    if pair_input == "concat":
        assert not torch.allclose(loss.metric.one_way(x), loss.metric.one_way(x).T)  # the network is asymmetric


def test_materialize_draws_the_metric_from_the_seed() -> None:
    """The trainer materialises the metric right after building the loss: its initial weights are a function
    of the random state then, which the floor reproduces."""
    weights = []
    for _ in range(2):
        torch.manual_seed(4)
        loss = build_loss("quadruplet", learned_metric=True, pair_input="difference_product")
        loss.materialize(12)
        weights.append(torch.cat([p.detach().flatten() for p in loss.parameters()]))
    assert loss.metric.first.weight.shape == (10, 24) and torch.equal(weights[0], weights[1])


def test_learned_metric_batch_of_128_is_affordable() -> None:
    loss = QuadrupletLoss(learned_metric=True)
    y = torch.arange(32).repeat_interleave(4)
    emb = torch.randn(128, 64, requires_grad=True)
    value = loss(emb, y)
    value.backward()
    assert loss.stats["num_tuples"] == 128 * 3 * 124 * 120
    assert math.isfinite(float(value.detach())) and emb.grad is not None
