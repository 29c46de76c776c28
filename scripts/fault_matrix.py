"""Issue 22's fault matrix: a small sweep run by several real `dmlbench run` workers against real servers on
127.0.0.1 (a private PostgreSQL cluster, `mlflow server`), each fault injected at a random moment, then the
same command run again; every finished table compared with an undisturbed run's.

    .venv/bin/python scripts/fault_matrix.py [--cases pg_restart mlflow_restart ...] [--seed 0] [--workers 2]

Cases:
  pg_restart         PostgreSQL stopped for 15 s mid-sweep and started again: the workers wait and go on
  pg_down_long       PostgreSQL stopped for longer than the retry window (--store-retry 8): the workers stop
                     with one line and exit 75; started again, the same command finishes the sweep
  mlflow_restart     the MLflow server SIGKILLed mid-sweep and started again 10 s later: the workers wait, go on
  mlflow_down_start  the MLflow server down when the workers start: one line, exit 2 in seconds; then it runs
  sigkill_worker     one of the workers SIGKILLed while it holds a trial slot, the others go on
  sigterm_all        SIGTERM to every worker at once during the final seeds (a Slurm requeue), then restarted
  disk_full          the results folder on a tmpfs with no room left (or RLIMIT_FSIZE where mount is not
                     allowed): one line naming the path, no half-written file; with room, the rerun is correct
  corrupt_cache      every file of $DMLBENCH_CACHE truncated or overwritten, plus a stray temp file: rebuilt
  load_postgres      8 workers on one PostgreSQL storage, a protocol with more cells than workers
  load_sqlite        the same on one SQLite storage

Every case checks: the finished tables equal the undisturbed run's (wall times and timestamps aside), no
slot recorded twice in Optuna, no MLflow key on two runs and every trial and seed FINISHED or FAILED there with
its metrics, and every worker either finished or stopped with one `dmlbench:` line and a documented exit code.
Prints one line per case and a summary; exit 0 only when every case passed.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import _faults as F  # noqa: E402
from _servers import MlflowServer, Postgres  # noqa: E402


@dataclass
class Case:
    name: str
    faults: int = 0  # faults injected
    identical: bool = False
    problems: list[str] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.identical and not self.problems


@dataclass
class Ctx:
    work: Path
    data_root: Path
    protocol: Path
    reference: dict
    reference_s: float
    rng: random.Random
    workers: int
    sweep_s: float = 60.0  # the reference's first recorded trial to its last line
    pg: Postgres | None = None

    def databases(self, case: str) -> tuple[str, str]:
        assert self.pg is not None
        self.pg.create(f"optuna_{case}", f"mlflow_{case}")
        return self.pg.url(f"optuna_{case}"), self.pg.url(f"mlflow_{case}")

    def wait_moment(self, workers: list, low: float = 0.0, high: float = 0.4) -> None:
        """Until a random moment of the sweep: the first trial recorded by any worker (start-up, which a loaded
        machine stretches, is not the sweep), then a random fraction of the reference run's length."""
        F.wait_for(lambda: any(w.proc.poll() is not None or "trial" in w.output() for w in workers), 600, 0.5)
        time.sleep(self.rng.uniform(low, high) * self.sweep_s)


def _start_workers(ctx: Ctx, case: str, n: int, storage: str, tracking: str, *extra: str, env=None) -> list:
    folder = ctx.work / case
    folder.mkdir(exist_ok=True)
    return [
        F.start(
            F.run_args(ctx.protocol, storage, tracking, folder / f"results-{i}", ctx.data_root, *extra),
            folder / f"worker-{i}.log",
            cwd=folder,
            env=env,
        )
        for i in range(n)
    ]


def _finish(ctx: Ctx, case: Case, workers: list, timeout: float = 900) -> None:
    for w in workers:
        code = w.wait(timeout)
        case.exits.append(code)
        why = F.clean_exit(code, w.output())
        if why:
            case.problems.append(why)


def _rerun_and_compare(
    ctx: Ctx, case: Case, storage: str, tracking: str, results: Path, env=None, experiment_env=None
) -> None:
    """The same command once more (it must finish with exit 0), then the checks."""
    w = F.start(
        F.run_args(ctx.protocol, storage, tracking, results, ctx.data_root),
        results.parent / f"rerun-{results.name}.log",
        cwd=results.parent,
        env=env,
    )
    code = w.wait(900)
    case.exits.append(code)
    if code != 0 or F.clean_exit(code, w.output()):
        case.problems.append(f"rerun exit {code}: {w.output()[-600:]}")
        return
    diffs = F.differences(ctx.reference, F.tables(results))
    case.identical = not diffs
    case.problems += diffs[:3]
    case.problems += F.optuna_once(storage)
    case.problems += F.mlflow_once(tracking, env=experiment_env)


# --------------------------------------------------------------------------- the cases


def pg_restart(ctx: Ctx, case: Case) -> None:
    storage, tracking = ctx.databases(case.name)
    workers = _start_workers(ctx, case.name, ctx.workers, storage, tracking)
    ctx.wait_moment(workers)
    if all(w.proc.poll() is None for w in workers):
        assert ctx.pg is not None
        ctx.pg.stop("fast")
        case.faults += 1
        time.sleep(15)
        ctx.pg.start()
    _finish(ctx, case, workers)
    if any(c != 0 for c in case.exits):
        case.problems.append(f"a worker did not go on after the restart: exits {case.exits}")
    _rerun_and_compare(ctx, case, storage, tracking, ctx.work / case.name / "results-0")


def pg_down_long(ctx: Ctx, case: Case) -> None:
    storage, tracking = ctx.databases(case.name)
    workers = _start_workers(ctx, case.name, ctx.workers, storage, tracking, "--store-retry", "8")
    ctx.wait_moment(workers)
    assert ctx.pg is not None
    if all(w.proc.poll() is None for w in workers):
        ctx.pg.stop("fast")
        case.faults += 1
        _finish(ctx, case, workers, timeout=120)  # each stops within the window plus its current training
        ctx.pg.start()
        if any(c not in (0, 75) for c in case.exits) or 75 not in case.exits:
            case.problems.append(f"expected exit 75 from the workers the outage stopped: exits {case.exits}")
    else:
        _finish(ctx, case, workers)
    _rerun_and_compare(ctx, case, storage, tracking, ctx.work / case.name / "results-0")


def _mlflow_server(ctx: Ctx, case: str) -> MlflowServer:
    return MlflowServer(ctx.work / case / "mlflow-server")


def mlflow_restart(ctx: Ctx, case: Case) -> None:
    folder = ctx.work / case.name
    server = _mlflow_server(ctx, case.name)
    storage = f"sqlite:///{folder / 'optuna.db'}"
    try:
        workers = _start_workers(ctx, case.name, ctx.workers, storage, server.uri)
        ctx.wait_moment(workers)
        if all(w.proc.poll() is None for w in workers):
            server.kill()
            case.faults += 1
            time.sleep(10)
            server.start()
        _finish(ctx, case, workers)
        if any(c != 0 for c in case.exits):
            case.problems.append(f"a worker did not go on after the MLflow restart: exits {case.exits}")
        _rerun_and_compare(ctx, case, storage, server.uri, folder / "results-0")
    finally:
        server.close()


def mlflow_down_start(ctx: Ctx, case: Case) -> None:
    folder = ctx.work / case.name
    folder.mkdir(exist_ok=True)
    port = F_free_port()
    storage = f"sqlite:///{folder / 'optuna.db'}"
    began = time.monotonic()
    [w] = _start_workers(ctx, case.name, 1, storage, f"http://127.0.0.1:{port}")
    case.faults += 1
    code = w.wait(120)
    took = time.monotonic() - began
    case.exits.append(code)
    lines = [line for line in w.output().strip().splitlines() if line.strip()]
    if code != 2 or len(lines) != 1 or "cannot reach MLflow tracking server" not in lines[0]:
        case.problems.append(f"down at the start: exit {code}, {len(lines)} lines: {w.output()[-500:]}")
    if took > 60:
        case.problems.append(f"down at the start took {took:.0f} s to refuse")
    server = _mlflow_server(ctx, case.name)
    try:
        _rerun_and_compare(ctx, case, storage, server.uri, folder / "results-0")
    finally:
        server.close()


def F_free_port() -> int:
    from _servers import free_port

    return free_port()


def sigkill_worker(ctx: Ctx, case: Case) -> None:
    storage, tracking = ctx.databases(case.name)
    workers = _start_workers(ctx, case.name, ctx.workers, storage, tracking)
    ctx.wait_moment(workers, 0.0, 0.2)
    victim = workers[0]
    if victim.proc.poll() is None:
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        case.faults += 1
    _finish(ctx, case, workers[1:])
    if any(c != 0 for c in case.exits):
        case.problems.append(f"the other workers did not finish: exits {case.exits}")
    if workers[1:]:  # the survivors' own tables are complete: compare them before any rerun
        diffs = F.differences(ctx.reference, F.tables(ctx.work / case.name / "results-1"))
        case.problems += [f"survivor: {d}" for d in diffs[:3]]
    _rerun_and_compare(ctx, case, storage, tracking, ctx.work / case.name / "results-0")


def _wait_finals(ctx: Ctx, workers: list) -> None:
    """Until a final seed is being trained: a worker printed its first final seed, then a moment more."""
    F.wait_for(lambda: any(w.proc.poll() is not None or "seed" in w.output() for w in workers), 900, 0.5)
    time.sleep(ctx.rng.uniform(0.0, 2.0))


def sigterm_all(ctx: Ctx, case: Case) -> None:
    storage, tracking = ctx.databases(case.name)
    workers = _start_workers(ctx, case.name, ctx.workers, storage, tracking)
    _wait_finals(ctx, workers)
    live = [w for w in workers if w.proc.poll() is None]
    for w in live:
        w.proc.send_signal(signal.SIGTERM)
    case.faults += len(live)
    _finish(ctx, case, workers, timeout=120)
    if any(c not in (0, 130) for c in case.exits):
        case.problems.append(f"SIGTERM: exits {case.exits}")
    _rerun_and_compare(ctx, case, storage, tracking, ctx.work / case.name / "results-0")


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode == 0


def disk_full(ctx: Ctx, case: Case) -> None:
    folder = ctx.work / case.name
    folder.mkdir(exist_ok=True)
    storage, tracking = f"sqlite:///{folder / 'optuna.db'}", str(folder / "mlruns")
    full = folder / "full"
    mounted = os.geteuid() == 0 and _mount_tmpfs(full, "16m")  # filled, then emptied for the rerun
    try:
        results = full / "results"
        if mounted:  # fill it: the tables are the first thing written there
            F.fill(full / "filler")
        w = F.start(
            F.run_args(ctx.protocol, storage, tracking, results, ctx.data_root),
            folder / "full.log",
            cwd=folder,
            fsize=None if mounted else 64 * 1024,
        )
        case.faults += 1
        code = w.wait(900)
        case.exits.append(code)
        out = w.output()
        lines = [line for line in out.strip().splitlines() if line.strip()]
        why = F.clean_exit(code, out)
        if why or code != 2 or not lines or str(results) not in lines[-1]:
            case.problems.append(f"full disk: exit {code}: {out[-600:]}")
        half = [p for p in results.rglob("*") if p.name.endswith(".tmp")] if results.exists() else []
        if half:
            case.problems.append(f"half-written files left: {half[:3]}")
        if mounted:
            (full / "filler").unlink()
        final = results if mounted else folder / "results"
        if not mounted:  # the same stores, a folder with room
            shutil.copytree(results, final) if results.exists() else None
        _rerun_and_compare(ctx, case, storage, tracking, final)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(full)])


def corrupt_cache(ctx: Ctx, case: Case) -> None:
    folder = ctx.work / case.name
    folder.mkdir(exist_ok=True)
    cache = Path(os.environ["DMLBENCH_CACHE"])
    files = sorted(cache.glob("*.npz"))
    for i, path in enumerate(files):  # truncated (a killed writer without atomic rename), or garbage
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] if i % 2 == 0 else b"\x00garbage" * 100)
        case.faults += 1
    (cache / f".{files[0].name if files else 'x.npz'}-stray.tmp").write_bytes(b"half")
    case.faults += 1
    storage, tracking = f"sqlite:///{folder / 'optuna.db'}", str(folder / "mlruns")
    _rerun_and_compare(ctx, case, storage, tracking, folder / "results")
    from bench.data.cache import read_cache

    if any(read_cache(p) is None for p in cache.glob("*.npz")):
        case.problems.append("a damaged cache file was not rebuilt")


def _load(ctx: Ctx, case: Case, storage: str, tracking: str) -> None:
    protocol = F.write_protocol(ctx.work / "load", iterations=10, trials=1, seeds=1, load=True)
    began = time.monotonic()
    folder = ctx.work / case.name
    folder.mkdir(exist_ok=True)
    workers = [
        F.start(
            F.run_args(protocol, storage, tracking, folder / f"results-{i}", ctx.data_root),
            folder / f"worker-{i}.log",
            cwd=folder,
        )
        for i in range(8)
    ]
    _finish(ctx, case, workers, timeout=1200)
    case.faults += 8
    took = time.monotonic() - began
    case.problems += F.optuna_once(storage) + F.mlflow_once(tracking)
    ref = ctx.work / "load-reference" / "results"
    if not ref.exists():
        one = F.start(
            F.run_args(
                protocol,
                f"sqlite:///{ref.parent / 'optuna.db'}",
                str(ref.parent / "mlruns"),
                ref,
                ctx.data_root,
            ),
            ctx.work / "load-reference.log",
            cwd=ctx.work,
        )
        if one.wait(900) != 0:
            case.problems.append(f"one-worker reference failed: {one.output()[-400:]}")
            return
    diffs = []
    for i in range(8):
        diffs += F.differences(F.tables(ref), F.tables(folder / f"results-{i}"))
    case.identical = not diffs and all(c == 0 for c in case.exits)
    case.problems += diffs[:3]
    case.seconds = took


def load_postgres(ctx: Ctx, case: Case) -> None:
    storage, tracking = ctx.databases(case.name)
    _load(ctx, case, storage, tracking)


def load_sqlite(ctx: Ctx, case: Case) -> None:
    folder = ctx.work / case.name
    folder.mkdir(exist_ok=True)
    _load(ctx, case, f"sqlite:///{folder / 'optuna.db'}", str(folder / "mlruns"))


CASES: dict[str, Callable[[Ctx, Case], None]] = {
    "pg_restart": pg_restart,
    "pg_down_long": pg_down_long,
    "mlflow_restart": mlflow_restart,
    "mlflow_down_start": mlflow_down_start,
    "sigkill_worker": sigkill_worker,
    "sigterm_all": sigterm_all,
    "disk_full": disk_full,
    "corrupt_cache": corrupt_cache,
    "load_postgres": load_postgres,
    "load_sqlite": load_sqlite,
}
NEEDS_PG = {"pg_restart", "pg_down_long", "sigkill_worker", "sigterm_all", "load_postgres"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--seed", type=int, default=0, help="seed of the random fault moments")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--data-root", default=os.environ.get("DMLBENCH_DATA", str(REPO.parent / "shared" / "data")))
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dmlbench-faults-"))
    os.environ["DMLBENCH_CACHE"] = str(work / "cache")
    protocol = F.write_protocol(work, iterations=args.iterations)
    began = time.monotonic()
    ref = F.start(
        F.run_args(
            protocol,
            f"sqlite:///{work / 'ref' / 'optuna.db'}",
            str(work / "ref" / "mlruns"),
            work / "ref" / "results",
            Path(args.data_root),
        ),
        work / "reference.log",
        cwd=work,
    )
    if ref.wait(900) != 0:
        print(f"reference run failed: {ref.output()[-1000:]}")
        return 1
    ctx = Ctx(
        work,
        Path(args.data_root),
        protocol,
        F.tables(work / "ref" / "results"),
        time.monotonic() - began,
        random.Random(args.seed),
        args.workers,
    )
    stamps = [
        int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
        for m in re.finditer(r"^\[(\d+):(\d\d):(\d\d)\]", ref.output(), re.M)
    ]
    ctx.sweep_s = max(5.0, stamps[-1] - stamps[0]) if stamps else ctx.reference_s / 2
    print(
        f"reference: one worker, SQLite, --threads 1: {ctx.reference_s:.0f} s, of which {ctx.sweep_s:.0f} s "
        "from its first recorded trial to its end",
        flush=True,
    )
    results: list[Case] = []
    try:
        if NEEDS_PG & set(args.cases):
            ctx.pg = Postgres()
        for name in args.cases:
            case = Case(name)
            t0 = time.monotonic()
            try:
                CASES[name](ctx, case)
            except Exception as e:  # noqa: BLE001 - a case that breaks is a failed case, the matrix goes on
                case.problems.append(f"case raised {type(e).__name__}: {e}")
            case.seconds = case.seconds or time.monotonic() - t0
            results.append(case)
            status = "ok" if case.ok else "FAILED"
            print(
                f"{name}: {status}; faults injected {case.faults}; exits {case.exits}; tables "
                f"{'identical' if case.identical else 'DIFFER'}; {case.seconds:.0f} s"
                + (f"; {'; '.join(case.problems[:3])}" if case.problems else ""),
                flush=True,
            )
    finally:
        if ctx.pg is not None:
            ctx.pg.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    passed = sum(c.ok for c in results)
    print(
        f"{len(results)} cases, {sum(c.faults for c in results)} faults injected, tables identical in "
        f"{sum(c.identical for c in results)} of {len(results)}, {passed} of {len(results)} passed"
    )
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
