"""What several test folders share: the runner's tiny protocol, a sweep's options and `run` arguments, the CLI in a
child process,
an image folder of learnable classes, the smallest valid protocol, a script of scripts/ or benchmarks/ as a
module."""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

from bench.sweep.worker import Options

RUNNER_TINY = """\
name: tiny
seed: 3
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 12
  test_classes: 6
  image_size: 12
  validation: {folds: 3, use: 1, group_by: alphabet}
model: {trunk: mlp, trunk_params: {hidden: [32]}, embedding_dim: 8, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 4, K: 4, iterations: ITERATIONS}
evaluation: {metrics: [precision_at_1, map_at_r, recall_at_k, nmi, lake_accuracy], primary: map_at_r, ks: [1, 2]}
tuning: {trials: 2}
final: {seeds: [0, 1]}
grid:
  losses:
    - {name: triplet}
    - name: contrastive
      label: contrastive-diverging      # a margin of 1e30, squared, is inf: every trial diverges
      params: {form: hadsell, pos_margin: 0.0, neg_margin: 1.0e+30}   # fixed: a searched one would be dead
      miners: [none]
  miners: [{name: none}, {name: batch_hard}]
"""


MINIMAL = """\
name: tiny
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 12
  test_classes: 6
  image_size: 16
  validation: {folds: 3}
model: {trunk: mlp, embedding_dim: 8, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 4, K: 2, iterations: 5}
evaluation: {metrics: [map_at_r, precision_at_1], primary: map_at_r}
tuning: {trials: 1}
final: {seeds: 1}
grid:
  losses:
    - name: triplet
      search_space:
        margin: {type: float, low: 0.05, high: 0.5}
  miners: [{name: none}, {name: batch_hard}]
"""


# the runner's tiny protocol with its two triplet cells alone (no diverging cell): a finished sweep exits 0
RUNNER_TINY_TRIPLET = RUNNER_TINY.split("    - name: contrastive")[0] + "  miners: [{name: none}, {name: batch_hard}]\n"


def run_args(path: Path, root: Path, data_root: Path, *extra: str) -> list[str]:
    """`dmlbench run` of the protocol file ``path`` on stores under ``root``: one thread, quiet."""
    return [
        "run",
        str(path),
        "--storage",
        f"sqlite:///{root / 'optuna.db'}",
        "--tracking-uri",
        str(root / "mlruns"),
        "--results-dir",
        str(root / "results"),
        "--data-root",
        str(data_root),
        "--threads",
        "1",
        "--quiet",
        *extra,
    ]


def trials_in_state(db: Path, state: str) -> int:
    """Trials in ``state`` in the Optuna SQLite file ``db``, read while a worker may be writing it (0 when the
    file is missing or busy): for waiting on a sweep's progress before killing it."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return con.execute("select count(*) from trials where state = ?", (state,)).fetchone()[0]
    except sqlite3.Error:
        return 0


def sweep_options(root: Path, data_root: Path, **kw) -> Options:
    return Options(
        storage=f"sqlite:///{root / 'optuna.db'}",
        tracking_uri=str(root / "mlruns"),
        results_dir=root / "results",
        data_root=str(data_root),
        quiet=True,
        **kw,
    )


def cli(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "bench.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        **kw,
    )


def write_folder(
    root: Path, classes: list[str], per_class: int = 4, size: tuple[int, int] = (12, 9), mode: str = "L", seed: int = 0
) -> Path:
    """One sub-folder of small PNGs per class, each class a different mean brightness (so it is learnable)."""
    rng = np.random.default_rng(seed)
    for i, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for j in range(per_class):
            base = (40 + 20 * i) % 256
            pixels = np.clip(base + rng.integers(-10, 10, (size[1], size[0])), 0, 255).astype(np.uint8)
            image = Image.fromarray(pixels, "L")
            (image.convert("RGB") if mode == "RGB" else image).save(root / name / f"{j}.png")
    return root


def load_script(path: str | Path) -> ModuleType:
    """The script at ``path`` (relative to the repository: scripts/ and benchmarks/ are no packages) as a fresh
    module, run as imported (its ``main`` not called)."""
    file = Path(__file__).resolve().parents[1] / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
