"""``evaluation.precision: training``: a real tiny sweep trained in bf16 scores its final seed on the embeddings
of a bf16 forward, and those are what it keeps; the key is part of the protocol's hashes (it changes results),
and absent or written at fp32 it is not. Real Omniglot, MLflow SQLite store and Optuna storage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bench.cli import main
from bench.metrics import retrieval_metrics
from bench.protocol import parse_protocol
from bench.sweep.kept import load_final

PROTOCOL = """
name: scoring-bf16
seed: 0
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 10
  test_classes: 6
  image_size: 14
  validation: {{folds: 3, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [32]}}, embedding_dim: 16, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 4, K: 4, iterations: 6, precision: bf16}}
evaluation: {{metrics: [precision_at_1, map_at_r], primary: map_at_r{precision}}}
tuning: {{trials: 1, startup_trials: 1}}
final: {{seeds: 1}}
grid:
  losses:
    - {{name: triplet, search_space: {{margin: null}}}}
"""


def test_the_key_is_hashed_only_when_it_changes_something() -> None:
    absent = parse_protocol(PROTOCOL.format(precision=""))
    fp32 = parse_protocol(PROTOCOL.format(precision=", precision: fp32"))
    training = parse_protocol(PROTOCOL.format(precision=", precision: training"))
    assert (fp32.hash, fp32.shared_hash) == (absent.hash, absent.shared_hash)
    assert training.hash != absent.hash and training.shared_hash != absent.shared_hash


def test_a_sweep_scores_and_keeps_the_bf16_embeddings(tmp_path: Path, data_root: Path) -> None:
    from bench.data import load

    proto = tmp_path / "scoring-bf16.yaml"
    proto.write_text(PROTOCOL.format(precision=", precision: training"))
    db = tmp_path / "mlflow.db"
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    argv = ["run", str(proto), "--results-dir", str(tmp_path / "results"), "--data-root", str(data_root)]
    assert main([*argv, "--storage", storage, "--tracking-uri", str(db), "--quiet", "--threads", "1"]) == 0
    finals = pd.read_csv(tmp_path / "results" / "scoring-bf16" / "finals.csv")
    kept = load_final(str(db), proto, "triplet+none", 0)
    x, y = kept.embeddings["x"], kept.embeddings["y"]
    recorded = finals[finals["cell"] == "triplet+none"]["map_at_r"].item()
    assert retrieval_metrics(x, y, ks=(1,))["map_at_r"] == pytest.approx(recorded, abs=1e-6)
    test = load("omniglot:evaluation", data_root, size=14)
    images = test.x[torch.isin(test.y, torch.as_tensor(y))]
    model = kept.model.eval()
    with torch.no_grad():
        fp32 = torch.nn.functional.normalize(model(images), dim=1).numpy()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = torch.nn.functional.normalize(model(images).float(), dim=1).numpy()
    assert np.abs(bf16 - fp32).max() > 1e-3  # the two forwards differ, so the next line tells which one scored
    assert np.allclose(x, bf16, atol=1e-6)
