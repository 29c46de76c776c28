"""A plain pytorch-metric-learning script, as a user would write it: the anchor the harness's tuned cell must reach.

Conv-4 on Omniglot's background characters at 28x28, PML's TripletMarginLoss
and BatchHardMiner with PML's defaults, MPerClassSampler batches (4 drawings
a character), Adam 1e-3, fp32, no augmentation, no schedule. Only the data
and the scoring come from bench (its loaders, Lake's runs, `evaluate` in the
L2-normalised geometry PML's default distance trains in), so that
`compare_plain_pml.py` compares training procedures and nothing else.

    .venv/bin/python benchmarks/plain_pml_script.py [ITERATIONS [SEED]]
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from pytorch_metric_learning import losses, miners, samplers
from torch import nn

from bench.data import load, load_lake_runs
from bench.evaluation import evaluate


def conv4(embedding_dim: int = 64) -> nn.Module:
    """Four conv-BN-ReLU-pool blocks (28x28 -> 64 x 1 x 1), then a linear layer, as bench's trunk."""
    blocks = [
        [nn.Conv2d(1 if i == 0 else 64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2)]
        for i in range(4)
    ]
    return nn.Sequential(*sum(blocks, []), nn.Flatten(), nn.Linear(64, embedding_dim))


def train_model(
    iterations: int = 3000, seed: int = 0, batch_size: int = 128, m: int = 4, root: str | None = None
) -> nn.Module:
    """``iterations`` Adam steps on batches of ``batch_size`` (``m`` drawings a character)."""
    torch.manual_seed(seed)
    np.random.seed(seed)  # MPerClassSampler draws from numpy's global generator
    train = load("omniglot:background", root)
    sampler = samplers.MPerClassSampler(
        train.y, m=m, batch_size=batch_size, length_before_new_iter=iterations * batch_size
    )
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(train.x, train.y), batch_size=batch_size, sampler=sampler
    )
    model = conv4()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn, miner = losses.TripletMarginLoss(), miners.BatchHardMiner()
    model.train()
    for x, y in loader:
        embeddings = model(x)
        loss = loss_fn(embeddings, y, miner(embeddings, y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def main(
    iterations: int = 3000, seed: int = 0, batch_size: int = 128, m: int = 4, root: str | None = None
) -> dict[str, float]:
    """Train, then bench's test metrics on the evaluation characters (Lake's runs included)."""
    model = train_model(iterations, seed, batch_size, m, root)
    test = load("omniglot:evaluation", root)
    return evaluate(model, test, lake_runs=load_lake_runs(root), clustering=False, normalize=True)


if __name__ == "__main__":
    metrics = main(*(int(a) for a in sys.argv[1:3]))
    print(f"lake_accuracy {metrics['lake_accuracy']:.4f}  map_at_r {metrics['map_at_r']:.4f}")
