"""Contrastive loss (`bench.losses.contrastive`): Hadsell's forms against a float64 loop, its stats."""

from __future__ import annotations

import pytest
import torch
from _pair_loss_refs import assert_same, batch

from bench.losses.contrastive import ContrastiveLoss
from bench.tuples import all_pairs


def hadsell_reference(x, labels, pairs, pos_margin, neg_margin, w, squared):
    terms = []
    a1, p, a2, n = pairs
    for i, j, positive in [(i, j, True) for i, j in zip(a1.tolist(), p.tolist())] + [
        (i, j, False) for i, j in zip(a2.tolist(), n.tolist())
    ]:
        d = torch.linalg.vector_norm(x[i] / x[i].norm() - x[j] / x[j].norm())
        if squared:
            t = w * torch.relu(d**2 - pos_margin) if positive else (1 - w) * torch.relu(neg_margin - d**2)
        else:
            t = w * torch.relu(d - pos_margin) ** 2 if positive else (1 - w) * torch.relu(neg_margin - d) ** 2
        terms.append(t)
    return torch.stack(terms).mean()


@pytest.mark.parametrize("form", ["hadsell", "hadsell_squared"])
@pytest.mark.parametrize("use_tuple", [False, True])
def test_hadsell_forms_equal_a_loop(form, use_tuple):
    x, y = batch(9, 4, 3, seed=5)
    pairs = all_pairs(y)
    if use_tuple:  # a few pairs, one of them twice
        pairs = tuple(t[[0, 3, 3, 7]] for t in pairs[:2]) + tuple(t[[1, 2, 20, 20, 40]] for t in pairs[2:])
    loss = ContrastiveLoss(0.1, 0.9, form=form, pos_weight=0.3)
    assert loss.reduction == "mean"
    assert_same(
        lambda e: loss(e, y, pairs if use_tuple else None),
        lambda e: hadsell_reference(e, y, pairs, 0.1, 0.9, 0.3, form == "hadsell_squared"),
        x,
    )


def test_stats_count_pairs_and_positive_share():
    x, y = batch(10, 4, 3)
    loss = ContrastiveLoss(neg_margin=100.0)  # every negative pair violates the margin
    loss(x, y)
    negatives = float((y[:, None] != y[None, :]).sum())
    assert loss.stats["num_tuples"] == 10 * 9 and loss.stats["num_neg_pairs"] == negatives
    assert loss.stats["fraction_positive"] >= negatives / 90
