"""Each retrieval path against a bare blocked matmul + top-k on the same embeddings, in the same run.

Every measurement runs in a fresh subprocess on one thread. In it, the path and
its bare reference (the same scores in blocks of ``BLOCK_ELEMENTS``, then
``torch.topk`` of the depth the metrics need) run alternately ``--repeats``
times; the medians and their ratio are printed (ratio 1.0: the path costs no
more than scoring and a top-k), in wall seconds and in CPU seconds (``*_cpu_s``,
``cpu_ratio``: what a loaded machine's wall time hides). ``peak_mb`` is the path's first run's working
memory: ``ru_maxrss`` after it minus before it. Sets: SOP's test set as both
query and gallery (60,502, ids pairing each query with itself), In-shop
(14,218 queries x 12,612 gallery), Market-1501 (3,368 x 19,732 with cameras,
junk and distractors), ``retrieval`` (`retrieval_metrics`, one set of
``--retrieval-n``) and ``learned`` (`ranked_by_metric`: a learned metric's g
over one set of ``--learned-n``). ``--queries`` scores only the first queries
of each query set (the cost is linear in them) to keep a shared machine free.

    .venv/bin/python benchmarks/bench_query_gallery.py
    .venv/bin/python benchmarks/bench_query_gallery.py --queries 0   # every query
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

SETS = {"sop": (60_502, 60_502, 11_316), "inshop": (14_218, 12_612, 3_985), "market": (3_368, 19_732, 750)}
NAMES = (*SETS, "retrieval", "learned")


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _cpu_timed(fn, into: list[float]) -> float:  # type: ignore[no-untyped-def]
    """Wall seconds of fn; its CPU seconds (the process's, every thread) appended to ``into``."""
    cpu = time.process_time()
    wall = _timed(fn)
    into.append(time.process_time() - cpu)
    return wall


def _bare(score, nq: int, ng: int, depth: int, block: int) -> None:  # type: ignore[no-untyped-def]
    import torch

    rows = max(1, block // ng)
    for s in range(0, nq, rows):
        torch.topk(score(s, min(nq, s + rows)), depth, dim=1, largest=False)


def _one(name: str, args: argparse.Namespace) -> dict[str, object]:
    import torch

    torch.set_num_threads(1)
    from bench.evaluation import ranked_by_metric
    from bench.losses.learned_metric import LearnedMetric, PairScorer
    from bench.metrics import query_gallery as qg
    from bench.metrics.retrieval import BLOCK_ELEMENTS, retrieval_metrics

    def unit(n: int, seed: int, dim: int = args.dim) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)

    def labels(n: int, classes: int, seed: int, low: int = 0) -> torch.Tensor:
        return torch.randint(low, classes, (n,), generator=torch.Generator().manual_seed(seed))

    extra: dict[str, float] = {}
    if name in SETS:
        nq, ng, classes = SETS[name]
        g, gy = unit(ng, 0), labels(ng, classes, 1)
        if name == "sop":  # one set: the queries are the gallery's first rows
            q, qy, ids = g, gy, {"query_ids": torch.arange(ng), "gallery_ids": torch.arange(ng)}
        else:
            q, qy, ids = unit(nq, 2), labels(nq, classes, 3, low=1), {}
        n = nq if args.queries <= 0 else min(args.queries, nq)
        q, qy = q[:n], qy[:n]
        if ids:
            ids["query_ids"] = ids["query_ids"][:n]
        if name == "market":
            qc, gc = labels(n, 6, 4), labels(ng, 6, 5)
            gy = torch.where(torch.rand(ng, generator=torch.Generator().manual_seed(6)) < 0.1, torch.tensor(-1), gy)
            ks: tuple[int, ...] = (1, 5, 10)
            depth = max(ks)
            path = lambda: qg.reid_metrics(q, qy, qc, g, gy, gc, ks=ks)  # noqa: E731
        else:
            ks = (1, 10)
            scorer = qg._Scorer(
                q, qy, g, gy, ids.get("query_ids"), ids.get("gallery_ids"), *[None] * 2, "euclidean", None, None, None
            )
            depth = max(max(ks), int(scorer.r.max()))
            path = lambda: qg.query_gallery_metrics(q, qy, g, gy, ks=ks, **ids)  # noqa: E731
        q_op, g_op = qg._operands(q, g, "euclidean")
        bare = lambda: _bare(lambda s, e: q_op[s:e] @ g_op.T, n, ng, depth, BLOCK_ELEMENTS)  # noqa: E731
    elif name == "retrieval":
        n = ng = args.retrieval_n
        x, y = unit(n, 0), labels(n, max(2, n // 5), 1)
        depth = min(n - 1, max(8, int(torch.unique(y, return_counts=True)[1].max()) - 1))
        path = lambda: retrieval_metrics(x, y, ks=(1, 2, 4, 8))  # noqa: E731
        q_op, g_op = qg._operands(x, x, "euclidean")
        bare = lambda: _bare(lambda s, e: q_op[s:e] @ g_op.T, n, n, depth + 1, BLOCK_ELEMENTS)  # noqa: E731
    else:  # learned: the metric's g over one set, chunks sized by its per-pair cost
        n = ng = args.learned_n
        torch.manual_seed(0)
        metric = LearnedMetric(hidden=16, layers=2, pair_input="difference_product")
        metric.materialize(args.dim)
        pair = PairScorer(metric, normalize=True)
        x, y = unit(n, 0), labels(n, max(2, n // 5), 1)
        depth = max(8, int(torch.unique(y, return_counts=True)[1].max()) - 1)
        path = lambda: ranked_by_metric(pair, x, y, ks=(1, 2, 4, 8))  # noqa: E731
        px = pair.prepare(x)
        block = BLOCK_ELEMENTS // (1 + pair.cost(px.shape[1]))
        bare = lambda: _bare(lambda s, e: pair(px[s:e], px), n, n, depth + 1, block)  # noqa: E731

        def whole(s: int, e: int) -> torch.Tensor:  # g of a whole chunk in rows, as before the CPU tiles
            with torch.no_grad():
                return metric.scores(px[s:e], px)

        extra["unpieced_s"] = round(_timed(lambda: _bare(whole, n, n, depth + 1, block)), 3)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    first = _timed(path)
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    bare_s, path_s, bare_cpu, path_cpu = [], [first], [], []  # type: ignore[var-annotated]
    for i in range(args.repeats):
        runs = (("bare", bare, bare_s, bare_cpu), ("path", path, path_s, path_cpu))
        for _label, fn, into, cpu in runs[:: 1 if i % 2 == 0 else -1]:
            into.append(_cpu_timed(fn, cpu))
    b, p = statistics.median(bare_s), statistics.median(path_s)
    bc, pc = statistics.median(bare_cpu), statistics.median(path_cpu)
    out = path()
    return {
        "set": name,
        "queries": n,
        "gallery": ng,
        "depth": depth,
        "bare_s": round(b, 3),
        "path_s": round(p, 3),
        "ratio": round(p / b, 2),
        "bare_cpu_s": round(bc, 3),
        "path_cpu_s": round(pc, 3),
        "cpu_ratio": round(pc / bc, 2),
        "peak_mb": round(peak),
        **extra,
        **{k: round(v, 4) for k, v in out.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2048, help="queries scored per query set (0: all)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--retrieval-n", type=int, default=16_384)
    parser.add_argument("--learned-n", type=int, default=2_048)
    parser.add_argument("--repeats", type=int, default=3, help="alternating bare/path runs; medians")
    parser.add_argument("--sets", default=",".join(NAMES))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one(args.child, args)))
        return
    cpu = [
        line.split(":", 1)[1].strip()
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        if line.startswith("Model name")
    ]
    print(
        f"cpu: {cpu[0] if cpu else 'unknown'}; load before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}"
    )
    for name in args.sets.split(","):
        if name not in NAMES:
            sys.exit(f"unknown set {name!r}: expected some of {', '.join(NAMES)}")
        cmd = [sys.executable, __file__, "--child", name, "--queries", str(args.queries), "--dim", str(args.dim)]
        cmd += [
            "--retrieval-n",
            str(args.retrieval_n),
            "--learned-n",
            str(args.learned_n),
            "--repeats",
            str(args.repeats),
        ]
        out = subprocess.run(
            cmd, check=True, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": "."}
        )
        print(out.stdout.strip())
    print(f"load after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
