"""The k-NN's block size: `retrieval_metrics` of N embeddings timed at several ``KNN_BLOCK_ELEMENTS``.

Alternates the sizes ``--repeats`` times on the same unit-norm random embeddings (Omniglot's test-set shape by
default) and prints each size's rows a block, median seconds and MAP@R (equal at every size: the blocks change
the order of work, not the ranking).

    .venv/bin/python benchmarks/bench_knn_blocks.py [--n 13180] [--dim 64] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.metrics import retrieval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=13180)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=659)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[25, 23, 22, 21], help="powers of two")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(args.n, args.dim), dim=1)
    y = torch.arange(args.n) % args.classes
    took: dict[int, list[float]] = {p: [] for p in args.sizes}
    values: dict[int, float] = {}
    default = retrieval.KNN_BLOCK_ELEMENTS
    for _ in range(args.repeats):
        for p in args.sizes:
            retrieval.KNN_BLOCK_ELEMENTS = 1 << p
            start = time.perf_counter()
            values[p] = retrieval.retrieval_metrics(x, y, ks=(1, 2, 4, 8))["map_at_r"]
            took[p].append(time.perf_counter() - start)
    retrieval.KNN_BLOCK_ELEMENTS = default
    print(
        f"N={args.n} dim={args.dim} threads={args.threads}, {args.repeats} alternations; default 2^{default.bit_length() - 1}"
    )
    for p in args.sizes:
        rows = max(1, (1 << p) // args.n)
        print(f"2^{p:<3} {rows:6} rows a block  {statistics.median(took[p]):6.3f} s  map_at_r {values[p]:.6f}")


if __name__ == "__main__":
    main()
