"""Trials per hour of one sweep at 1, 2, 4 ... workers sharing one device.

A small trunk leaves a GPU idle between its short kernels (a Conv-4 step
at 28x28 takes 8 ms on an H100, much of it optimiser, loss and Python
time), so several `dmlbench run` workers can share one GPU. How many pay
off is measured, not guessed: for each worker count, this script runs the
same protocol from an empty SQLite store with that many workers on the same
device (``--device``: CUDA_VISIBLE_DEVICES for every worker), waits for
them, and prints the tuning trials finished per hour of wall time. With ``--seconds S`` each sweep is told
to stop after S seconds (``dmlbench run --stop-after``: no trial claimed that would end past them), so the
measurement takes a known time whatever the protocol's size, as a lent machine's call needs.

    .venv/bin/python scripts/workers_per_device.py --protocol protocols/omniglot-smoke.yaml \
        --workers 1 2 4 [--device 0] [--threads 1]

On a CPU machine the same script answers how many workers its cores carry.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STOPPED = 4  # `dmlbench run --stop-after`'s exit: stopped in time, with work left


def run_sweep(
    protocol: Path, workers: int, device: str | None, threads: int, seconds: float | None = None
) -> tuple[int, float]:
    """Finished tuning trials and wall seconds of one sweep with `workers` processes (each told to stop after
    `seconds`, where given)."""
    with tempfile.TemporaryDirectory(prefix="dmlbench-workers-") as tmp:
        work = Path(tmp)
        argv = [
            sys.executable,
            "-m",
            "bench",
            "run",
            str(protocol),
            "--quiet",
            "--threads",
            str(threads),
            "--storage",
            f"sqlite:///{work / 'optuna.db'}",
            "--tracking-uri",
            str(work / "mlflow.db"),
            "--results-dir",
            str(work / "results"),
        ]
        if seconds is not None:
            argv += ["--stop-after", str(seconds)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        start = time.monotonic()
        procs = [
            subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(workers)
        ]
        failed = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
        wall = time.monotonic() - start
        bad = [err for code, err in failed if code not in (0, STOPPED)]
        if bad:
            raise SystemExit(f"a worker failed: {bad[0].strip().splitlines()[-1] if bad[0].strip() else 'no output'}")
        with sqlite3.connect(work / "optuna.db") as db:
            (trials,) = db.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()
        return int(trials), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", type=Path, default=Path("protocols/omniglot-smoke.yaml"))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--device", default=None, help="the CUDA device every worker shares (default: as visible)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument(
        "--seconds", type=float, default=None, help="stop each sweep after this long (default: run it to the end)"
    )
    args = parser.parse_args()
    if args.seconds is not None and args.seconds <= 0:
        parser.error("--seconds must be positive")
    base, empty = None, False
    print(f"{'workers':>7}  {'trials':>6}  {'wall s':>8}  {'trials/h':>9}  {'vs 1 worker':>11}")
    for n in args.workers:
        trials, wall = run_sweep(args.protocol, n, args.device, args.threads, args.seconds)
        rate = trials / wall * 3600
        base = rate if base is None else base
        ratio = f"{rate / base:>10.2f}x" if base > 0 else f"{'-':>11}"  # no trial at the first count: no ratio
        print(f"{n:>7}  {trials:>6}  {wall:>8.1f}  {rate:>9.1f}  {ratio}", flush=True)
        if trials == 0:  # a rate of nothing compares nothing: said, and the exit says so
            print(f"  no trial finished with {n} worker(s){' in the time given (--seconds)' if args.seconds else ''}")
            empty = True
    return 1 if empty else 0


if __name__ == "__main__":
    sys.exit(main())
