"""What a learning-rate schedule costs a training run: `train` with a cosine schedule (and warm-up)
against the same run at a constant LR, in one process.

A schedule sets every parameter group's LR once a step (`bench.training.lr_factor`): a few float
operations, which must not show beside a step. Runs alternate in ABBA order and the ratio of the
medians is the verdict (the MLP's tiny steps are the worst case: its step is ~3 ms).

    .venv/bin/python benchmarks/bench_schedule.py [--iterations 200] [--repeats 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.data import load
from bench.training import TrainConfig, train

SCHEDULES = {"constant": {"type": "constant"}, "cosine": {"type": "cosine", "warmup": 20}}


def timed(config: TrainConfig, data: object) -> float:
    start = time.perf_counter()
    train(config, data)  # type: ignore[arg-type]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = load("omniglot:background", args.data_root, 28)
    for trunk in ("conv4", "mlp"):
        times: dict[str, list[float]] = {name: [] for name in SCHEDULES}
        for r in range(args.repeats):
            order = list(SCHEDULES) if r % 2 == 0 else list(reversed(SCHEDULES))  # ABBA
            for name in order:
                config = TrainConfig(
                    trunk=trunk,
                    embedding_dim=64,
                    loss="triplet",
                    miner="batch_hard",
                    P=32,
                    K=4,
                    iterations=args.iterations,
                    seed=0,
                    precision="bf16" if trunk == "conv4" else "fp32",
                    schedule=SCHEDULES[name],
                )
                times[name].append(timed(config, data))
        base, sched = statistics.median(times["constant"]), statistics.median(times["cosine"])
        print(
            f"{trunk}: constant {base:.2f} s, cosine + warm-up {sched:.2f} s for {args.iterations} iterations "
            f"(medians of {args.repeats}): {sched / base:.3f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
