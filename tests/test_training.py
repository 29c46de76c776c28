"""The training loop, evaluation, MLflow tracking and `dmlbench train`, on real Omniglot."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import torch
from mlflow.tracking import MlflowClient

from bench import tracking
from bench.cli import main
from bench.data import LabeledData, load
from bench.errors import BenchError, DivergedError
from bench.registry import build_trunk
from bench.splits import ClassSplit, fingerprint
from bench.training import SYNC_EVERY, TrainConfig, augment, embed, evaluate, train


@pytest.fixture(scope="module")
def omniglot(data_root: Path) -> tuple[LabeledData, LabeledData]:
    """40 background classes to train on, 40 evaluation classes to test on (800 images each)."""
    background = load("omniglot:background", data_root, 28)
    evaluation = load("omniglot:evaluation", data_root, 28)
    return background.subset(background.classes[:40]), evaluation.subset(evaluation.classes[:40])


def quick(**changes) -> TrainConfig:
    base = dict(trunk="mlp", embedding_dim=64, loss="triplet", loss_params={"margin": 0.2}, miner="batch_hard",
                P=8, K=4, iterations=30, seed=0)
    return TrainConfig(**{**base, **changes})


def test_short_run_beats_the_untrained_model(omniglot) -> None:
    train_data, test_data = omniglot
    config = quick(iterations=60)
    torch.manual_seed(config.seed)  # train() seeds the same way before building the trunk
    untrained = build_trunk("mlp", in_shape=(1, 28, 28), embedding_dim=64)
    before = evaluate(untrained, test_data, clustering=False)
    result = train(config, train_data)
    after = evaluate(result.model, test_data)
    assert after["map_at_r"] > before["map_at_r"] + 0.02
    assert after["precision_at_1"] > before["precision_at_1"]
    assert set(after) >= {"precision_at_1", "r_precision", "map_at_r", "recall_at_8", "nmi", "ami"}
    assert result.iterations == 60 and result.samples_seen == 60 * 8 * 4
    assert result.status == "ok" and result.wall_time_s > 0 and math.isfinite(result.final_loss)


def test_same_seed_same_run_other_seed_other_run(omniglot) -> None:
    train_data, _ = omniglot
    config = quick(iterations=20, augmentation="affine")
    a, b = train(config, train_data), train(config, train_data)
    c = train(quick(iterations=20, augmentation="affine", seed=1), train_data)
    assert a.final_loss == b.final_loss
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert c.final_loss != a.final_loss


def test_proxy_losses_learn_their_proxies_with_the_trunk(omniglot) -> None:
    train_data, _ = omniglot
    config = quick(loss="pml:proxy_anchor", loss_params={}, miner=None, iterations=10)
    result = train(config, train_data)
    proxies = [p for p in result.loss_module.parameters()]
    assert proxies and proxies[0].shape == (40, 64)  # one proxy per class, labels remapped to 0..39


def test_dataset_level_miner_drives_the_batches(omniglot) -> None:
    train_data, _ = omniglot
    config = quick(miner="offline", miner_params={"refresh_every": 10, "triplets_per_batch": 16}, iterations=12)
    result = train(config, train_data)
    assert 0 < result.samples_seen <= 12 * 16 * 3  # batches are the samples the mined triplets touch
    assert math.isfinite(result.final_loss)


def test_a_nan_loss_raises_diverged_error_at_its_iteration(omniglot) -> None:
    train_data, _ = omniglot
    with pytest.raises(DivergedError) as info:
        train(quick(optimizer="sgd", lr=1e30, loss_params={"normalize": False}, iterations=40), train_data)
    assert 1 <= info.value.iteration <= 40
    assert not math.isfinite(info.value.value)
    assert isinstance(info.value, BenchError)


def test_steps_without_a_valid_tuple_do_not_crash(omniglot) -> None:
    train_data, _ = omniglot
    # a semi-hard window of 1e-6 almost never holds a negative: most batches give no triplet at all
    result = train(quick(miner="semihard", miner_params={"margin": 1e-6}, iterations=10), train_data)
    assert result.status == "ok"
    assert "had no valid tuple" in result.reason


def test_checkpoints_and_progress_are_called_and_may_prune(omniglot) -> None:
    train_data, _ = omniglot
    seen, reports = [], []
    train(quick(iterations=SYNC_EVERY * 2), train_data, checkpoint_every=10,
          on_checkpoint=lambda it, model: seen.append((it, model.training)),
          progress=lambda it, total, loss: reports.append((it, total, loss)))
    assert [it for it, _ in seen] == [10, 20, 30, 40, 50]
    assert [(it, total) for it, total, _ in reports] == [(SYNC_EVERY, 2 * SYNC_EVERY), (2 * SYNC_EVERY, 2 * SYNC_EVERY)]

    def prune(it: int, model: torch.nn.Module) -> None:
        raise optuna.TrialPruned()

    with pytest.raises(optuna.TrialPruned):
        train(quick(iterations=20), train_data, checkpoint_every=5, on_checkpoint=prune)


def test_numpy_integers_from_a_tuner_are_accepted(omniglot) -> None:
    import numpy as np

    result = train(quick(P=np.int64(4), K=np.int64(2), iterations=np.int64(3), seed=np.int64(5)), omniglot[0])
    assert result.samples_seen == 3 * 8


@pytest.mark.parametrize("changes, message", [
    ({"P": 41}, "has 40 classes"), ({"K": 1}, "K must be at least 2"), ({"lr": -1.0}, "lr must be"),
    ({"optimizer": "rmsprop"}, "unknown optimizer"), ({"loss": "nope"}, "unknown loss 'nope'"),
    ({"augmentation": "mixup"}, "unknown augmentation"), ({"device": "gpu0"}, "unknown device"), ({"loss_params": {"margn": 1}}, "no parameter 'margn'"),
])
def test_bad_configs_are_bench_errors(omniglot, changes: dict, message: str) -> None:
    with pytest.raises(BenchError, match=message):
        train(quick(**changes), omniglot[0])


def test_embed_restores_the_mode_and_batches(omniglot) -> None:
    model = build_trunk("conv4", in_shape=(1, 28, 28), embedding_dim=8).train()
    x = omniglot[1].x[:70]
    out = embed(model, x, batch_size=32)
    assert out.shape == (70, 8) and not out.requires_grad and model.training
    assert torch.allclose(out, embed(model, x, batch_size=70), atol=1e-5)  # eval mode: no batch statistics


def test_augmentation_moves_pixels_but_keeps_shape() -> None:
    x = torch.zeros(4, 1, 28, 28)
    x[:, :, 10:18, 10:18] = 1.0
    g = torch.Generator().manual_seed(0)
    out = augment(x, "shift", g)
    assert out.shape == x.shape and not torch.equal(out, x)
    assert torch.equal(augment(x, "shift", torch.Generator().manual_seed(0)), out)


# --------------------------------------------------------------------------- tracking


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One real SQLite store for the tracking tests (creating one costs seconds)."""
    folder = tmp_path_factory.mktemp("store")
    uri = tracking.resolve_tracking_uri(folder)
    assert uri == f"sqlite:///{folder.resolve()}/mlflow.db"
    return uri


def test_mlflow_store_receives_params_metrics_and_tags(store: str) -> None:
    uri = store
    tags = tracking.standard_tags(split_fingerprint="abc123", cell="triplet+batch_hard")
    with tracking.start_run("unit", "parent", tags, tracking_uri=uri) as run_id:
        tracking.log_params(quick().to_dict())
        tracking.log_metrics({"map_at_r": 0.25, "iterations": 30, "note": "skipped"})
        with tracking.start_run("unit", "child", nested=True) as child_id:
            tracking.log_metrics({"value": 1.5}, step=3)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["loss_params.margin"] == "0.2" and run.data.params["miner"] == "batch_hard"
    assert run.data.params["trunk_params"] == "{}"
    assert run.data.metrics == {"map_at_r": 0.25, "iterations": 30.0}
    assert run.data.tags["dmlbench.split_fingerprint"] == "abc123"
    assert run.data.tags["dmlbench.cell"] == "triplet+batch_hard"
    assert run.data.tags["dmlbench.version.torch"] == torch.__version__
    assert len(run.data.tags["dmlbench.git_commit"]) in (40, len("unknown"))
    child = client.get_run(child_id)
    assert child.data.tags["mlflow.parentRunId"] == run_id
    assert [m.step for m in client.get_metric_history(child_id, "value")] == [3]


def test_failed_run_is_marked_failed(store: str) -> None:
    uri = store
    with pytest.raises(RuntimeError):
        with tracking.start_run("unit", "boom", tracking_uri=uri) as run_id:
            raise RuntimeError("boom")
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "FAILED"


def test_default_store_is_sqlite_under_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.resolve_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/runs/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    assert tracking.resolve_tracking_uri() == "sqlite:///elsewhere.db"
    assert tracking.resolve_tracking_uri(tmp_path / "x" / "f.db") == f"sqlite:///{tmp_path.resolve()}/x/f.db"
    assert tracking.git_commit(tmp_path) == "unknown"


# --------------------------------------------------------------------------- command line


def test_train_command_end_to_end(tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture) -> None:
    uri = f"sqlite:///{tmp_path}/cli.db"
    code = main(["train", "--data-root", str(data_root), "--trunk", "mlp", "--embedding-dim", "32",
                 "--loss", "contrastive", "--loss-param", "neg_margin=0.8", "--miner", "batch_all",
                 "--P", "8", "--K", "2", "--iterations", "5", "--tracking-uri", uri, "--experiment", "cli",
                 "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "map_at_r" in out and "lake_accuracy" in out and err == ""
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("cli").experiment_id])
    assert run.data.params["loss_params.neg_margin"] == "0.8" and run.data.params["K"] == "2"
    assert 0.0 <= run.data.metrics["lake_accuracy"] <= 1.0 and run.data.metrics["samples_seen"] == 5 * 16
    train_classes = ClassSplit("train", range(964))
    test_classes = ClassSplit("test", range(964, 964 + 659))
    assert run.data.tags["dmlbench.split_fingerprint"] == fingerprint(train_classes, test_classes)
    assert run.data.tags["dmlbench.test_fingerprint"] == test_classes.fingerprint
    assert run.data.tags["dmlbench.train_data"] == "omniglot:background"


def test_train_command_diverged_run_exits_1_and_is_recorded_failed(tmp_path: Path, data_root: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    uri = f"sqlite:///{tmp_path}/div.db"
    code = main(["train", "--data-root", str(data_root), "--trunk", "mlp", "--loss-param", "normalize=false",
                 "--optimizer", "sgd", "--lr", "1e30", "--P", "8", "--iterations", "30", "--tracking-uri", uri,
                 "--experiment", "div", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "diverged at iteration" in err and err.count("\n") == 1
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("div").experiment_id])
    assert run.info.status == "FAILED"


@pytest.mark.parametrize("argv", [
    ["train", "--loss", "no_such_loss"],
    ["train", "--loss-param", "margin"],
    ["train", "--miner-param", "margin=0.1"],
])
def test_train_command_rejects_bad_input_in_one_line(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dmlbench: error:") and err.count("\n") == 1


class _UnevenNorms(torch.nn.Module):
    """A fixed (untrained, seeded) trunk whose output norms vary with the input by a factor of up to e^6."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = build_trunk("mlp", in_shape=(1, 28, 28), embedding_dim=32)
        self.scale = torch.nn.Linear(28 * 28, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk(x) * torch.exp(3 * torch.tanh(self.scale(x.flatten(1))))


def test_evaluate_in_the_normalised_geometry_when_the_protocol_normalises(omniglot, data_root: Path) -> None:
    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import CustomKNN

    from bench.data import load_lake_runs
    from bench.metrics import lake_runs_accuracy, retrieval_metrics

    _, test_data = omniglot
    model = _UnevenNorms().eval()
    runs = load_lake_runs(data_root, 28)
    raw_emb = embed(model, test_data.x)
    norms = raw_emb.norm(dim=1)
    assert norms.max() / norms.min() > 10  # the raw geometry is far from the sphere
    unit = embed(model, test_data.x, normalize=True)
    assert torch.allclose(unit, torch.nn.functional.normalize(raw_emb, dim=1)) and torch.allclose(
        unit.norm(dim=1), torch.ones(len(unit)))

    raw = evaluate(model, test_data, lake_runs=runs, clustering=False)
    normalised = evaluate(model, test_data, lake_runs=runs, clustering=False, normalize=True)
    assert abs(raw["map_at_r"] - normalised["map_at_r"]) > 1e-3  # the two geometries rank differently
    assert raw == {k: v for k, v in retrieval_metrics(raw_emb, test_data.y).items() if k != "num_queries"} | {
        "lake_accuracy": pytest.approx(lake_runs_accuracy(lambda x: embed(model, x), runs)["accuracy"])}
    expected = retrieval_metrics(unit, test_data.y)  # every metric, Lake's runs included, on unit rows
    assert all(normalised[k] == expected[k] for k in expected if k != "num_queries")
    lake = lake_runs_accuracy(lambda x: torch.nn.functional.normalize(embed(model, x), dim=1), runs)["accuracy"]
    assert normalised["lake_accuracy"] == pytest.approx(lake)

    calc = AccuracyCalculator(include=("mean_average_precision_at_r", "precision_at_1"), k="max_bin_count",
                              knn_func=CustomKNN(LpDistance(normalize_embeddings=False)), device=torch.device("cpu"))
    theirs = calc.get_accuracy(unit, test_data.y)
    assert normalised["map_at_r"] == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-6)
    assert normalised["precision_at_1"] == pytest.approx(theirs["precision_at_1"], abs=1e-6)
