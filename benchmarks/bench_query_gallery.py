"""Time and peak memory of the query/gallery and re-ID metrics at the standard benchmarks' sizes.

Each measurement runs in a fresh subprocess on one thread; its peak is
``ru_maxrss`` at the end minus ``ru_maxrss`` after the embeddings exist, so
it is the metric's own working memory. Sizes: SOP's test set as both query
and gallery (60,502 x 60,502, ids pairing each query with itself), In-shop
(14,218 queries x 12,612 gallery), Market-1501 (3,368 x 19,732 with cameras,
junk and distractors). ``--queries`` scores only the first queries of each
(the cost is linear in them) to keep a shared machine free.

    .venv/bin/python benchmarks/bench_query_gallery.py
    .venv/bin/python benchmarks/bench_query_gallery.py --queries 0   # every query
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

SETS = {"sop": (60_502, 60_502, 11_316), "inshop": (14_218, 12_612, 3_985), "market": (3_368, 19_732, 750)}


def _one(name: str, queries: int, dim: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)
    from bench.metrics.query_gallery import query_gallery_metrics, reid_metrics

    nq, ng, classes = SETS[name]
    g = torch.nn.functional.normalize(torch.randn(ng, dim, generator=torch.Generator().manual_seed(0)), dim=1)
    gy = torch.randint(0, classes, (ng,), generator=torch.Generator().manual_seed(1))
    if name == "sop":  # one set: the queries are the gallery's first rows
        q, qy, ids = g, gy, {"query_ids": torch.arange(ng), "gallery_ids": torch.arange(ng)}
    else:
        q = torch.nn.functional.normalize(torch.randn(nq, dim, generator=torch.Generator().manual_seed(2)), dim=1)
        qy, ids = torch.randint(1, classes, (nq,), generator=torch.Generator().manual_seed(3)), {}
    n = nq if queries <= 0 else min(queries, nq)
    q, qy = q[:n], qy[:n]
    if ids:
        ids["query_ids"] = ids["query_ids"][:n]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if name == "market":
        qc, gc = torch.randint(0, 6, (n,)), torch.randint(0, 6, (ng,))
        gy = torch.where(torch.rand(ng) < 0.1, torch.tensor(-1), gy)  # some junk; label 0 is a distractor
        out = reid_metrics(q, qy, qc, g, gy, gc, ks=(1, 5, 10))
    else:
        out = query_gallery_metrics(q, qy, g, gy, ks=(1, 10), **ids)
    wall = time.perf_counter() - start
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {
        "set": name,
        "queries": n,
        "gallery": ng,
        "seconds": round(wall, 2),
        "peak_mb": round(peak),
        "per_1000_queries_s": round(1000 * wall / n, 2),
        **{k: round(v, 4) for k, v in out.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2048, help="queries scored per set (0: all)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one(args.child, args.queries, args.dim)))
        return
    for name in SETS:
        cmd = [sys.executable, __file__, "--child", name, "--queries", str(args.queries), "--dim", str(args.dim)]
        out = subprocess.run(
            cmd, check=True, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": "."}
        )
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
