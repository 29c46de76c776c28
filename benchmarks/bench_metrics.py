"""Time and peak memory of dmlbench's retrieval_metrics against PML's AccuracyCalculator.

Each measurement runs in a fresh subprocess, so one run's allocations cannot
hide another's peak: the peak is ``ru_maxrss`` at the end minus ``ru_maxrss``
after imports and data creation. Own and PML runs alternate, so each pair
sees about the same machine load; the table shows medians of each side and the
median of the per-pair ratios own / PML, which a noisy, shared machine skews
least. PML is configured as its documentation suggests for large sets without
faiss (faiss is not installed here): ``CustomKNN`` over
``LpDistance(normalize_embeddings=False)`` (Euclidean on raw embeddings, what its
default faiss ``IndexFlatL2`` ranks by), batched over queries, with
``k="max_bin_count"``.

    .venv/bin/python benchmarks/bench_metrics.py                 # N=60k, 3 repeats, + own at 120k
    .venv/bin/python benchmarks/bench_metrics.py --repeats 1 --scale 0
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PML_KEYS = {"precision_at_1": "precision_at_1", "r_precision": "r_precision", "map_at_r": "mean_average_precision_at_r"}


def make_data(n: int, dim: int, per_class: int, seed: int):
    """Gaussian classes whose spread keeps the metrics away from 0 and 1, so ranking errors would show."""
    import torch

    g = torch.Generator().manual_seed(seed)
    classes = n // per_class
    labels = torch.arange(classes).repeat_interleave(per_class)
    centres = 0.12 * torch.randn(classes, dim, generator=g)
    return centres[labels] + torch.randn(n, dim, generator=g) / dim**0.5 * 3, labels


def measure(which: str, n: int, dim: int, per_class: int, seed: int, pml_batch: int, chunk: int) -> dict:
    """One measurement, meant to run alone in its process."""
    import torch

    from bench.metrics import retrieval_metrics

    if which == "pml":
        from pytorch_metric_learning.distances import LpDistance
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
        from pytorch_metric_learning.utils.inference import CustomKNN
    x, y = make_data(n, dim, per_class, seed)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if which == "own":
        values = retrieval_metrics(x, y, ks=(1,), chunk_size=chunk or None)
        values = {k: values[k] for k in PML_KEYS}
    else:
        calc = AccuracyCalculator(
            include=tuple(PML_KEYS.values()),
            k="max_bin_count",
            knn_func=CustomKNN(LpDistance(normalize_embeddings=False), batch_size=pml_batch),
            device=torch.device("cpu"),
        )
        got = calc.get_accuracy(x, y)
        values = {ours: got[theirs] for ours, theirs in PML_KEYS.items()}
    seconds = time.perf_counter() - start
    peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {"which": which, "n": n, "seconds": seconds, "peak_mb": peak_mb, "values": values}


def run_child(args: argparse.Namespace, which: str, n: int) -> dict:
    command = [sys.executable, __file__, "--child", which, "--n", str(n), "--dim", str(args.dim),
               "--per-class", str(args.per_class), "--seed", str(args.seed),
               "--pml-batch", str(args.pml_batch), "--chunk", str(args.chunk)]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=int, default=2, help="also time own at N*scale (0: skip)")
    parser.add_argument("--pml-batch", type=int, default=4096, help="PML CustomKNN query batch")
    parser.add_argument("--chunk", type=int, default=0, help="own chunk_size (0: its default)")
    parser.add_argument("--child", choices=("own", "pml"))
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        print(json.dumps(measure(args.child, args.n, args.dim, args.per_class, args.seed, args.pml_batch, args.chunk)))
        return

    runs: dict[str, list[dict]] = {"own": [], "pml": []}
    for _ in range(args.repeats):
        for which in ("own", "pml"):
            runs[which].append(run_child(args, which, args.n))
            r = runs[which][-1]
            print(f"  {which} N={args.n}: {r['seconds']:.2f} s, +{r['peak_mb']:.0f} MB", file=sys.stderr, flush=True)
    pair_t = [o["seconds"] / p["seconds"] for o, p in zip(runs["own"], runs["pml"])]
    pair_m = [o["peak_mb"] / max(p["peak_mb"], 1e-9) for o, p in zip(runs["own"], runs["pml"])]
    print(f"N={args.n}, D={args.dim}, {args.n // args.per_class} classes x {args.per_class}, "
          f"{args.repeats} alternating own/PML pairs, medians")  # fmt: skip
    print(f"{'':6} {'seconds':>9} {'peak MB':>9}  " + "  ".join(f"{k:>14}" for k in PML_KEYS))
    med = {}
    for which in ("own", "pml"):
        t = statistics.median(r["seconds"] for r in runs[which])
        m = statistics.median(r["peak_mb"] for r in runs[which])
        med[which] = (t, m)
        values = runs[which][0]["values"]
        print(f"{which:6} {t:9.2f} {m:9.0f}  " + "  ".join(f"{values[k]:14.8f}" for k in PML_KEYS))
    print(f"{'ratio':6} {statistics.median(pair_t):9.2f} {statistics.median(pair_m):9.2f}  "
          f"(own / PML, median of per-pair ratios; time ratios {', '.join(f'{v:.2f}' for v in pair_t)})")  # fmt: skip
    diff = max(abs(o["values"][k] - p["values"][k]) for o, p in zip(runs["own"], runs["pml"]) for k in PML_KEYS)
    print(f"max |own - PML| over the three metrics: {diff:.2e}")
    if args.scale:
        big = run_child(args, "own", args.n * args.scale)
        print(f"own at N={big['n']}: {big['seconds']:.2f} s, +{big['peak_mb']:.0f} MB peak "
              f"(x{big['seconds'] / med['own'][0]:.2f} time, x{big['peak_mb'] / med['own'][1]:.2f} memory vs N={args.n})")  # fmt: skip


if __name__ == "__main__":
    main()
