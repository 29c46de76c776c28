"""Mining speed: triplet loss + miner, forward and backward, own vs PML in the same run.

A PK batch (default B=512, K=4, dim 128, float32) through mining, the loss
and its backward pass; own and PML alternate within each repeat so that
machine load hits both alike, and the medians are compared. Both must give
the same value (checked before timing).

    .venv/bin/python benchmarks/bench_triplet_mining.py [--batch 512 --k 4 --dim 128 --repeats 15 --threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch


def setups(margin: float) -> dict[str, tuple[Callable, Callable]]:
    """name -> (own step, PML step); each step maps (embeddings, labels) to a 0-d loss."""
    from pytorch_metric_learning import losses, miners

    from bench.registry import build_loss, build_miner

    own_loss, pml_loss = build_loss("triplet", margin=margin), losses.TripletMarginLoss(margin=margin)

    def pair(own_miner, pml_miner):
        return (lambda x, y: own_loss(x, y, own_miner(x, y)), lambda x, y: pml_loss(x, y, pml_miner(x, y)))

    return {
        "batch_all": pair(
            build_miner("batch_all", margin=margin),
            miners.TripletMarginMiner(margin=float("inf"), type_of_triplets="all"),
        ),
        "semihard": pair(
            build_miner("semihard", margin=margin),
            miners.TripletMarginMiner(margin=margin, type_of_triplets="semihard"),
        ),
        "hard": pair(build_miner("hard"), miners.TripletMarginMiner(margin=margin, type_of_triplets="hard")),
        "batch_hard": pair(build_miner("batch_hard"), miners.BatchHardMiner()),
    }


def timed(step: Callable, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    e = x.detach().clone().requires_grad_(True)
    start = time.perf_counter()
    value = step(e, y)
    value.backward()
    return time.perf_counter() - start, float(value.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--margin", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, args.dim, generator=g)
    y = torch.arange(args.batch // args.k).repeat_interleave(args.k)

    print(
        f"B={args.batch} K={args.k} dim={args.dim} margin={args.margin} threads={args.threads} "
        f"repeats={args.repeats}, forward+backward with mining, median ms"
    )
    print(f"{'miner':<11} {'own ms':>9} {'PML ms':>9} {'PML/own':>8}  values equal")
    for name, (own, pml) in setups(args.margin).items():
        own_v, pml_v = timed(own, x, y)[1], timed(pml, x, y)[1]  # warm-up and value check
        same = abs(own_v - pml_v) <= 1e-5 * max(abs(own_v), abs(pml_v), 1e-12)
        own_t, pml_t = [], []
        for _ in range(args.repeats):
            own_t.append(timed(own, x, y)[0])
            pml_t.append(timed(pml, x, y)[0])
        o, p = statistics.median(own_t) * 1e3, statistics.median(pml_t) * 1e3
        print(f"{name:<11} {o:9.2f} {p:9.2f} {p / o:7.1f}x  {same} ({own_v:.6g} vs {pml_v:.6g})")


if __name__ == "__main__":
    main()
