"""Lifted structure loss (`bench.losses.lifted`): the paper's smooth and hard forms against a float64 loop."""

from __future__ import annotations

import pytest
import torch
from _pair_loss_refs import assert_same, batch

from bench.losses.lifted import LiftedStructureLoss


def lifted_reference(x, labels, margin, hard, scale=1.0):
    """Song et al. 2016, eq. 2 and eq. 3 (hard), over unordered positive pairs, on normalised embeddings;
    ``scale`` s: the soft maximum ``log sum exp(s * slack) / s``."""
    x = x / x.norm(dim=1, keepdim=True)
    b = len(x)
    dist = lambda i, j: torch.linalg.vector_norm(x[i] - x[j])  # noqa: E731
    terms = []
    for i in range(b):
        for j in range(i + 1, b):
            if labels[i] != labels[j]:
                continue
            slack = [margin - dist(i, k) for k in range(b) if labels[k] != labels[i]]
            slack += [margin - dist(j, k) for k in range(b) if labels[k] != labels[j]]
            neg = torch.stack(slack).max() if hard else torch.logsumexp(scale * torch.stack(slack), 0) / scale
            terms.append(torch.relu(neg + dist(i, j)) ** 2)
    return torch.stack(terms).sum() / (2 * len(terms))


@pytest.mark.parametrize("form", ["smooth", "hard"])
def test_lifted_structure_equals_the_paper(form):
    x, y = batch(10, 3, 3, seed=2)
    assert_same(
        lambda e: LiftedStructureLoss(margin=1.2, form=form)(e, y),
        lambda e: lifted_reference(e, y, 1.2, form == "hard"),
        x,
    )


@pytest.mark.parametrize("scale", [0.5, 8.0, 40.0])
def test_lifted_structure_scale_equals_the_loop(scale):
    x, y = batch(12, 4, 3, seed=5)
    assert_same(
        lambda e: LiftedStructureLoss(margin=0.7, scale=scale)(e, y),
        lambda e: lifted_reference(e, y, 0.7, False, scale),
        x,
    )
