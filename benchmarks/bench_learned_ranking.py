"""Ranking a test set by a learned metric g: time and peak memory of the chunked scoring.

Scores N random embeddings against each other by a fresh `LearnedMetric`
(both pair inputs) through `bench.evaluation.ranked_by_metric`, the path a
learned-metric cell's test score takes, and prints the process's peak
resident memory above its baseline (imports and data) beside what the whole
N x N matrix of g would take (float32, the values alone; the network's
hidden activations are `cost` x that). Peak RSS is a high-water mark, so
run one input per process to read it; it includes the allocator's first
growth (about 140 MB for the Euclidean ranking alone at N = 2,000) and
should not grow with N. Omniglot's test set is N = 13,180; SOP's 60,502.

    .venv/bin/python benchmarks/bench_learned_ranking.py [--n 13180] [--dim 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from bench.evaluation import ranked_by_metric
from bench.losses.learned_metric import LearnedMetric, PairScorer


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=13180)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=659)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--inputs", nargs="*", default=["difference_product", "concat"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(args.n, args.dim)
    y = torch.arange(args.n) % args.classes
    full_mb = args.n * args.n * 4 / 2**20
    print(f"N={args.n} dim={args.dim} threads={args.threads}: the full g matrix alone would be {full_mb:.0f} MB")
    for pair_input in args.inputs:
        metric = LearnedMetric(10, 3, pair_input)
        metric.materialize(args.dim)
        scorer = PairScorer(metric, normalize=True)
        before = peak_rss_mb()
        start = time.perf_counter()
        out = ranked_by_metric(scorer, x, y, (1, 2, 4, 8))
        took = time.perf_counter() - start
        added = peak_rss_mb() - before
        print(
            f"{pair_input:19} {took:7.1f} s  peak RSS +{added:6.0f} MB  (full matrix x cost {scorer.cost(args.dim)}: "
            f"{full_mb * scorer.cost(args.dim):,.0f} MB)  map_at_r {out['map_at_r']:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
