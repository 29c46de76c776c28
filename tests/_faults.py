"""What the fault tests and scripts/fault_matrix.py share: a small protocol, workers as real `dmlbench run`
processes, and the checks every fault case ends with.

The checks (issue 22): the finished tables equal an undisturbed run's (same seeds, ``--threads 1``; wall times
and timestamps aside), nothing is recorded twice in Optuna or MLflow, and every worker either finished (exit 0)
or stopped with one line and a documented exit code: never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]

# three cells that all train (no diverging cell: every worker should end with exit 0), two trials, two seeds
PROTOCOL = """\
name: faults
seed: 5
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 12
  test_classes: 6
  image_size: 12
  validation: {folds: 3, use: 1, group_by: alphabet}
model: {trunk: mlp, trunk_params: {hidden: [32]}, embedding_dim: 8, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 4, K: 4, iterations: ITERATIONS}
evaluation: {metrics: [precision_at_1, map_at_r], primary: map_at_r}
tuning: {trials: TRIALS}
final: {seeds: SEEDS}
grid:
  losses:
    - {name: triplet}
    - {name: contrastive, miners: [none]}
  miners: [{name: none}, {name: batch_hard}]
"""
# nine cells for the load case (more cells than its 8 workers), one trial and one seed each
LOAD_GRID = """\
grid:
  losses:
    - {name: triplet, miners: [none, batch_all, batch_hard, semihard]}
    - {name: triplet, label: triplet-fixed, miners: [hard], search_space: {margin: null}}
    - {name: contrastive, miners: [none]}
    - {name: lifted_structure, miners: [none]}
    - {name: infonce, miners: [none]}
    - {name: npair, miners: [none]}
  miners: [{name: none}, {name: batch_all}, {name: batch_hard}, {name: semihard}, {name: hard}]
"""
TABLES = ("finals.csv", "trials.csv", "summary.csv")
VOLATILE = ("wall", "time", "created", "finished", "started", "run_id", "git_")
DOCUMENTED_EXITS = {0, 1, 2, 3, 75, 130}


def write_protocol(
    folder: Path, iterations: int = 30, trials: int = 2, seeds: int = 2, name: str = "faults", load: bool = False
) -> Path:
    """The fault protocol (``load``: with `LOAD_GRID`'s nine cells) written into ``folder``."""
    path = folder / f"{name}.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    text = PROTOCOL.replace("ITERATIONS", str(iterations)).replace("TRIALS", str(trials))
    if load:
        text = text[: text.index("grid:")] + LOAD_GRID
    path.write_text(text.replace("SEEDS", f"[{', '.join(str(s) for s in range(seeds))}]").replace("faults", name))
    return path


def run_args(protocol: Path, storage: str, tracking: str, results: Path, data_root: Path, *extra: str) -> list[str]:
    """The same `dmlbench run` for every worker and every rerun: same stores, --threads 1, quiet."""
    return [
        "run",
        str(protocol),
        "--storage",
        storage,
        "--tracking-uri",
        tracking,
        "--results-dir",
        str(results),
        "--data-root",
        str(data_root),
        "--threads",
        "1",
        "--quiet",
        *extra,
    ]


@dataclass
class Worker:
    """A `dmlbench run` process whose output goes to a file."""

    proc: subprocess.Popen
    log: Path

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker hung past {timeout} s: {self.output()[-2000:]}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start(args: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None, fsize: int | None = None) -> Worker:
    """``python -m bench`` with ``args``; ``fsize``: a file-size limit (bytes) for the child (RLIMIT_FSIZE)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}

    def limit() -> None:
        if fsize is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    handle = open(log, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", *args],
        cwd=cwd,
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=full_env,
        preexec_fn=limit if fsize is not None else None,
    )
    return Worker(proc, log)


def clean_exit(code: int, output: str) -> str | None:
    """Why a worker's end is not clean (None when it is): a traceback, an undocumented code, or a non-zero exit
    whose last line is not one ``dmlbench: ...`` line."""
    if "Traceback (most recent call last)" in output:
        return f"traceback (exit {code}): {output[output.index('Traceback') :][:1500]}"
    if code not in DOCUMENTED_EXITS:
        return f"undocumented exit {code}: {output[-800:]}"
    if code != 0:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        if not lines or not lines[-1].startswith("dmlbench:"):
            return f"exit {code} without a one-line reason: {output[-800:]}"
    return None


def tables(results: Path) -> dict[str, pd.DataFrame]:
    """The sweep's tables without the columns that differ between any two runs."""
    [folder] = [p for p in results.iterdir() if p.is_dir() and not p.name.startswith(".")]
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
            bad = x[col].astype(object).fillna("<na>").astype(str) != y[col].astype(object).fillna("<na>").astype(str)
            bad = bad.to_numpy().nonzero()[0]
            if len(bad):
                i = int(bad[0])
                diffs.append(f"{name}:{col} row {i}: {x[col].iloc[i]!r} vs {y[col].iloc[i]!r}")
    return diffs


def optuna_once(storage: str) -> list[str]:
    """Problems with the Optuna records: a slot recorded twice, or a study with fewer finished slots than it has."""
    import optuna

    from bench.sweep.tuning import ATTR_SURPLUS, held

    problems = []
    for name in optuna.get_all_study_names(storage=storage):
        study = optuna.load_study(study_name=name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        n = study.user_attrs.get("slots", 0)
        finished = [t for t in held(trials, n).values() if t.state.is_finished()]
        counted = [
            t for t in trials if t.state.is_finished() and ATTR_SURPLUS not in t.system_attrs and t.state.name != "FAIL"
        ]
        slots = [t.user_attrs["slot"] for t in counted]
        if len(slots) != len(set(slots)):
            problems.append(f"{name}: a slot recorded twice {sorted(slots)}")
        if len(finished) != n:
            problems.append(f"{name}: {len(finished)} of {n} slots finished")
    return problems


def mlflow_once(uri: str, experiment: str = "dmlbench/faults", env: dict[str, str] | None = None) -> list[str]:
    """Problems with the MLflow records: a key on two active runs, or a run of a finished Optuna record not
    FINISHED/FAILED (a trial or seed recorded in Optuna but not in MLflow)."""
    from mlflow.tracking import MlflowClient

    from bench.stores.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(uri, create=False)  # a plain path is the SQLite store the workers used
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return [f"no experiment {experiment}"]
        runs = client.search_runs([exp.experiment_id], max_results=5000)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    keys = [r.data.tags.get("dmlbench.key") for r in runs if r.info.lifecycle_stage == "active"]
    problems = [f"key on {keys.count(k)} runs: {k}" for k in sorted(set(keys)) if keys.count(k) > 1]
    for r in runs:
        kind = r.data.tags.get("kind")
        if kind in ("trial", "final", "fold") and r.info.status not in ("FINISHED", "FAILED"):
            problems.append(f"{r.data.tags.get('dmlbench.key')}: MLflow status {r.info.status}")
        if kind in ("trial", "final") and not r.data.metrics:
            problems.append(f"{r.data.tags.get('dmlbench.key')}: no metrics in MLflow")
    return problems


def fill(path: Path) -> None:
    """Fill the filesystem holding ``path`` with one file of zeros (unbuffered: closing it writes nothing)."""
    try:
        with open(path, "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
    except OSError:
        pass


def wait_for(predicate, timeout: float, every: float = 0.2) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every)
    return False
