"""Losses backed by PML (`bench.losses.pml_backed`): parameters that train, quadruplets, proxies."""

from __future__ import annotations

import pytest
import torch
from _pair_loss_refs import PML_BACKED, PROXY, batch, quadruplet

from bench.errors import BenchError
from bench.registry import build_loss


@pytest.mark.parametrize("name", PML_BACKED)
def test_pml_backed_losses_train_their_parameters_and_take_quadruplets(name):
    x, y = batch(12, 6, 4)
    loss = build_loss(name, context=PROXY)
    needs_proxies = name in (
        "pml:proxy_anchor",
        "pml:arcface",
        "pml:cosface",
        "pml:proxy_nca",
        "pml:normalized_softmax",
        "pml:soft_triple",
    )
    assert (len(list(loss.parameters())) > 0) == needs_proxies
    for t in (None, quadruplet(y)):
        e = x.clone().requires_grad_(True)
        value = loss(e, y, t)
        value.backward()
        assert torch.isfinite(value) and torch.isfinite(e.grad).all()


def test_proxy_losses_refuse_labels_without_a_proxy():
    x, _ = batch(6, 6)
    with pytest.raises(BenchError, match="proxies for labels 0..3"):
        build_loss("pml:proxy_anchor", context=PROXY)(x, torch.tensor([0, 1, 2, 3, 4, 0]))
    with pytest.raises(BenchError, match="needs num_classes"):
        build_loss("pml:cosface")
