"""Training-step time of an ImageNet trunk (default ResNet-50, batch 32, 227x227) in fp32 and bf16 + channels-last.

The step is `bench.training.train`'s own (triplet loss, batch-hard
miner, Adam), on random RGB images, so it is what a Reality-Check-shaped
cell pays per iteration, loader excluded. Precisions alternate within
each repeat so a busy shared machine slows them alike; the table gives
the median wall time a step, the median CPU time a step (all threads: the
figure `dmlbench plan` can scale by cores) and the median over repeats of
each precision's speed-up on the fp32 run of the same repeat. One warm-up
step per precision keeps oneDNN's kernel creation out of the timings.

    .venv/bin/python benchmarks/bench_trunk_step.py [--trunk resnet50] [--batch 32] [--size 227]
        [--precision fp32 bf16] [--repeats 3] [--iterations 2] [--threads 1 2] [--device cpu]
        [--channels 3] [--import-torchvision] [--embed]

``--import-torchvision`` imports torchvision (through `bench.vision`)
before timing: run a Conv-4 step with and without it, alternating
processes, to see that importing torchvision beside the CPU torch wheel
leaves a step's time as it was.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from bench.data import LabeledData
from bench.training import TrainConfig, train


def step_times(
    data: LabeledData, trunk: str, batch: int, precision: str, iterations: int, device: str
) -> tuple[float, float]:
    """(wall ms, CPU ms) a step of ``iterations`` steps; channels-last follows the precision (on for bf16)."""
    config = TrainConfig(
        trunk=trunk,
        embedding_dim=128,
        loss="triplet",
        miner="batch_hard",
        P=batch // 4,
        K=4,
        iterations=iterations,
        seed=0,
        precision=precision,
        device=device,
    )
    cpu = time.process_time()
    wall = train(config, data).wall_time_s
    return wall / iterations * 1000, (time.process_time() - cpu) / iterations * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trunk", default="resnet50")
    parser.add_argument("--batch", type=int, default=32, help="P x 4 images a step")
    parser.add_argument("--size", type=int, default=227)
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=2, help="steps a timed run")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--channels", type=int, default=3, help="1 for grey images (Omniglot's Conv-4 step)")
    parser.add_argument("--import-torchvision", action="store_true", help="import torchvision before timing")
    parser.add_argument(
        "--embed",
        action="store_true",
        help="also time evaluation's embedding (no gradient, fp32, as bench.evaluation.embed)",
    )
    args = parser.parse_args()
    if args.import_torchvision:
        from bench.vision import torchvision

        torchvision()
    if args.batch % 4 or args.batch < 8:
        parser.error("--batch must be a multiple of 4, at least 8 (P classes x K=4)")
    g = torch.Generator().manual_seed(0)
    data = LabeledData(
        torch.rand(args.batch, args.channels, args.size, args.size, generator=g),
        torch.arange(args.batch // 4).repeat_interleave(4),
        "random",
    )
    first = args.precision[0]
    print(
        f"{args.trunk}, batch {args.batch}, {args.channels}x{args.size}x{args.size}, {args.device}, torchvision "
        f"{'' if 'torchvision' in sys.modules else 'not '}imported before timing; medians of {args.repeats} runs of "
        f"{args.iterations} steps"
    )
    print(f"{'threads':>7} {'precision':<9} {'wall ms/step':>12} {'CPU ms/step':>11} {'x ' + first:>8}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for precision in args.precision:  # warm-up
            step_times(data, args.trunk, args.batch, precision, 1, args.device)
        wall: dict[str, list[float]] = {p: [] for p in args.precision}
        cpu: dict[str, list[float]] = {p: [] for p in args.precision}
        for _ in range(args.repeats):
            for precision in args.precision:
                w, c = step_times(data, args.trunk, args.batch, precision, args.iterations, args.device)
                wall[precision].append(w)
                cpu[precision].append(c)
        for precision in args.precision:
            speedup = statistics.median(f / v for f, v in zip(wall[first], wall[precision]))
            print(
                f"{threads:>7} {precision:<9} {statistics.median(wall[precision]):>12.0f} "
                f"{statistics.median(cpu[precision]):>11.0f} {speedup:>7.2f}x",
                flush=True,
            )
        if args.embed:
            print(
                f"{threads:>7} embedding: {embed_ms(data, args.trunk, args.repeats, args.device):.1f} ms an image "
                "(median)",
                flush=True,
            )


def embed_ms(data: LabeledData, trunk: str, repeats: int, device: str) -> float:
    """Wall ms an image of `bench.evaluation.embed`, what evaluation and dataset-level miners pay."""
    from bench.evaluation import embed
    from bench.trunks import trunk_from

    model = trunk_from(trunk, tuple(data.x.shape[1:]), 128, {}).to(device)
    embed(model, data.x[:4], device=device)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        embed(model, data.x, device=device)
        times.append((time.perf_counter() - start) / len(data.x) * 1000)
    return statistics.median(times)


if __name__ == "__main__":
    main()
