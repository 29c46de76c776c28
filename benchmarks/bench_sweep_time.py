"""Where a sweep's wall time goes, with several workers: each `dmlbench run` worker (own --results-dir, one
shared Optuna storage and MLflow store, fresh each time) writes its accounts (`bench.clock.Ledger`) in its
manifest's ``time``; this prints them per worker and summed, and the share that is not training.

    .venv/bin/python benchmarks/bench_sweep_time.py [--protocol benchmarks/protocols/omniglot-quick-scaled.yaml]
        [--workers 2] [--threads 1] [--out /tmp/sweep-time]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.clock import ACCOUNTS

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default=str(HERE / "protocols" / "omniglot-quick-scaled.yaml"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="/tmp/sweep-time")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shared = ["--storage", f"sqlite:///{out / 'optuna.db'}", "--tracking-uri", str(out / "mlflow.db")]
    began = time.perf_counter()
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench",
                "run",
                args.protocol,
                "--results-dir",
                str(out / f"results-{w}"),
                "--threads",
                str(args.threads),
                "--quiet",
                *shared,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for w in range(args.workers)
    ]
    outputs = [w.communicate()[0] for w in workers]
    wall = time.perf_counter() - began
    if any(w.returncode for w in workers):
        print("\n---\n".join(outputs))
        raise SystemExit(f"a worker failed: exit codes {[w.returncode for w in workers]}")
    load = os.getloadavg()[0]
    print(
        f"{platform.processor() or platform.machine()}, load {load:.1f}; {args.workers} workers x {args.threads} "
        f"thread(s); {wall:.0f} s from the first start to the last end (process start-up included)"
    )
    total: dict[str, float] = dict.fromkeys((*ACCOUNTS, "other"), 0.0)
    walls = 0.0
    for w in range(args.workers):
        name = Path(args.protocol).stem
        manifest = json.loads((out / f"results-{w}" / name / "manifest.json").read_text())
        accounts = manifest["time"]
        walls += accounts["wall_s"]
        for k, v in accounts["seconds"].items():
            total[k] += v
        print(
            f"worker {w}: {accounts['wall_s']:.0f} s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in accounts["seconds"].items() if v >= 0.05)
        )
        if "precision" in manifest:
            print(
                f"worker {w}: precision {manifest['precision'].get('precision')} "
                f"channels_last {manifest['precision'].get('channels_last')}"
            )
    print(f"{'account':<12} {'seconds':>9} {'share':>7}")
    for k, v in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{k:<12} {v:>9.1f} {v / walls:>7.1%}")
    print(f"not training: {1 - total['training'] / walls:.1%} of {walls:.0f} worker-seconds")


if __name__ == "__main__":
    main()
