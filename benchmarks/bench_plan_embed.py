"""`plan`'s per-image embedding estimate against the embedding it estimates, on this machine.

`bench.plan.measure.measure_trunk` times a protocol's trunk on a few hundred random images; evaluation
embeds a whole test set through `bench.evaluation.embed`. This times both, alternated (estimate, real,
estimate, real, ...), with one thread, and prints the medians and their ratio (1.0: the estimate is the
real cost; above: `plan` overestimates scoring).

    .venv/bin/python benchmarks/bench_plan_embed.py [--protocol protocols/omniglot-demo.yaml] [--images 13180]

The protocol needs a fixed training precision (``auto`` is resolved by a sweep, not here).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.evaluation import embed, embedding_precision
from bench.plan.measure import channels_of, measure_trunk
from bench.protocol import load_protocol
from bench.trunks import trunk_from


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="protocols/omniglot-demo.yaml")
    parser.add_argument("--images", type=int, default=13180, help="the real embedding's set (Omniglot's test set)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    protocol = load_protocol(args.protocol)
    spec = protocol.spec
    h, w = spec.data.hw
    x = torch.randn(args.images, channels_of(spec.data), h, w)
    m = spec.model
    model = trunk_from(m.trunk, tuple(x.shape[1:]), m.embedding_dim, dict(m.trunk_params), None, m.freeze_bn)
    estimate, real = [], []
    for _ in range(args.repeats):
        estimate.append(measure_trunk(protocol, budget_s=3.0, threads=1).embed_s)
        with embedding_precision(spec.scored_in):
            start = time.perf_counter()
            embed(model, x)
            real.append((time.perf_counter() - start) / args.images)
    e, r = statistics.median(estimate), statistics.median(real)
    print(
        f"{protocol.name}: plan's estimate {e * 1e3:.3f} ms an image, the real embedding of {args.images:,} "
        f"images {r * 1e3:.3f} ms (medians of {args.repeats}, alternated); ratio {e / r:.2f}"
    )


if __name__ == "__main__":
    main()
