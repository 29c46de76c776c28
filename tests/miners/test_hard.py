"""Hard-negative mining (`bench.miners.hard`): every triplet whose negative is no farther than its positive."""

from __future__ import annotations

import itertools

import pytest
import torch
from _triplet_refs import _as_set, _pk

from bench.registry import build_loss, build_miner


def hard_loop(x: torch.Tensor, y: torch.Tensor, cosine: bool) -> set[tuple[int, int, int]]:
    """The rule by loops in float64: D(a,n) <= D(a,p), D Euclidean on L2-normalised rows or 1 - cos."""
    e = x / x.norm(dim=1, keepdim=True)
    out = set()
    for a, p, n in itertools.product(range(len(y)), repeat=3):
        if a != p and y[a] == y[p] and y[n] != y[a]:
            ap = 1 - e[a] @ e[p] if cosine else (e[a] - e[p]).norm()
            an = 1 - e[a] @ e[n] if cosine else (e[a] - e[n]).norm()
            if an <= ap:
                out.add((a, p, n))
    return out


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hard_triplets_match_a_loop(distance, seed):
    x, y = _pk(4, 3, 3, seed)
    mined = build_miner("hard", distance=distance)(x, y)
    expected = hard_loop(x, y, distance == "cosine")
    assert _as_set(mined) == expected and len(expected) > 0


def test_by_hand_on_a_line():
    # 1-D, no normalisation: positives 0 and 1 at distance 1; the negative 2 at 0.5 from 0 and 1.5 from 1
    x = torch.tensor([[0.0], [1.0], [-0.5]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1])
    assert _as_set(build_miner("hard", normalize=False)(x, y)) == {(0, 1, 2)}


def test_the_loss_on_hard_triplets_sends_gradient_to_every_mined_sample():
    x, y = _pk(3, 3, 4, 3)
    mined = build_miner("hard")(x, y)
    e = x.clone().requires_grad_(True)
    build_loss("triplet", margin=0.1)(e, y, mined).backward()
    touched = set(torch.cat(mined).tolist())
    assert touched and all(bool(e.grad[i].abs().sum() > 0) for i in touched)
