"""Training-step and embedding time of Conv-4 on one device, to size protocols (`dmlbench plan` assumes CPU times).

Times `bench.training.train` (triplet + batch-hard, 28x28 Omniglot) for a
short and a long run after a warm-up run, and reports the difference per
step, so start-up (CUDA initialisation, data transfer) drops out; then
embeds the 13,180 evaluation images twice.

    .venv/bin/python benchmarks/bench_step_time.py [--device cuda] [--iterations 500] [--precision bf16] [--threads 1]

``--precision`` is the protocol's ``training.precision`` (channels-last
follows its default: on for bf16 and fp16); embedding stays fp32.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.data import load
from bench.evaluation import embed
from bench.registry import build_trunk
from bench.training import TrainConfig, train


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's); "
        "1 on a busy machine, where more threads than free cores stall every step",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    background = load("omniglot:background", args.data_root, 28)
    evaluation = load("omniglot:evaluation", args.data_root, 28)
    warm = TrainConfig(
        trunk="conv4",
        embedding_dim=64,
        loss="triplet",
        miner="batch_hard",
        P=8,
        K=4,
        iterations=10,
        device=args.device,
        precision=args.precision,
    )
    train(warm, background)  # CUDA context, kernels, allocator: first-call costs out of the timings
    for P, K in ((32, 4), (16, 4)):
        seconds = []
        for iterations in (50, 50 + args.iterations):
            config = TrainConfig(
                trunk="conv4",
                embedding_dim=64,
                loss="triplet",
                loss_params={"margin": 0.2},
                miner="batch_hard",
                P=P,
                K=K,
                iterations=iterations,
                seed=0,
                device=args.device,
                precision=args.precision,
            )
            start = time.perf_counter()
            train(config, background)
            _sync(args.device)
            seconds.append(time.perf_counter() - start)
        per_step = (seconds[1] - seconds[0]) / args.iterations * 1000
        print(
            f"{args.device} {args.precision}: Conv-4 28x28, batch {P * K}: {per_step:.1f} ms a step "
            f"({seconds[1]:.2f} s for {50 + args.iterations} iterations)"
        )
    model = build_trunk("conv4", in_shape=(1, 28, 28), embedding_dim=64).to(args.device)
    for _ in range(2):
        start = time.perf_counter()
        embed(model, evaluation.x, device=args.device)
        _sync(args.device)
        print(
            f"{args.device}: embedding the {len(evaluation.x):,} evaluation images: {time.perf_counter() - start:.2f} s"
        )


if __name__ == "__main__":
    main()
