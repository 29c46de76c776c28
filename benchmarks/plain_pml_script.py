"""A plain pytorch-metric-learning script, as a user would write it: the anchor the harness's tuned cell must reach.

Conv-4 on Omniglot's background characters at 28x28, a PML loss (and miner)
with PML's defaults (by default TripletMarginLoss and BatchHardMiner; the
others of `PLAIN`: each harness method that has a counterpart in PML),
MPerClassSampler batches (4 drawings a character), Adam 1e-3, fp32, no
augmentation, no schedule. Only the data and the scoring come from bench
(its loaders, Lake's runs, `evaluate` in the L2-normalised geometry every
one of these PML defaults trains in: LpDistance, CosineSimilarity and
DotProductSimilarity all normalise), so that `compare_plain_pml.py`
compares training procedures and nothing else.

    .venv/bin/python benchmarks/plain_pml_script.py [ITERATIONS [SEED [LOSS+MINER]]]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from pytorch_metric_learning import losses, miners, samplers
from torch import nn

from bench.data import load, load_lake_runs
from bench.errors import BenchError
from bench.evaluation import evaluate

Method = tuple[str, str | None]  # a harness cell's (loss, miner) names; None: no miner
DEFAULT: Method = ("triplet", "batch_hard")


def _triplets(kind: str) -> Callable[[], tuple[Any, Any]]:
    return lambda: (losses.TripletMarginLoss(), miners.TripletMarginMiner(type_of_triplets=kind))


# A harness method -> what its PML counterpart is called and built as, at PML's defaults (a user's first
# script from PML's docs: no argument given). The counterparts are those bench/crosscheck proves equal in
# value; PML's triplet loss with no miner takes every triplet of the batch, which is batch-all.
PLAIN: dict[Method, tuple[str, Callable[[], tuple[Any, Any]]]] = {
    ("triplet", "batch_hard"): (
        "TripletMarginLoss() + BatchHardMiner()",
        lambda: (losses.TripletMarginLoss(), miners.BatchHardMiner()),
    ),
    ("triplet", "batch_all"): ("TripletMarginLoss() on every triplet", lambda: (losses.TripletMarginLoss(), None)),
    ("triplet", "semihard"): (
        "TripletMarginLoss() + TripletMarginMiner(type_of_triplets='semihard')",
        _triplets("semihard"),
    ),
    ("triplet", "hard"): ("TripletMarginLoss() + TripletMarginMiner(type_of_triplets='hard')", _triplets("hard")),
    ("contrastive", None): ("ContrastiveLoss()", lambda: (losses.ContrastiveLoss(), None)),
    ("lifted_structure", None): ("LiftedStructureLoss()", lambda: (losses.LiftedStructureLoss(), None)),
    ("npair", None): ("NPairsLoss()", lambda: (losses.NPairsLoss(), None)),
    ("infonce", None): ("NTXentLoss()", lambda: (losses.NTXentLoss(), None)),
    ("pml:multi_similarity", "pml:multi_similarity"): (
        "MultiSimilarityLoss() + MultiSimilarityMiner()",
        lambda: (losses.MultiSimilarityLoss(), miners.MultiSimilarityMiner()),
    ),
}


def parse_method(text: str) -> Method:
    """``LOSS+MINER`` (``none``: no miner) as a key of `PLAIN`, or one line naming those there are."""
    loss, _, miner = text.partition("+")
    method = (loss, None if miner in ("", "none") else miner)
    if method not in PLAIN:
        raise BenchError(f"no plain PML counterpart of {text!r}; there are: {', '.join(map(method_name, PLAIN))}")
    return method


def method_name(method: Method) -> str:
    """The method as ``LOSS+MINER``, as `parse_method` reads it."""
    return f"{method[0]}+{method[1] or 'none'}"


def conv4(embedding_dim: int = 64) -> nn.Module:
    """Four conv-BN-ReLU-pool blocks (28x28 -> 64 x 1 x 1), then a linear layer, as bench's trunk."""
    blocks = [
        [nn.Conv2d(1 if i == 0 else 64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2)]
        for i in range(4)
    ]
    return nn.Sequential(*sum(blocks, []), nn.Flatten(), nn.Linear(64, embedding_dim))


def train_model(
    iterations: int = 3000,
    seed: int = 0,
    batch_size: int = 128,
    m: int = 4,
    root: str | None = None,
    method: Method = DEFAULT,
) -> nn.Module:
    """``iterations`` Adam steps of ``method``'s PML loss and miner on batches of ``batch_size`` (``m`` drawings
    a character)."""
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
    loss_fn, miner = PLAIN[method][1]()
    model.train()
    for x, y in loader:
        embeddings = model(x)
        loss = loss_fn(embeddings, y, None if miner is None else miner(embeddings, y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def main(
    iterations: int = 3000,
    seed: int = 0,
    batch_size: int = 128,
    m: int = 4,
    root: str | None = None,
    method: Method = DEFAULT,
) -> dict[str, float]:
    """Train, then bench's test metrics on the evaluation characters (Lake's runs included)."""
    model = train_model(iterations, seed, batch_size, m, root, method)
    test = load("omniglot:evaluation", root)
    return evaluate(model, test, lake_runs=load_lake_runs(root), clustering=False, normalize=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("iterations", nargs="?", type=int, default=3000, help="training iterations (default 3000)")
    parser.add_argument("seed", nargs="?", type=int, default=0, help="torch, numpy and sampler seed (default 0)")
    parser.add_argument(
        "method", nargs="?", default=None, metavar="LOSS+MINER", help=f"one of: {', '.join(map(method_name, PLAIN))}"
    )
    args = parser.parse_args()
    try:
        chosen = parse_method(args.method) if args.method else DEFAULT
    except BenchError as error:  # one line and the CLI's exit code (2), no traceback
        parser.exit(error.exit_code, f"plain_pml_script: error: {error}\n")
    metrics = main(args.iterations, args.seed, method=chosen)
    print(f"lake_accuracy {metrics['lake_accuracy']:.4f}  map_at_r {metrics['map_at_r']:.4f}")
