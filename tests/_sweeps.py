"""Real tiny sweeps for the report tests, run once per test session (shared by xdist workers).

The leaderboard, regression and claims tests all read the tables the real
runner writes; a sweep costs seconds, so it is run once under a file lock in
the session's shared temp folder and reused by every worker.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest

from bench.cli import main

# Three cells, three seeds (so intervals and tests exist), a dozen classes, an MLP on 14x14 images.
TINY = """
name: {name}
description: report tests, a few Omniglot classes, seconds of training
seed: 0
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 12
  test_classes: 8
  image_size: 14
  validation: {{folds: 3, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [64]}}, embedding_dim: 16, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 6, K: 4, iterations: {iterations}}}
evaluation:
  metrics: [precision_at_1, r_precision, map_at_r, recall_at_k, lake_accuracy]
  primary: map_at_r
  ks: [1, 2]
tuning: {{trials: 1, startup_trials: 1}}
final: {{seeds: 3}}
grid:
  losses:
{losses}
  miners: [{{name: none}}, {{name: batch_hard}}, {{name: batch_all}}]
"""
LOSSES = """\
    - {name: triplet, miners: [batch_hard, batch_all]}
    - {name: contrastive, miners: [none]}"""
CELLS = ("triplet+batch_hard", "triplet+batch_all", "contrastive+none")


def run_sweep(
    base: Path, key: str, iterations: int, data_root: Path, name: str = "reports-tiny", losses: str = LOSSES
) -> Path:
    """`dmlbench run` on the tiny protocol; returns results/<name>/ (cached under `base`/`key`)."""
    results = base / key / "results"
    done = base / key / "done"
    lock = base / f"{key}.lock"
    base.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(base / key, ignore_errors=True)
            (base / key).mkdir()
            proto = base / key / f"{name}.yaml"
            proto.write_text(TINY.format(name=name, iterations=iterations, losses=losses))
            runs = base / key / "runs"
            code = main(
                [
                    "run",
                    str(proto),
                    "--results-dir",
                    str(results),
                    "--data-root",
                    str(data_root),
                    "--storage",
                    f"sqlite:///{runs / 'optuna.db'}",
                    "--tracking-uri",
                    str(runs / "mlflow.db"),
                    "--quiet",
                ]
            )
            if code != 0:
                pytest.fail(f"the tiny sweep {key} failed (exit {code})")
            done.write_text("ok")
    return results / name


@pytest.fixture(scope="session")
def sweep_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Under xdist each worker's basetemp is a child of the session's, which they share;
    # without xdist the basetemp itself is the session's (its parent outlives the session).
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "report-sweeps"


@pytest.fixture(scope="session")
def sweep(sweep_base: Path, data_root: Path) -> Path:
    """results/reports-tiny/ of a real run (do not modify: copy it first)."""
    return run_sweep(sweep_base, "main", 30, data_root)


@pytest.fixture()
def sweep_copy(sweep: Path, tmp_path: Path) -> Path:
    """A private copy of the sweep's results directory, safe to modify."""
    dst = tmp_path / sweep.name
    shutil.copytree(sweep, dst)
    return dst
