"""Evaluation's embedding on the CPU: `bench.evaluation.embed` against the model run plainly over the set.

The plain side is what evaluation did before: the model as it comes, batches
of 512 in PyTorch's default memory order. `embed` now runs a model of 2-d
convolutions in channels-last order, in batches of about 2^16 input values
(`bench.evaluation.CPU_EVAL_INPUT_VALUES`), with each BatchNorm that follows
a convolution folded into it and each ReLU run after the max-pool that
follows it (on a copy), putting the model back as it was. Both sides use
the same trunk (random weights: the time does not
depend on them), the same images and one thread; runs alternate (plain,
embed, embed, plain, ...) and the ratio is of the medians. The largest
difference between the two sides' embeddings is printed too.

    .venv/bin/python benchmarks/bench_embed.py [--images 13180] [--repeats 5] [--channels-last-model]

``--channels-last-model`` starts from a model already in channels-last order
(what training in ``fp32 + channels-last`` leaves), so that only the batch
size differs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from bench.evaluation import embed
from bench.registry import build_trunk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=13_180, help="images embedded (Omniglot's test set: 13,180)")
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--trunk", default="conv4")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--channels-last-model", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.rand(args.images, 1, args.size, args.size)
    model = build_trunk(args.trunk, in_shape=(1, args.size, args.size), embedding_dim=64).eval()
    if args.channels_last_model:
        model.to(memory_format=torch.channels_last)

    def plain() -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([model(x[i : i + 512]) for i in range(0, len(x), 512)])

    def harness() -> torch.Tensor:
        return embed(model, x)

    print(f"cpu: {platform.processor() or platform.machine()}; load before: {os.getloadavg()[0]:.1f}")
    difference = (plain() - harness()).abs().max().item()
    times: dict[str, list[float]] = {"plain": [], "embed": []}
    for i in range(args.repeats):
        order = [("plain", plain), ("embed", harness)]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    a, b = statistics.median(times["plain"]), statistics.median(times["embed"])
    print(
        f"{args.trunk} {args.images} images {args.size}x{args.size}, one thread"
        f"{', channels-last model' if args.channels_last_model else ''}: plain (batches of 512) {a:.2f} s, "
        f"embed {b:.2f} s (medians of {args.repeats}): {a / b:.2f}x faster; largest difference {difference:.2e}; "
        f"load after {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
