"""Harness overhead: `bench.training.train` against a bare PyTorch loop doing the same work.

The goal is at most 1.05x: the harness may add sampling, seeding, the loss
buffer and divergence checks, but no per-step syncs or I/O. Both loops use
the same trunk, loss, miner, optimiser, batch indices and thread count; the
bare loop gets its batches precomputed, so PK sampling counts as overhead.
Runs alternate in ABBA order (bare, harness, harness, bare, ...: on this
shared machine the second run of a pair was 5-10% slower whichever it
was, which had put the MLP at 1.13x); the verdict is on the ratio of
the medians, and the ratio of the best runs is printed beside it (on a
noisy shared CPU the two can differ by a few percent: quote both).

    .venv/bin/python benchmarks/bench_overhead.py [--iterations 100] [--repeats 4]

Exits 1 when a gated configuration exceeds the goal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from bench import registry
from bench.data import load
from bench.data.samplers import PKSampler
from bench.training import TrainConfig, train

GOAL = 1.05
CONFIGS = {  # name: (config changes, gated)
    "conv4 triplet+batch_hard 32x4": (dict(trunk="conv4"), True),
    "mlp triplet+batch_hard 32x4 (worst case: tiny steps)": (dict(trunk="mlp"), False),
}


def bare_loop(config: TrainConfig, x: torch.Tensor, y: torch.Tensor, batches: list[torch.Tensor]) -> float:
    """What a user would write by hand: no buffer, no checks, no callbacks."""
    start = time.perf_counter()  # as train() is timed here: building included
    torch.manual_seed(config.seed)
    model = registry.build_trunk(config.trunk, in_shape=tuple(x.shape[1:]), embedding_dim=config.embedding_dim)
    loss_fn = registry.build_loss(config.loss, **config.loss_params)
    miner = registry.build_miner(config.miner, **config.miner_params)
    opt = torch.optim.Adam(list(model.parameters()) + list(loss_fn.parameters()), lr=config.lr)
    model.train()
    for idx in batches:
        emb = model(x[idx])
        loss = loss_fn(emb, y[idx], miner(emb, y[idx]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - start


def harness(config: TrainConfig, data) -> float:
    start = time.perf_counter()
    train(config, data)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    background = load("omniglot:background")
    data = background.subset(background.classes[:200])
    _, y = torch.unique(data.y, return_inverse=True)
    failed = False
    print(
        f"{'configuration':<54} {'bare s':>8} {'harness s':>10} {'ratio':>6} {'best-of':>8}  (medians of {args.repeats})"
    )
    for name, (changes, gated) in CONFIGS.items():
        config = TrainConfig(
            loss="triplet",
            loss_params={"margin": 0.2},
            miner="batch_hard",
            P=32,
            K=4,
            iterations=args.iterations,
            seed=0,
            **changes,
        )
        sampler = iter(PKSampler(y, config.P, config.K, config.seed))
        batches = [torch.as_tensor(next(sampler), dtype=torch.long) for _ in range(args.iterations)]
        bare, ours = [], []
        harness(TrainConfig(**{**config.to_dict(), "iterations": 5}), data)  # warm-up: allocator, kernels
        for i in range(args.repeats):  # ABBA order: the second run of a pair is measurably slower here
            first, second = (bare, ours) if i % 2 == 0 else (ours, bare)
            for times in (first, second):
                times.append(bare_loop(config, data.x, y, batches) if times is bare else harness(config, data))
        bare_s, ours_s = statistics.median(bare), statistics.median(ours)
        ratio = ours_s / bare_s
        verdict = "" if ratio <= GOAL else (" over the goal" if gated else " (not gated)")
        failed |= gated and ratio > GOAL
        print(f"{name:<54} {bare_s:>8.2f} {ours_s:>10.2f} {ratio:>6.3f} {min(ours) / min(bare):>8.3f}{verdict}")
    print(f"goal: harness <= {GOAL}x the bare loop")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
