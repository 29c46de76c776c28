"""Does the precision move the ranking? The same cells, seeds and budget trained in fp32 and in bf16 +
channels-last, scored on the Omniglot evaluation set; prints each cell's MAP@R in both, the rank orders and
Kendall's tau between them.

Fixed method parameters (each loss's defaults, no tuning) so that only the precision differs; a small
budget, as bf16 costs 10x fp32 on a CPU without AMX. On a CPU without AMX the bf16 arithmetic is oneDNN's
emulation, which rounds as AMX does (bf16 inputs, fp32 accumulation), so the numbers, not the speed, carry over.

    .venv/bin/python scripts/precision_ranking.py [--iterations 60] [--seeds 0 1] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.data import load
from bench.evaluation import evaluate
from bench.reports.budget import kendall_tau
from bench.training import TrainConfig, train

CELLS = {  # id: (loss, miner)
    "contrastive+none": ("contrastive", None),
    "triplet+batch_hard": ("triplet", "batch_hard"),
    "triplet+batch_all": ("triplet", "batch_all"),
    "infonce+none": ("infonce", None),
}
VARIANTS = {"fp32": ("fp32", False), "bf16+channels_last": ("bf16", True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--test-classes", type=int, default=200)
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    args = parser.parse_args()
    cells = {c: CELLS[c] for c in args.cells}
    torch.set_num_threads(args.threads)
    train_data = load("omniglot:background", None, 28)
    test = load("omniglot:evaluation", None, 28)
    test = test.subset(test.classes[: args.test_classes])
    scores: dict[str, dict[str, list[float]]] = {v: {c: [] for c in cells} for v in VARIANTS}
    for cell, (loss, miner) in cells.items():
        for seed in args.seeds:
            for variant, (precision, channels_last) in VARIANTS.items():  # A and B alternate
                config = TrainConfig(
                    trunk="conv4",
                    embedding_dim=64,
                    loss=loss,
                    miner=miner,
                    P=16,
                    K=4,
                    iterations=args.iterations,
                    seed=seed,
                    precision=precision,
                    channels_last=channels_last,
                )
                began = time.perf_counter()
                result = train(config, train_data)
                metrics = evaluate(result.model, test, clustering=False)
                scores[variant][cell].append(metrics["map_at_r"])
                print(
                    f"{cell:<24} seed {seed} {variant:<20} map_at_r {metrics['map_at_r']:.4f} "
                    f"({time.perf_counter() - began:.0f} s)",
                    flush=True,
                )
    means = {v: {c: statistics.mean(s) for c, s in cells.items()} for v, cells in scores.items()}
    order = {v: sorted(cells, key=lambda c: -means[v][c]) for v in VARIANTS}
    for v in VARIANTS:
        print(f"{v:<20} order: " + " > ".join(f"{c} {means[v][c]:.4f}" for c in order[v]))
    ranks = {v: {c: order[v].index(c) + 1 for c in cells} for v in VARIANTS}
    diff = max(abs(means["fp32"][c] - means["bf16+channels_last"][c]) for c in cells)
    tau = kendall_tau(ranks["fp32"], ranks["bf16+channels_last"])
    print(f"kendall tau {tau:.3f}; largest |fp32 - bf16| mean MAP@R {diff:.4f}")


if __name__ == "__main__":
    main()
