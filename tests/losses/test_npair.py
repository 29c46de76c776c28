"""N-pair loss (`bench.losses.npair`) against a float64 loop on any layout."""

from __future__ import annotations

import pytest
import torch
from _pair_loss_refs import assert_same, batch

from bench.losses.npair import NPairLoss


@pytest.mark.parametrize("temperature", [1.0, 0.05, 0.3])
def test_npair_with_l2_penalty_equals_a_loop_on_any_layout(temperature):
    x, y = batch(11, 4, 4, seed=7)
    y[3] = 9  # a singleton class: no pair
    reg = 0.05

    def reference(e):
        chosen = []
        for c in sorted(set(y.tolist())):
            members = [i for i in range(len(y)) if y[i] == c]
            if len(members) >= 2:
                chosen.append(members[:2])
        terms, penalty = [], []
        for a, p in chosen:
            gaps = [(e[a] @ e[q] - e[a] @ e[p]) / temperature for _, q in chosen if q != p]
            terms.append(torch.log(1 + torch.exp(torch.stack(gaps)).sum()))
            penalty.append(e[a] @ e[a] + e[p] @ e[p])
        return torch.stack(terms).mean() + reg * torch.stack(penalty).mean()

    assert_same(lambda e: NPairLoss(l2_reg=reg, normalize=False, temperature=temperature)(e, y), reference, x)
