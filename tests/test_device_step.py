"""The training step's device path keeps the CPU's results bit for bit.

The loop takes its PK batches from chunks already on the device
(`PKSampler.iterate_on`) and runs fused optimisers on CUDA; here a bare loop
over `PKSampler.batch(step)` with the default Adam, each step's indices
copied on their own, must train the very same weights and losses on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.cell import build_cell as build
from bench.cell import optimizer as _optimizer
from bench.cell.build import _fused
from bench.data import LabeledData, load
from bench.data.samplers import CHUNK, PKSampler
from bench.training import (
    SYNC_EVERY,
    TrainConfig,
    augment,
    read_back_point,
    seed_everything,
    train,
)


@pytest.fixture(scope="module")
def omniglot(data_root: Path) -> LabeledData:
    background = load("omniglot:background", data_root, 28)
    return background.subset(background.classes[:40])


@pytest.mark.parametrize("start", [0, 5, CHUNK - 1, CHUNK, 3 * CHUNK + 7])
def test_batches_on_the_device_are_the_samplers_batches(start: int) -> None:
    labels = torch.arange(30).repeat_interleave(7)
    sampler = PKSampler(labels, 8, 4, seed=3)
    stream = sampler.iterate_on(torch.device("cpu"), start)
    for step in range(start, start + 2 * CHUNK + 3):
        assert torch.equal(next(stream), sampler.batch(step)), step


def _bare_loop(config: TrainConfig, data: LabeledData) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The plain loop: a batch's indices drawn by step and copied alone, the default Adam, no buffer."""
    device = torch.device(config.device)
    generator = seed_everything(config.seed)
    _, labels = torch.unique(data.y, return_inverse=True)
    trunk, loss_fn, miner = build(config, tuple(data.x.shape[1:]), int(labels.max()) + 1, device)
    optimizer = _optimizer(config, trunk, loss_fn)
    sampler = PKSampler(labels, config.P, config.K, config.seed)
    losses = []
    trunk.train()
    for step in range(config.iterations):
        idx = sampler.batch(step).to(device)
        xb, yb = data.x[idx], labels[idx]
        if config.augmentation:
            xb = augment(xb, config.augmentation, generator)
        emb = trunk(xb)
        loss = loss_fn(emb, yb, miner(emb, yb) if miner is not None else None)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return {k: v.clone() for k, v in trunk.state_dict().items()}, losses


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"augmentation": "affine", "optimizer": "sgd", "loss": "contrastive", "loss_params": {}, "miner": None},
    ],
    ids=["triplet+batch_hard+adam", "contrastive+affine+sgd"],
)
def test_train_equals_the_bare_loop_bit_for_bit_on_the_cpu(omniglot: LabeledData, changes: dict) -> None:
    base = dict(
        trunk="conv4",
        embedding_dim=32,
        loss="triplet",
        loss_params={"margin": 0.2},
        miner="batch_hard",
        P=8,
        K=4,
        iterations=CHUNK + SYNC_EVERY + 3,  # past a chunk's end and a read-back
        seed=5,
    )
    config = TrainConfig(**{**base, **changes})
    result = train(config, omniglot)
    weights, losses = _bare_loop(TrainConfig(**{**base, **changes}), omniglot)
    got = result.model.state_dict()
    assert got.keys() == weights.keys()
    for name, value in weights.items():
        assert torch.equal(got[name], value), name
    window = losses[-50:]
    assert result.final_loss == float(torch.tensor(window).mean())


def test_optimisers_are_fused_on_cuda_only() -> None:
    cpu = [{"params": [torch.nn.Parameter(torch.zeros(2))]}]
    assert not _fused(cpu) and not _fused([{"params": []}])
    config = TrainConfig(trunk="mlp", embedding_dim=8)
    trunk, loss, _ = build(config, (1, 8, 8), 4, torch.device("cpu"))
    assert not _optimizer(config, trunk, loss).defaults.get("fused")


def test_a_read_back_point_on_the_cpu_changes_nothing() -> None:
    with read_back_point(torch.device("cpu")):
        pass
    if torch.cuda.is_available():
        assert torch.cuda.get_sync_debug_mode() == 0
