"""MargOHNM + quadruplet loss, forward and backward: violating quadruplets summed unlisted vs listed, one run.

The listed path is the previous one: the miner enumerates every violating
quadruplet (about 5.7 M at 32 x 4 before training has sorted anything) and
the loss gathers their distances. The unlisted path is what training runs
now: the miner, bound to the quadruplet loss, returns its margins and the
count, and the loss sums every quadruplet's terms in closed form. Both are
timed on the same batches, alternating A and B within each repeat, with
medians; their values are printed side by side (equal up to float rounding).
A batch of random unit vectors is the early-training case, where nearly
every quadruplet violates; ``--spread`` pulls each class together, the
later case with fewer.

    .venv/bin/python benchmarks/bench_margohnm.py [--batches 64 128 --k 4 --dim 64 --repeats 7 --threads 1]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from bench_triplet_mining import timed  # the script's own folder is on sys.path

from bench.losses.quadruplet import QuadrupletLoss
from bench.miners.margohnm import MargOHNMMiner


def steps(learned: bool) -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """name -> step mapping (embeddings, labels) to the loss; the unlisted miner is bound, the listed not."""
    loss = QuadrupletLoss(learned_metric=learned)
    unlisted, listed = MargOHNMMiner(warmup_iterations=0), MargOHNMMiner(warmup_iterations=0)
    unlisted.bind_loss(loss)
    listed.bind_loss(_MetricOnly(loss))
    return {"unlisted": lambda x, y: loss(x, y, unlisted(x, y)), "listed": lambda x, y: loss(x, y, listed(x, y))}


class _MetricOnly:
    """The loss's metric without its closed-form sum: the miner then lists every violating quadruplet."""

    def __init__(self, loss: QuadrupletLoss) -> None:
        self.distance_matrix = loss.distance_matrix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument(
        "--spread",
        type=float,
        default=None,
        help="samples of a class around a class centre with this noise (default: all random)",
    )
    parser.add_argument("--learned-metric", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(
        f"K={args.k} dim={args.dim} learned_metric={args.learned_metric} spread={args.spread} "
        f"threads={args.threads} repeats={args.repeats}: forward+backward with mining, median ms"
    )
    print(f"{'batch':>5} {'unlisted ms':>12} {'listed ms':>10} {'ratio':>7}  values")
    for batch in args.batches:
        y = torch.arange(batch // args.k).repeat_interleave(args.k)
        x = torch.randn(batch, args.dim, generator=g)
        if args.spread is not None:
            x = torch.randn(batch // args.k, args.dim, generator=g)[y] + args.spread * x
        x = torch.nn.functional.normalize(x, dim=1)
        a, b = steps(args.learned_metric).values()
        va, vb = timed(a, x, y)[1], timed(b, x, y)[1]  # warm-up and values
        ta, tb = [], []
        for _ in range(args.repeats):
            ta.append(timed(a, x, y)[0])
            tb.append(timed(b, x, y)[0])
        ma, mb = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
        print(f"{batch:5d} {ma:12.1f} {mb:10.1f} {mb / ma:6.1f}x  {va:.7g} vs {vb:.7g}")


if __name__ == "__main__":
    main()
