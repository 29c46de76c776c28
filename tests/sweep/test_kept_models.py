"""A real tiny sweep keeps each final seed's model and test embeddings in MLflow, and `load_final` reads them back.

The same sweep checks `tuning.unsearched: one`: its cell that searches
nothing records one trial, the audit takes it, and the leaderboard says so.
Real Omniglot, the real MLflow SQLite store and Optuna storage.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bench.cli import main
from bench.errors import BenchError
from bench.metrics import retrieval_metrics
from bench.protocol import load_protocol, parse_protocol
from bench.sweep.kept import load_final

PROTOCOL = """
name: kept-tiny
seed: 0
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 10
  test_classes: 6
  image_size: 14
  validation: {{folds: 3, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [32]}}, embedding_dim: 16, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 4, K: 4, iterations: 6}}
evaluation: {{metrics: [precision_at_1, map_at_r], primary: map_at_r}}
tuning: {{trials: 2, startup_trials: 1, unsearched: one}}
final: {{seeds: 2{keep}}}
grid:
  losses:
    - {{name: triplet}}
    - {{name: triplet, label: fixed, search_space: {{margin: null}}}}
    - {{name: "pml:NormalizedSoftmaxLoss", label: nsoftmax}}
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kept")
    proto = root / "kept-tiny.yaml"
    proto.write_text(PROTOCOL.format(keep=""))
    db = root / "mlflow.db"
    code = main(
        [
            "run",
            str(proto),
            "--results-dir",
            str(root / "results"),
            "--data-root",
            str(data_root),
            "--storage",
            f"sqlite:///{root / 'optuna.db'}",
            "--tracking-uri",
            str(db),
            "--quiet",
            "--threads",
            "1",
        ]
    )
    assert code == 0
    return {"proto": proto, "db": db, "results": root / "results" / "kept-tiny", "data": data_root}


def test_a_cell_that_searches_nothing_ran_one_trial(sweep: dict[str, Path]) -> None:
    trials = pd.read_csv(sweep["results"] / "trials.csv")
    assert trials.groupby("cell").size().to_dict() == {"triplet+none": 2, "fixed+none": 1, "nsoftmax+none": 2}
    finals = pd.read_csv(sweep["results"] / "finals.csv")
    assert set(finals["cell"]) == {"triplet+none", "fixed+none", "nsoftmax+none"}  # the audit took one trial
    board = (sweep["results"] / "leaderboard.md").read_text()
    fixed = next(line for line in board.splitlines() if "`fixed+none`" in line)
    assert "nothing searched: one tuning trial" in fixed and "1 trials (1 complete)" in fixed
    searched = next(line for line in board.splitlines() if "`triplet+none`" in line)
    assert "nothing searched" not in searched


def test_load_final_gives_the_model_and_embeddings_that_were_scored(sweep: dict[str, Path]) -> None:
    from bench.data import load

    finals = pd.read_csv(sweep["results"] / "finals.csv")
    for seed in (0, 1):
        kept = load_final(str(sweep["db"]), sweep["proto"], "triplet+none", seed)
        x, y = kept.embeddings["x"], kept.embeddings["y"]
        assert x.shape[1] == 16 and len(x) == len(y) and kept.info["seed"] == seed
        assert np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)  # the geometry the metrics used
        # the recorded test score is the stored embeddings' score
        recorded = finals[(finals["cell"] == "triplet+none") & (finals["seed"] == seed)]["map_at_r"].item()
        assert retrieval_metrics(x, y, ks=(1,))["map_at_r"] == pytest.approx(recorded, abs=1e-6)
        # the model read back embeds the test images into those embeddings
        test = load("omniglot:evaluation", sweep["data"], size=14)
        keep = torch.isin(test.y, torch.as_tensor(y))
        assert int(keep.sum()) == len(y)
        with torch.no_grad():
            again = torch.nn.functional.normalize(kept.model(test.x[keep]), dim=1)
        assert torch.allclose(again, torch.as_tensor(x), atol=1e-4)
        assert kept.losses == [None]  # the triplet loss has no parameters of its own
    one, two = (load_final(str(sweep["db"]), sweep["proto"], "triplet+none", s).embeddings["x"] for s in (0, 1))
    assert not np.allclose(one, two)  # two seeds, two models


def test_a_loss_with_parameters_keeps_them(sweep: dict[str, Path]) -> None:
    kept = load_final(str(sweep["db"]), sweep["proto"], "nsoftmax+none", 0)
    (state,) = kept.losses
    assert state is not None and any(v.shape == (16, 10) for v in state.values())  # one weight column per class


def test_load_final_refuses_what_it_cannot_find(sweep: dict[str, Path], tmp_path: Path) -> None:
    db, proto = str(sweep["db"]), sweep["proto"]
    with pytest.raises(BenchError, match="no cell 'nope\\+none'"):
        load_final(db, proto, "nope+none", 0)
    with pytest.raises(BenchError, match="final seeds are 0, 1, not 7"):
        load_final(db, proto, "triplet+none", 7)
    other = tmp_path / "kept-tiny.yaml"
    other.write_text(PROTOCOL.format(keep="").replace("iterations: 6", "iterations: 7"))
    with pytest.raises(BenchError, match="no finished final seed 0 of triplet\\+none under kept-tiny@"):
        load_final(db, other, "triplet+none", 0)


def test_keep_models_is_in_no_hash() -> None:
    """Keeping the models changes no result: turning it off is the same protocol, its records reused."""
    kept = parse_protocol(PROTOCOL.format(keep=""))
    for value in ("true", "false"):
        other = parse_protocol(PROTOCOL.format(keep=f", keep_models: {value}"))
        assert (other.hash, other.shared_hash) == (kept.hash, kept.shared_hash)
    assert load_protocol(Path(__file__).resolve().parents[2] / "protocols" / "omniglot-quick.yaml").hash12 == (
        "4b7f40195b11"
    )
