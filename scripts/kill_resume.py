"""Kill -9 a sweep at chosen moments, resume it, and compare its tables with an uninterrupted run.

Issue 12's fault test: a `dmlbench run` killed by SIGKILL (no handler runs)
and rerun with the same command must end with the same tables as a run that
was never interrupted. The moments are spread over the run by time (a
reference run gives its length) and by watching its log and files: inside a
trial, right after a trial is recorded (the next MLflow run is being opened),
during the final seeds, while a cell's tables are being written, near the end.

    .venv/bin/python scripts/kill_resume.py [--protocol protocols/omniglot-smoke.yaml] [--kills 10] [--threads 1]

Prints one line per kill and, last, "N of K identical". Exit 0 only when all are.
Values compared: every column of finals.csv, trials.csv and summary.csv except
wall times and timestamps (they differ between any two runs).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

TABLES = ("finals.csv", "trials.csv", "summary.csv")
VOLATILE = ("wall", "time", "created", "finished", "started", "run_id", "git_")  # column-name fragments


def command(protocol: Path, work: Path, threads: int) -> list[str]:
    """The same command for the first run and every resume: same stores, same threads."""
    return [
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


def tables(work: Path) -> dict[str, pd.DataFrame]:
    """The sweep's tables with the columns that legitimately differ between runs dropped."""
    [folder] = [p for p in (work / "results").iterdir() if p.is_dir() and not p.name.startswith(".")]
    out = {}
    for name in TABLES:
        df = pd.read_csv(folder / name)
        keep = [c for c in df.columns if not any(v in c.lower() for v in VOLATILE)]
        out[name] = df[keep].sort_values(keep[:3]).reset_index(drop=True)
    return out


def differences(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> list[str]:
    diffs = []
    for name in TABLES:
        x, y = a[name], b[name]
        if list(x.columns) != list(y.columns) or len(x) != len(y):
            diffs.append(f"{name}: shape {x.shape} vs {y.shape}")
            continue
        for col in x.columns:
            if not x[col].equals(y[col]):
                bad = (x[col].astype(str) != y[col].astype(str)).to_numpy().nonzero()[0]
                if len(bad):
                    i = int(bad[0])
                    diffs.append(f"{name}:{col} row {i}: {x[col].iloc[i]!r} vs {y[col].iloc[i]!r}")
    return diffs


class Watch:
    """A running sweep whose stderr lines are collected as they come, and whose tables can be polled."""

    def __init__(self, argv: list[str], work: Path, log: Path) -> None:
        self.work, self.lines, self.start = work, [], time.monotonic()
        self.log, self.offset = log, log.stat().st_size if log.exists() else 0
        with log.open("a") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def poll(self) -> bool:
        """Read the log lines that arrived; False once the process has exited."""
        running = self.proc.poll() is None
        with self.log.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # whole lines only
        self.offset += end
        self.lines.extend(line for line in chunk[:end].decode(errors="replace").splitlines() if line.strip())
        return running

    def finals_mtime(self) -> float:
        found = list((self.work / "results").glob("*/finals.csv"))
        return found[0].stat().st_mtime if found else 0.0

    def wait_for(self, ready: Callable[[Watch], bool], limit_s: float) -> bool:
        while self.poll():
            if ready(self):
                return True
            if time.monotonic() - self.start > limit_s:
                return False
            time.sleep(0.01)
        return False

    def kill(self) -> float:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.poll()
        return time.monotonic() - self.start


def moments(total_s: float, n: int, rng: random.Random) -> list[tuple[str, Callable[[Watch], bool]]]:
    """n kill moments: half at times spread over the run, half on events in the log and files."""

    def at(t: float) -> Callable[[Watch], bool]:
        return lambda w: time.monotonic() - w.start >= t

    def after_trials(k: int, delay: float) -> Callable[[Watch], bool]:
        seen: dict[str, float] = {}

        def ready(w: Watch) -> bool:
            count = sum(" trial " in line for line in w.lines)
            if count >= k and "t" not in seen:
                seen["t"] = time.monotonic()
            return "t" in seen and time.monotonic() - seen["t"] >= delay

        return ready

    def on_final(k: int) -> Callable[[Watch], bool]:
        return lambda w: sum(" final seed " in line for line in w.lines) >= k

    def on_table_write(k: int) -> Callable[[Watch], bool]:
        state = {"last": 0.0, "count": 0}

        def ready(w: Watch) -> bool:
            m = w.finals_mtime()
            if m != state["last"]:
                state["last"], state["count"] = m, state["count"] + 1
            return state["count"] >= k

        return ready

    events: list[tuple[str, Callable[[Watch], bool]]] = [
        ("inside a trial", after_trials(rng.randint(2, 8), rng.uniform(0.2, 1.5))),
        ("right after a trial was recorded (MLflow run opening)", after_trials(rng.randint(3, 12), 0.0)),
        ("during the final seeds", on_final(rng.randint(1, 8))),
        ("while a cell's tables are written", on_table_write(rng.randint(2, 6))),
        ("near the end (floor, last tables)", at(total_s * rng.uniform(0.93, 0.99))),
    ]
    timed = n - min(len(events), n // 2)
    spread = [
        (f"at {f:.0%} of the run", at(total_s * f)) for f in ((i + rng.uniform(0.1, 0.9)) / timed for i in range(timed))
    ]
    out = spread + events[: n - timed]
    rng.shuffle(out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", default="protocols/omniglot-smoke.yaml", type=Path)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the work folders (printed)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="kill_resume_"))
    protocol = args.protocol.resolve()

    ref = root / "reference"
    ref.mkdir()
    w = Watch(command(protocol, ref, args.threads), ref, ref / "log.txt")
    w.wait_for(lambda _: False, float("inf"))
    total = time.monotonic() - w.start
    if w.proc.returncode != 0:
        print(f"the uninterrupted run failed (exit {w.proc.returncode}); log: {ref / 'log.txt'}")
        return 1
    expected = tables(ref)
    print(f"uninterrupted run: {total:.0f} s; work in {root}", flush=True)

    same = killed_count = 0
    for i, (what, ready) in enumerate(moments(total, args.kills, rng)):
        work = root / f"kill{i}"
        work.mkdir()
        argv = command(protocol, work, args.threads)
        w = Watch(argv, work, work / "log.txt")
        if w.wait_for(ready, total * 3):
            killed = f"killed {w.kill():.1f} s in ({what})"
            killed_count += 1
        else:
            w.kill()
            killed = f"not killed: the run ended before the moment ({what})"
        rerun = subprocess.run(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=(work / "log.txt").open("a"),
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            check=False,
        )
        if rerun.returncode != 0:
            print(f"{i + 1}: {killed}; resume exit {rerun.returncode} (log {work / 'log.txt'})", flush=True)
            continue
        diffs = differences(expected, tables(work))
        same += not diffs
        print(
            f"{i + 1}: {killed}; resumed: " + ("identical" if not diffs else "DIFFERENT: " + "; ".join(diffs[:3])),
            flush=True,
        )
    print(f"{same} of {args.kills} identical ({killed_count} killed mid-run; the others ended before their moment)")
    if not args.keep and same == args.kills:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0 if same == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
