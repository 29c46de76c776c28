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

``--compare`` times instead, per pair input, the ranking that scores one triangle of the set (the
default while it fits `bench.metrics.query_gallery.MIRROR_ELEMENTS`) against scoring every pair, alternated
``--repeats`` times, and prints the medians and their ratio.

``--kernel`` times the same ranking with g scored by the compiled kernel (`bench.losses.pair_kernel`)
against the torch tiles (`LearnedMetric.tile`), alternated, and prints the medians, their ratio and
whether MAP@R agrees.

    .venv/bin/python benchmarks/bench_learned_ranking.py [--n 13180] [--dim 64] [--threads 1] [--compare | --kernel]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from bench.evaluation import ranked_by_metric
from bench.losses import pair_kernel
from bench.losses.learned_metric import LearnedMetric, PairScorer
from bench.metrics import query_gallery


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=13180)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=659)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--inputs", nargs="*", default=["difference_product", "concat"])
    parser.add_argument("--compare", action="store_true", help="one triangle against every pair, alternated")
    parser.add_argument("--kernel", action="store_true", help="the compiled kernel against the torch tiles")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.compare or args.kernel:
        compare(args)
        return
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


def compare(args: argparse.Namespace) -> None:
    """Median seconds of ranking N embeddings by g, alternated: one triangle against every pair (``--compare``),
    or the compiled kernel against the torch tiles (``--kernel``)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(args.n, args.dim)
    y = torch.arange(args.n) % args.classes
    triangle, fused = query_gallery.MIRROR_ELEMENTS, pair_kernel.scores
    if args.kernel:
        print(f"g by {pair_kernel.status()}", flush=True)
        names = {"kernel": (triangle, fused), "torch tiles": (triangle, lambda *a: None)}
    else:
        names = {"triangle": (triangle, fused), "every pair": (0, fused)}
    print(f"N={args.n} dim={args.dim} threads={args.threads}, {args.repeats} alternations", flush=True)
    for pair_input in args.inputs:
        metric = LearnedMetric(10, 3, pair_input)
        metric.materialize(args.dim)
        scorer = PairScorer(metric, normalize=True)
        took: dict[str, list[float]] = {name: [] for name in names}
        values: dict[str, float] = {}
        for _ in range(args.repeats):
            for name, (bound, scores) in names.items():
                query_gallery.MIRROR_ELEMENTS, pair_kernel.scores = bound, scores
                start = time.perf_counter()
                values[name] = ranked_by_metric(scorer, x, y, (1, 2, 4, 8))["map_at_r"]
                took[name].append(time.perf_counter() - start)
        query_gallery.MIRROR_ELEMENTS, pair_kernel.scores = triangle, fused
        (a_name, b_name), (a, b) = names, [statistics.median(took[n]) for n in names]
        first, second = values[a_name], values[b_name]
        agree = "equal" if first == second else f"{first:.6f} against {second:.6f}"
        print(
            f"{pair_input:19} {a_name} {a:6.1f} s  {b_name} {b:6.1f} s  ratio {a / b:.2f}  map_at_r {agree}",
            flush=True,
        )


if __name__ == "__main__":
    main()
