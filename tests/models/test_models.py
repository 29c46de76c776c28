"""Trunks: shapes at the sizes protocols use, normalisation, and errors at build time."""

from __future__ import annotations

import pytest
import torch

from bench.errors import BenchError
from bench.registry import build_trunk, names


@pytest.mark.parametrize(
    "name, params",
    [
        ("conv4", {}),
        ("lecun2006", {}),
        ("omniglot_encoder", {"padding": "same"}),
        ("mlp", {}),
        ("mlp", {"hidden": [64, 32]}),
    ],
)
def test_every_trunk_embeds_28x28_images(name: str, params: dict) -> None:
    torch.manual_seed(0)
    model = build_trunk(name, in_shape=(1, 28, 28), embedding_dim=24, **params)
    out = model(torch.rand(5, 1, 28, 28))
    assert out.shape == (5, 24)
    assert torch.isfinite(out).all()
    out.sum().backward()  # every parameter takes part in the embedding
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_registry_lists_the_built_in_trunks() -> None:
    assert set(names("trunk")) == {
        "bninception",
        "conv4",
        "lecun2006",
        "omniglot_encoder",
        "mlp",
        "resnet18",
        "resnet50",
    }


def test_omniglot_encoder_at_its_original_size_is_l2_normalised() -> None:
    torch.manual_seed(0)
    model = build_trunk("omniglot_encoder", in_shape=(1, 105, 105), embedding_dim=16)
    out = model(torch.rand(2, 1, 105, 105))
    assert out.shape == (2, 16)
    assert torch.allclose(out.norm(dim=1), torch.ones(2), atol=1e-5)


def test_other_trunks_leave_normalisation_to_the_loss() -> None:
    torch.manual_seed(0)
    model = build_trunk("conv4", in_shape=(1, 28, 28), embedding_dim=16)
    norms = model(torch.rand(4, 1, 28, 28)).norm(dim=1)
    assert not torch.allclose(norms, torch.ones(4), atol=1e-3)


def test_lecun2006_pads_28x28_to_the_papers_32x32() -> None:
    model = build_trunk("lecun2006", in_shape=(1, 28, 28), embedding_dim=2)
    # 32 -> conv 6x6 -> 27 -> avg-pool 3 -> 9 -> conv 9x9 -> 1: 30 features into the 2-D embedding
    assert model.embed.in_features == 30
    assert model(torch.rand(3, 1, 28, 28)).shape == (3, 2)


def test_conv4_feature_size_follows_the_input() -> None:
    model = build_trunk("conv4", in_shape=(3, 84, 84))
    assert model.embed.in_features == 64 * 5 * 5
    assert model(torch.rand(2, 3, 84, 84)).shape == (2, 128)


def test_mlp_takes_vectors() -> None:
    model = build_trunk("mlp", in_shape=(10,), embedding_dim=3, hidden=[])
    assert model(torch.rand(7, 10)).shape == (7, 3)


@pytest.mark.parametrize(
    "name, in_shape, params, message",
    [
        ("conv4", (1, 12, 12), {}, "at least 16x16"),
        ("omniglot_encoder", (1, 28, 28), {}, "at least 34x34"),
        ("lecun2006", (1, 28, 28), {"pad_to": 0}, "at least 32x32"),
        ("conv4", (784,), {}, "needs images"),
        ("omniglot_encoder", (1, 28, 28), {"padding": "full"}, "padding"),
        ("mlp", (10,), {"hidden": [0]}, "hidden"),
        ("mlp", (10,), {"embedding_dim": 0}, "embedding_dim"),
        ("conv4", (1, 28, 28), {"depth": 3}, "no parameter 'depth'"),
    ],
)
def test_bad_inputs_are_one_line_bench_errors(name: str, in_shape: tuple, params: dict, message: str) -> None:
    with pytest.raises(BenchError, match=message) as info:
        build_trunk(name, in_shape=in_shape, **params)
    assert "\n" not in str(info.value)
