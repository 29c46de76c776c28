"""What embedding the test set in bf16 would change: a protocol's cells trained, then scored in fp32 and in bf16.

Evaluation embeds in fp32 whatever precision training ran in. This trains
final seed 0 of the named cells of a protocol (bf16 training, the protocol's
iterations), scores each model on the test side twice, the trunk's forward
in fp32 and under bf16 autocast (the metrics in fp32 both times), and prints
the metrics' differences and the embedding's time both ways (medians of
``--repeats``, alternating). Omniglot data as the protocol says.

    .venv/bin/python benchmarks/bench_eval_precision.py [--protocol protocols/omniglot-quick.yaml]
        [--cells triplet+batch_hard contrastive+none] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from bench.evaluation import embed, evaluate
from bench.plan import plan as make_plan
from bench.protocol import load_protocol
from bench.sweep.prepare import prepare
from bench.sweep.tuning import final_config
from bench.training import train

METRICS = ("map_at_r", "r_precision", "precision_at_1", "lake_accuracy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="protocols/omniglot-quick.yaml")
    parser.add_argument("--cells", nargs="+", default=["triplet+batch_hard", "contrastive+none"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    protocol = load_protocol(args.protocol)
    prepared = prepare(protocol)
    cells = {c.id: c for c in make_plan(protocol, measure=False).cells}
    normalize = protocol.spec.model.normalize
    for cell_id in args.cells:
        config = dataclasses.replace(final_config(protocol, cells[cell_id], {}, 0), precision="bf16")
        start = time.perf_counter()
        model = train(config, prepared.train).model.eval()
        print(f"{cell_id}: trained {config.iterations} iterations in bf16, {time.perf_counter() - start:.1f} s")
        fp32 = evaluate(model, prepared.test, lake_runs=prepared.lake_runs, clustering=False, normalize=normalize)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = evaluate(model, prepared.test, lake_runs=prepared.lake_runs, clustering=False, normalize=normalize)
        for m in METRICS:
            print(f"  {m:15} fp32 {fp32[m]:.5f}  bf16 {bf16[m]:.5f}  difference {bf16[m] - fp32[m]:+.5f}")
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        for _ in range(args.repeats):
            for name in times:
                start = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bf16"):
                    embed(model, prepared.test.x)
                times[name].append(time.perf_counter() - start)
        a, b = statistics.median(times["bf16"]), statistics.median(times["fp32"])
        print(f"  embedding {len(prepared.test.x)} test images: bf16 {a:.2f} s, fp32 {b:.2f} s, ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
