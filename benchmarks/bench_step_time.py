"""Training-step and embedding time of Conv-4 on one device, to size protocols (`dmlbench plan` assumes CPU times).

Times `bench.training.train` (triplet + batch-hard, 28x28 Omniglot) for a
short and a long run after a warm-up run, and reports the difference per
step, so start-up (CUDA initialisation, data transfer) drops out; then
embeds the 13,180 evaluation images twice.

    .venv/bin/python benchmarks/bench_step_time.py [--device cuda] [--iterations 500] [--precision bf16] [--threads 1]

``--precision`` is the protocol's ``training.precision`` (channels-last
follows its default: on for bf16 and fp16); embedding stays fp32.

``--compare N`` instead times the training loop against the plain loop it
replaces (each step's PK indices copied to the device on their own, the
default optimiser rather than the fused one), N runs of each alternated
A/B, and prints the medians and their ratio (loop / plain; at most 1.0 is
no slower):

    .venv/bin/python benchmarks/bench_step_time.py --compare 7 --iterations 200 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from bench import training
from bench.cell import build
from bench.data import load
from bench.evaluation import embed
from bench.registry import build_trunk
from bench.training import TrainConfig, train


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextmanager
def _plain_loop() -> Iterator[None]:
    """`train` as a plain loop: each step's indices copied alone (`PKSampler.iterate`), the default optimiser."""
    # the loop's two departures from a plain loop: its batch source (training._batches) and the fused
    # optimiser choice (bench.cell.build._fused, looked up there when `train` builds the optimiser)
    batches, fused = training._batches, build._fused

    def plain(x: Any, labels: torch.Tensor, config: TrainConfig, device: torch.device, start: int = 0) -> Any:
        if not isinstance(x, torch.Tensor):
            return batches(x, labels, config, device, start)
        sampler = training._pk_sampler(labels, config)
        return ((x[idx], idx) for idx in (i.to(device) for i in sampler.iterate(start)))

    training._batches, build._fused = plain, lambda groups: False  # type: ignore[assignment]
    try:
        yield
    finally:
        training._batches, build._fused = batches, fused  # type: ignore[assignment]


def compare(args: argparse.Namespace, background: Any) -> None:
    """The loop against the plain loop, alternated A/B, medians and their ratio."""
    config = dict(
        trunk="conv4",
        embedding_dim=64,
        loss="triplet",
        loss_params={"margin": 0.2},
        miner="batch_hard",
        P=32,
        K=4,
        iterations=args.iterations,
        seed=0,
        device=args.device,
        precision=args.precision,
    )
    train(TrainConfig(**{**config, "iterations": 10}), background)  # first-call costs out of the timings
    times: dict[str, list[float]] = {"plain": [], "loop": []}
    for _ in range(args.compare):
        for name in ("plain", "loop"):
            with _plain_loop() if name == "plain" else nullcontext():
                start = time.perf_counter()
                train(TrainConfig(**config), background)
                _sync(args.device)
                times[name].append(time.perf_counter() - start)
    plain, loop = (statistics.median(times[k]) * 1000 / args.iterations for k in ("plain", "loop"))
    print(
        f"{args.device} {args.precision}: Conv-4 28x28, batch 128, {args.iterations} iterations, median of "
        f"{args.compare} alternated: plain loop {plain:.2f} ms a step, the loop {loop:.2f} ms; "
        f"ratio {loop / plain:.3f}"
    )


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
    parser.add_argument("--compare", type=int, default=0, metavar="N", help="A/B against the plain loop, N runs each")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    background = load("omniglot:background", args.data_root, 28)
    if args.compare:
        compare(args, background)
        return
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
