"""PK sampling time a batch: the vectorised `PKSampler` against the loop it replaced.

The loop (kept here as the reference, it was `bench.data.samplers` before the
change) made one generator a step and drew each of the P classes' K samples
with its own ``randperm``; the new sampler draws ``CHUNK`` steps at once.
Both are timed on the same labels, alternating (loop, vectorised, loop, ...)
over a run of steps each, and the table gives medians and their ratio.

    .venv/bin/python benchmarks/bench_sampler.py [--steps 640] [--repeats 5]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import torch

from bench.data import load
from bench.data.samplers import PKSampler


class LoopPKSampler:
    """The previous sampler: a generator seeded by (seed, step), a Python loop over the P classes."""

    def __init__(self, labels: torch.Tensor, P: int, K: int, seed: int = 0):
        self.P, self.K, self.seed = P, K, seed
        _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
        self.members = list(torch.split(torch.argsort(inverse, stable=True), counts.tolist()))

    def batch(self, step: int) -> torch.Tensor:
        digest = hashlib.sha256(f"pk:{self.seed}:{step}".encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        parts = []
        for c in torch.randperm(len(self.members), generator=g)[: self.P].tolist():
            n = len(self.members[c])
            pick = torch.randperm(n, generator=g)[: self.K] if n >= self.K else torch.randint(n, (self.K,), generator=g)
            parts.append(self.members[c][pick])
        return torch.cat(parts)


def us_per_batch(sampler, steps: int) -> float:
    start = time.perf_counter()
    for step in range(steps):
        sampler.batch(step)
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=640)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    background = load("omniglot:background")
    _, all_labels = torch.unique(background.y, return_inverse=True)
    print(f"{'labels':<34} {'P x K':>6} {'loop us':>8} {'vectorised us':>14} {'ratio':>6}  (medians of {args.repeats})")
    for name, labels in (
        ("omniglot background (964 classes)", all_labels),
        ("200 of its classes", all_labels[all_labels < 200]),
    ):
        for P, K in ((32, 4), (16, 4)):
            loop, vec = [], []
            for _ in range(args.repeats):  # fresh samplers each repeat: the vectorised one's cache starts cold
                loop.append(us_per_batch(LoopPKSampler(labels, P, K), args.steps))
                vec.append(us_per_batch(PKSampler(labels, P, K), args.steps))
            a, b = statistics.median(loop), statistics.median(vec)
            print(f"{name:<34} {P:>2} x {K:<2} {a:>8.1f} {b:>14.1f} {a / b:>5.1f}x", flush=True)


if __name__ == "__main__":
    main()
