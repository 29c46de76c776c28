"""Why does the learned-metric quadruplet cell score so low? Rank by the learned metric g itself.

Trains Conv-4 with the quadruplet loss and MargOHNM, Euclidean and with
Chen et al.'s learned metric (3x10, and wider), on Omniglot background
classes, then scores MAP@R on evaluation classes two ways: Euclidean on the
trunk's embeddings (what the protocols report) and ranking every pair by g
(what the learned metric is meant for). Also scores both on training
classes the runs saw. `bench.metrics` ranks embeddings by a distance, and g
is no distance over embeddings, so MAP@R is computed here from the (N, N)
matrix of g directly (N is small).

    .venv/bin/python scripts/probe_learned_metric.py [--iterations 400] [--train-classes 100]
        [--runs "learned 3x10 + margohnm"] [--trace 25]

``--trace N`` prints MargOHNM's batch statistics every N mining calls
(``mu_p``, ``mu_n``: mean ``G`` over positive / negative pairs; the margins;
how many quadruplets violate; their mean loss), which shows whether the
loss falls by ordering pairs or by shrinking the metric's whole scale.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from bench.data import load
from bench.evaluation import embed
from bench.metrics import retrieval_metrics
from bench.miners.margohnm import MargOHNMMiner
from bench.training import TrainConfig, train

RUNS = {  # name: (loss params, miner)
    "euclidean quadruplet + margohnm": ({}, "margohnm"),
    "learned 3x10 + margohnm": ({"learned_metric": True}, "margohnm"),
    "learned 3x64 + margohnm": ({"learned_metric": True, "metric_hidden": 64}, "margohnm"),
    "learned 3x10, no miner": ({"learned_metric": True}, None),
}


def map_at_r_from_matrix(dist: torch.Tensor, labels: torch.Tensor) -> float:
    """MAP@R (Musgrave et al. 2020) of ranking row i's other items by ``dist[i]``, smallest first."""
    dist = dist.clone().fill_diagonal_(math.inf)
    same = labels[dist.argsort(dim=1)] == labels[:, None]
    r = (labels[:, None] == labels[None, :]).sum(1) - 1
    scores = []
    for i in range(len(labels)):
        rel = same[i, : int(r[i])].float()
        precision = rel.cumsum(0) / torch.arange(1, len(rel) + 1)
        scores.append(float((precision * rel).sum() / len(rel)))
    return sum(scores) / len(scores)


def scores(result, data) -> tuple[float, float]:
    emb = embed(result.model, data.x)
    loss = result.loss_module
    emb_n = F.normalize(emb, dim=1) if loss.normalize else emb
    euclidean = retrieval_metrics(emb_n, data.y)["map_at_r"]
    if getattr(loss, "metric", None) is None:
        return euclidean, math.nan
    with torch.no_grad():
        return euclidean, map_at_r_from_matrix(loss.metric.matrix(emb_n), data.y)


def trace_margohnm(every: int) -> None:
    """Print MargOHNM's stats every ``every`` calls (a probe: wraps the class's ``mine`` in place)."""
    mine = MargOHNMMiner.mine

    def traced(self: MargOHNMMiner, embeddings: torch.Tensor, labels: torch.Tensor):
        out = mine(self, embeddings, labels)
        if self._calls % every == 0:
            s = self.stats
            print(
                f"  call {self._calls:4d} warmup={int(s['warmup'])} mu_p={s.get('mu_p', math.nan):.3f} "
                f"mu_n={s.get('mu_n', math.nan):.3f} alpha1={s['alpha1']:.3f} alpha2={s['alpha2']:.3f} "
                f"violating={int(s['num_violating'])} mean_loss={s['mean_loss']:.4f}",
                flush=True,
            )
        return out

    MargOHNMMiner.mine = traced  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--train-classes", type=int, default=100)
    parser.add_argument("--test-classes", type=int, default=40)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--trace", type=int, default=0, help="print MargOHNM's stats every N calls")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.trace:
        trace_margohnm(args.trace)
    background = load("omniglot:background", args.data_root, 28)
    evaluation = load("omniglot:evaluation", args.data_root, 28)
    train_data = background.subset(background.classes[: args.train_classes])
    seen = background.subset(background.classes[: args.test_classes])
    test = evaluation.subset(evaluation.classes[: args.test_classes])
    print(f"{'run':34} {'test: Euclidean':>16} {'test: g':>8} {'seen: Euclidean':>16} {'seen: g':>8}")
    for name in args.runs:
        loss_params, miner = RUNS[name]
        config = TrainConfig(
            trunk="conv4",
            embedding_dim=64,
            loss="quadruplet",
            loss_params=loss_params,
            miner=miner,
            P=16,
            K=4,
            iterations=args.iterations,
            seed=0,
        )
        result = train(config, train_data)
        (te, tg), (se, sg) = scores(result, test), scores(result, seen)
        print(f"{name:34} {te:16.3f} {tg:8.3f} {se:16.3f} {sg:8.3f}", flush=True)


if __name__ == "__main__":
    main()
