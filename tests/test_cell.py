"""One cell builder (bench.cell): one rule for num_classes, and every stage builds the cell the same way."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from bench.cell import build_cell, build_methods, classes_of, planned_classes
from bench.data.labeled import LabeledData
from bench.training import TrainConfig, train

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_num_classes_is_the_distinct_training_classes():
    labels = torch.tensor([964, 964, 970, 970, 1200, 1200])  # global ids with gaps, as Omniglot's evaluation
    assert classes_of(labels) == 3
    assert planned_classes(8) == 8  # the data not read, no count known: the batch's P
    assert planned_classes(8, 964) == 964 and planned_classes(8, 3) == 8


def test_a_proxy_loss_trains_one_proxy_per_class_on_labels_with_gaps():
    """Training sees labels 0..C-1 and builds C proxies, whatever the class ids: no spare proxy for a class the
    run never sees (a spare one would be a negative in every softmax over proxies)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([5, 17, 400, 401])
    y = ids.repeat_interleave(6)
    data = LabeledData(torch.randn(len(y), 8, generator=g), y, "gaps")
    seen = {}
    config = TrainConfig(trunk="mlp", embedding_dim=4, loss="pml:proxy_nca", P=2, K=2, iterations=3)
    train(config, data, on_built=lambda trunk, loss: seen.update(loss=loss))
    proxies = [p for p in seen["loss"].parameters() if p.dim() == 2]
    assert [tuple(p.shape) for p in proxies] == [(4, 4)]  # 4 classes x 4 dimensions, not 402 rows


def test_build_cell_draws_the_trunk_first_so_the_floor_starts_where_training_starts():
    """A seeded build_cell gives the same trunk whatever the loss: the floor scores the trunk a run starts from."""
    config = TrainConfig(trunk="mlp", embedding_dim=4, loss="triplet")
    learned = TrainConfig(
        trunk="mlp", embedding_dim=4, loss="quadruplet", loss_params={"learned_metric": True}, miner="margohnm"
    )
    weights = []
    for c in (config, learned):
        torch.manual_seed(3)
        trunk, loss, miner = build_cell(c, (8,), 5, torch.device("cpu"))
        weights.append([p.detach().clone() for p in trunk.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights))
    assert miner is not None and loss.pair_scorer() is not None


def test_build_methods_binds_the_miner_and_materialises_the_metric():
    torch.manual_seed(0)
    loss, miner = build_methods("quadruplet", {"learned_metric": True}, "margohnm", {}, num_classes=4, embedding_dim=6)
    assert not any(torch.nn.parameter.is_lazy(p) for p in loss.parameters())  # its weights drawn now
    torch.manual_seed(0)
    again, _ = build_methods("quadruplet", {"learned_metric": True}, None, {}, num_classes=4, embedding_dim=6)
    assert all(torch.equal(a, b) for a, b in zip(loss.parameters(), again.parameters()))
    none, alone = build_methods(None, {}, "batch_hard", {}, num_classes=4, embedding_dim=6)
    assert none is None and alone is not None


def _calls(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in names:
                found.append(f"{path.relative_to(BENCH.parent)}:{node.lineno} {name}")
    return found


def test_losses_and_miners_are_built_in_one_place():
    """Validation, the pre-flight, the probe, the plan's timing, the floor, training and single runs all build
    a cell's methods through bench.cell; only the PML cross-check builds its own, to compare with PML's."""
    calls = [
        c
        for path in BENCH.rglob("*.py")
        if path.parent.name not in ("crosscheck", "registry")
        for c in _calls(path, {"build_loss", "build_miner"})
    ]
    assert calls and all(c.startswith("bench/cell/build.py") for c in calls), calls
