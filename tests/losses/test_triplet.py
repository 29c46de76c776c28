"""Triplet loss (`bench.losses.triplet`): soft margin and squared distance by hand."""

from __future__ import annotations

import pytest
import torch

from bench.registry import build_loss


def test_soft_margin_and_squared_distance():
    x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1])
    soft = build_loss("triplet", margin=0.0, soft=True, normalize=False)(x, y)
    expected = (torch.log1p(torch.exp(torch.tensor(1.0 - 3.0))) + torch.log1p(torch.exp(torch.tensor(1.0 - 2.0)))) / 2
    assert float(soft) == pytest.approx(float(expected))
    sq = build_loss("triplet", margin=5.0, distance="squared_euclidean", normalize=False, reduction="sum")(x, y)
    assert float(sq) == pytest.approx(max(0, 1 - 9 + 5) + max(0, 1 - 4 + 5))


def triplet_loop(x: torch.Tensor, y: torch.Tensor, margin: float, soft: bool, reduction: str) -> torch.Tensor:
    """Every valid (a, p, n) of the batch by plain loops in float64, Euclidean on L2-normalised rows."""
    e = x / x.norm(dim=1, keepdim=True)
    terms = []
    for a in range(len(y)):
        for p in range(len(y)):
            for n in range(len(y)):
                if a != p and y[a] == y[p] and y[n] != y[a]:
                    z = (e[a] - e[p]).norm() - (e[a] - e[n]).norm() + margin
                    terms.append(torch.log1p(torch.exp(z)) if soft else torch.clamp(z, min=0))
    total = torch.stack(terms)
    if reduction == "sum":
        return total.sum()
    if reduction == "mean":
        return total.mean()
    positive = total[total > 0]  # avg_nonzero: the mean over the triplets with a positive loss
    return positive.mean() if len(positive) else total.sum() * 0


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("reduction", ["avg_nonzero", "mean", "sum"])
def test_every_triplet_equals_a_float64_loop_value_and_gradient(soft, reduction):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, 4, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3])  # uneven classes and a singleton
    loss = build_loss("triplet", margin=0.3, soft=soft, reduction=reduction)
    ours, ref = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    value, expected = loss(ours, y), triplet_loop(ref, y, 0.3, soft, reduction)
    value.backward()
    expected.backward()
    torch.testing.assert_close(value.detach(), expected.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-9, atol=1e-12)
    assert float(value.detach()) > 0


def test_gradient_is_the_numerical_one():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(8, 3, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.arange(4).repeat_interleave(2)
    loss = build_loss("triplet", margin=0.5, soft=True)
    assert torch.autograd.gradcheck(lambda e: loss(e, y), (x,))
