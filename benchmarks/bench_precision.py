"""Training-step time of Conv-4 at 28x28 in fp32, bf16 and bf16 + channels-last, through `bench.training.train`.

Each variant runs a short training (triplet + batch-hard, real Omniglot)
whose loop time (``TrainResult.wall_time_s``, building excluded) gives the
time a step. Variants alternate within each repeat (fp32, bf16, bf16+CL,
fp32+CL, fp32, ...) so a busy shared machine slows them alike; the table
shows the median time a step and the median over repeats of each
variant's speed-up on the fp32 run of the same repeat (same batch and
thread count): runs seconds apart share the machine's load, which on a
shared CPU moves by 2x within a minute. A warm-up run per variant keeps kernel creation (oneDNN's
bf16 primitives) out of the timings.

    .venv/bin/python benchmarks/bench_precision.py [--iterations 8] [--repeats 7] [--threads 1 2] [--batches 64 128]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench.data import load
from bench.training import TrainConfig, train

VARIANTS = {  # name: (precision, channels_last)
    "fp32": ("fp32", False),
    "bf16": ("bf16", False),
    "bf16+channels_last": ("bf16", True),
    "fp32+channels_last": ("fp32", True),
}


def step_ms(data, batch: int, precision: str, channels_last: bool, iterations: int, device: str) -> float:
    config = TrainConfig(
        trunk="conv4",
        embedding_dim=64,
        loss="triplet",
        loss_params={"margin": 0.2},
        miner="batch_hard",
        P=batch // 4,
        K=4,
        iterations=iterations,
        seed=0,
        precision=precision,
        channels_last=channels_last,
        device=device,
    )
    return train(config, data).wall_time_s / iterations * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    data = load("omniglot:background", None, 28)
    print(f"{'threads':>7} {'batch':>5} {'variant':<20} {'ms/step':>8} {'x fp32':>7}  (medians of {args.repeats})")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batches:
            for precision, channels_last in VARIANTS.values():  # warm-up
                step_ms(data, batch, precision, channels_last, 3, args.device)
            times: dict[str, list[float]] = {name: [] for name in VARIANTS}
            for _ in range(args.repeats):
                for name, (precision, channels_last) in VARIANTS.items():
                    times[name].append(step_ms(data, batch, precision, channels_last, args.iterations, args.device))
            for name, values in times.items():
                speedup = statistics.median(f / v for f, v in zip(times["fp32"], values))
                print(
                    f"{threads:>7} {batch:>5} {name:<20} {statistics.median(values):>8.1f} {speedup:>6.2f}x", flush=True
                )


if __name__ == "__main__":
    main()
