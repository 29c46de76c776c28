"""The training loop, evaluation, MLflow tracking and `dmlbench train`, on real Omniglot."""

from __future__ import annotations

import math
import re
from pathlib import Path

import optuna
import pytest
import torch
from mlflow.tracking import MlflowClient

from bench.cli import main
from bench.data import LabeledData, load
from bench.data.splits import ClassSplit, fingerprint
from bench.errors import BenchError, DivergedError, MethodError
from bench.evaluation import embed, evaluate
from bench.registry import build_trunk
from bench.stores import provenance, tracking
from bench.stores.mlflow_runs import MlflowWriter
from bench.training import SYNC_EVERY, TrainConfig, augment, train


@pytest.fixture(scope="module")
def omniglot(data_root: Path) -> tuple[LabeledData, LabeledData]:
    """40 background classes to train on, 40 evaluation classes to test on (800 images each)."""
    background = load("omniglot:background", data_root, 28)
    evaluation = load("omniglot:evaluation", data_root, 28)
    return background.subset(background.classes[:40]), evaluation.subset(evaluation.classes[:40])


def quick(**changes) -> TrainConfig:
    base = dict(
        trunk="mlp",
        embedding_dim=64,
        loss="triplet",
        loss_params={"margin": 0.2},
        miner="batch_hard",
        P=8,
        K=4,
        iterations=30,
        seed=0,
    )
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


class _Raises(torch.nn.Module):
    """A loss (or miner) that raises ``error`` from its ``at``-th call on (a plugin's bug, a shape error)."""

    def __init__(self, error: BaseException, at: int = 1) -> None:
        super().__init__()
        self.error, self.at, self.calls = error, at, 0

    def forward(self, embeddings, labels, indices_tuple=None):
        self.calls += 1
        if self.calls >= self.at:
            raise self.error
        return embeddings.pow(2).mean()


def test_a_loss_or_miner_that_raises_is_a_method_error_at_its_iteration(omniglot, monkeypatch) -> None:
    """The method's exception, one line with its type, and the step it came from; a bad return value alike."""
    import bench.registry

    train_data, _ = omniglot
    monkeypatch.setattr(bench.registry, "build_loss", lambda *a, **k: _Raises(RuntimeError("boom\nsecond line"), 3))
    with pytest.raises(MethodError) as info:
        train(quick(miner=None, iterations=10), train_data)
    assert str(info.value) == "loss triplet raised RuntimeError: boom" and info.value.iteration == 3
    assert isinstance(info.value, BenchError) and info.value.exit_code == 1
    monkeypatch.setattr(bench.registry, "build_loss", lambda *a, **k: lambda e, y, t=None: e[:, :2])
    with pytest.raises(MethodError, match=r"loss triplet raised TypeError: returned \(32, 2\)"):
        train(quick(miner=None, iterations=10), train_data)
    monkeypatch.undo()
    real_miner = bench.registry.build_miner
    monkeypatch.setattr(bench.registry, "build_miner", lambda *a, **k: _Raises(IndexError("index 40 is out of bounds")))
    with pytest.raises(MethodError, match=r"^miner batch_hard raised IndexError: index 40 is out of bounds$") as info:
        train(quick(iterations=10), train_data)
    assert info.value.iteration == 1

    class Binds:
        def bind_loss(self, loss):
            raise AttributeError("no margin")

    monkeypatch.setattr(bench.registry, "build_miner", lambda *a, **k: Binds())
    with pytest.raises(MethodError, match=r"miner batch_hard \(bind_loss\) raised AttributeError: no margin"):
        train(quick(iterations=10), train_data)
    monkeypatch.setattr(bench.registry, "build_miner", real_miner)


@pytest.mark.parametrize(
    "error",
    [
        KeyboardInterrupt(),
        torch.OutOfMemoryError("CUDA out of memory"),
        MemoryError(),
        BenchError("a user error"),
        DivergedError(2, math.nan),
    ],
    ids=["interrupt", "oom", "memory", "bench-error", "diverged"],
)
def test_what_is_not_the_methods_failure_passes_unchanged(omniglot, monkeypatch, error) -> None:
    import bench.registry

    train_data, _ = omniglot
    monkeypatch.setattr(bench.registry, "build_loss", lambda *a, **k: _Raises(error, 2))
    with pytest.raises(type(error)) as info:
        train(quick(miner=None, iterations=10), train_data)
    assert info.value is error


def test_an_error_embedding_for_a_dataset_level_miner_is_the_harnesses(omniglot, monkeypatch) -> None:
    import bench.training

    def broken(*args, **kwargs):
        raise RuntimeError("the harness's bug")

    train_data, _ = omniglot
    monkeypatch.setattr(bench.training, "embed", broken)
    config = quick(miner="offline", miner_params={"refresh_every": 10, "triplets_per_batch": 16}, iterations=4)
    with pytest.raises(RuntimeError, match="the harness's bug") as info:
        train(config, train_data)
    assert not isinstance(info.value, MethodError)


def test_steps_without_a_valid_tuple_do_not_crash(omniglot) -> None:
    train_data, _ = omniglot
    # a semi-hard window of 1e-6 almost never holds a negative: most batches give no triplet at all
    result = train(quick(miner="semihard", miner_params={"margin": 1e-6}, iterations=10), train_data)
    assert result.status == "ok"
    assert "had no valid tuple" in result.reason


def test_checkpoints_and_progress_are_called_and_may_prune(omniglot) -> None:
    train_data, _ = omniglot
    seen, reports = [], []
    train(
        quick(iterations=SYNC_EVERY * 2),
        train_data,
        checkpoint_every=10,
        on_checkpoint=lambda it, model: seen.append((it, model.training)),
        progress=lambda it, total, loss: reports.append((it, total, loss)),
    )
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


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"P": 41}, "has 40 classes"),
        ({"K": 1}, "K must be at least 2"),
        ({"lr": -1.0}, "lr must be"),
        ({"optimizer": "lbfgs"}, "unknown optimizer"),
        ({"loss": "nope"}, "unknown loss 'nope'"),
        ({"augmentation": "mixup"}, "unknown augmentation"),
        ({"device": "gpu0"}, "unknown device"),
        ({"loss_params": {"margn": 1}}, "no parameter 'margn'"),
    ],
)
def test_bad_configs_are_bench_errors(omniglot, changes: dict, message: str) -> None:
    with pytest.raises(BenchError, match=message):
        train(quick(**changes), omniglot[0])


def test_embed_restores_the_mode_and_batches(omniglot) -> None:
    model = build_trunk("conv4", in_shape=(1, 28, 28), embedding_dim=8).train()
    x = omniglot[1].x[:70]
    out = embed(model, x, batch_size=32)
    assert out.shape == (70, 8) and not out.requires_grad and model.training
    assert torch.allclose(out, embed(model, x, batch_size=70), atol=1e-5)  # eval mode: no batch statistics


def test_embed_on_the_cpu_runs_channels_last_in_small_batches_and_leaves_the_model_as_it_was(omniglot) -> None:
    """The CPU evaluation path (`bench.evaluation.evaluation_batch`, `_channels_last_on_cpu`, `_folded`): the same
    embeddings as the model run plainly over the whole set, running statistics included, the model's memory
    order put back and its BatchNorm kept, a channels-last model left channels-last."""
    from bench.evaluation import evaluation_batch

    x = omniglot[1].x[:300]
    assert evaluation_batch(x, 512, torch.device("cpu")) == 64  # 28x28: 2^16 values / 784 a image, a power of two
    assert evaluation_batch(torch.zeros(2, 3, 224, 224), 512, torch.device("cpu")) == 16  # never below the minimum
    assert evaluation_batch(x, 64, torch.device("cpu")) == 64 and evaluation_batch(x, 512, torch.device("meta")) == 512
    model = build_trunk("conv4", in_shape=(1, 28, 28), embedding_dim=8).eval()
    with torch.no_grad():
        plain = model(x)
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.in_channels > 1)
    assert conv.weight.is_contiguous() and not conv.weight.is_contiguous(memory_format=torch.channels_last)
    out = embed(model, x)
    assert torch.allclose(out, plain, atol=1e-5)
    assert conv.weight.is_contiguous()  # put back
    norm = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert isinstance(norm, torch.nn.BatchNorm2d)  # folded only in the copy that embedded
    norm.running_mean.add_(0.3)
    norm.running_var.mul_(2.0)  # statistics a trained model has: the fold must carry them
    with torch.no_grad():
        plain = model(x)
    assert torch.allclose(embed(model, x), plain, atol=1e-5)
    model.to(memory_format=torch.channels_last)
    assert torch.allclose(embed(model, x), plain, atol=1e-5)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)  # left as it was


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
    tags = provenance.standard_tags(split_fingerprint="abc123", cell="triplet+batch_hard")
    writer = MlflowWriter(uri, "unit", tags)
    with writer.recording("parent") as run_id:
        writer.log(
            run_id,
            params={**quick().to_dict(), "long": "x" * 10_000},
            metrics={"map_at_r": 0.25, "iterations": 30, "note": "skipped", "inf": float("inf")},
        )
        with writer.recording("child", parent=run_id) as child_id:
            writer.log(child_id, metrics={"value": 1.5}, step=3)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["loss_params.margin"] == "0.2" and run.data.params["miner"] == "batch_hard"
    assert run.data.params["trunk_params"] == "{}"
    assert run.data.params["long"] == "x" * 6000  # cut to what MLflow accepts
    assert run.data.metrics == {"map_at_r": 0.25, "iterations": 30.0, "inf": 1e308}
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
        with MlflowWriter(uri, "unit").recording("boom") as run_id:
            raise RuntimeError("boom")
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "FAILED"


def test_default_store_is_sqlite_under_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.resolve_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/runs/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    assert tracking.resolve_tracking_uri() == "sqlite:///elsewhere.db"
    assert tracking.resolve_tracking_uri(tmp_path / "x" / "f.db") == f"sqlite:///{tmp_path.resolve()}/x/f.db"
    assert provenance.git_commit(tmp_path) == "unknown"


# --------------------------------------------------------------------------- command line


def test_train_command_end_to_end(tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture) -> None:
    uri = f"sqlite:///{tmp_path}/cli.db"
    code = main(
        [
            "train",
            "--data-root",
            str(data_root),
            "--trunk",
            "mlp",
            "--embedding-dim",
            "32",
            "--loss",
            "contrastive",
            "--loss-param",
            "neg_margin=0.8",
            "--miner",
            "batch_all",
            "--P",
            "8",
            "--K",
            "2",
            "--iterations",
            "5",
            "--tracking-uri",
            uri,
            "--experiment",
            "cli",
            "--quiet",
        ]
    )
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


def test_train_command_diverged_run_exits_1_and_is_recorded_failed(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture
) -> None:
    uri = f"sqlite:///{tmp_path}/div.db"
    code = main(
        [
            "train",
            "--data-root",
            str(data_root),
            "--trunk",
            "mlp",
            "--loss-param",
            "normalize=false",
            "--optimizer",
            "sgd",
            "--lr",
            "1e30",
            "--P",
            "8",
            "--iterations",
            "30",
            "--tracking-uri",
            uri,
            "--experiment",
            "div",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "diverged at iteration" in err and err.count("\n") == 1
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("div").experiment_id])
    assert run.info.status == "FAILED"


def test_train_command_precision_schedule_and_geometry_reach_the_run(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture
) -> None:
    uri = f"sqlite:///{tmp_path}/opts.db"
    code = main(
        [
            "train",
            "--data-root",
            str(data_root),
            "--trunk",
            "mlp",
            "--embedding-dim",
            "16",
            "--loss-param",
            "normalize=false",
            "--precision",
            "bf16",
            "--schedule",
            "cosine",
            "--warmup",
            "2",
            "--P",
            "8",
            "--K",
            "2",
            "--iterations",
            "5",
            "--tracking-uri",
            uri,
            "--experiment",
            "opts",
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("opts").experiment_id])
    assert run.data.params["precision"] == "bf16"
    assert run.data.params["schedule.type"] == "cosine" and run.data.params["schedule.warmup"] == "2"
    assert run.data.params["geometry"] == "raw"  # evaluated in the geometry the loss trained in


def test_a_single_run_is_evaluated_in_the_geometry_its_loss_trained_in() -> None:
    from bench.single_run import trained_normalized

    assert trained_normalized(TrainConfig(loss="contrastive")) is True  # the loss's default
    assert trained_normalized(TrainConfig(loss="triplet", loss_params={"normalize": False})) is False
    assert trained_normalized(TrainConfig(loss="pml:arcface")) is True  # no such parameter: PML normalises


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--loss", "no_such_loss"],
        ["train", "--loss-param", "margin"],
        ["train", "--miner-param", "margin=0.1"],
        ["train", "--precision", "fp16"],  # on the CPU
        ["train", "--schedule", "cosine", "--warmup", "10", "--iterations", "10"],
    ],
)
def test_train_command_rejects_bad_input_in_one_line(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dmlbench: error:") and err.count("\n") == 1


def test_train_refuses_too_few_classes_for_P_before_recording_a_run(tmp_path, capsys) -> None:
    """P classes a batch on data with fewer: one line, exit 2, and the MLflow store holds no run for it (a
    refusal of the input is not a failed run); a run that can train is then recorded as usual."""
    from _shared import write_folder
    from mlflow.tracking import MlflowClient

    pool = write_folder(tmp_path / "faces", ["ann", "bob", "cid", "dan", "eve", "fay"])
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = [
        "train", "--data", f"folder:{pool}", "--split", "0.5", "--trunk", "mlp", "--embedding-dim", "8",
        "--size", "8", "--K", "2", "--iterations", "2", "--threads", "1", "--tracking-uri", store, "--quiet",
    ]  # fmt: skip
    assert main([*common, "--P", "4"]) == 2  # 3 training classes
    err = capsys.readouterr().err
    assert err == "dmlbench: error: P=4 classes per batch, but the training data has 3 classes\n"
    client = MlflowClient(tracking_uri=store)
    runs = lambda: [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]  # noqa: E731
    assert runs() == []
    assert main([*common, "--P", "3"]) == 0
    assert [r.info.status for r in runs()] == ["FINISHED"]


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
        unit.norm(dim=1), torch.ones(len(unit))
    )

    raw = evaluate(model, test_data, lake_runs=runs, clustering=False)
    normalised = evaluate(model, test_data, lake_runs=runs, clustering=False, normalize=True)
    assert abs(raw["map_at_r"] - normalised["map_at_r"]) > 1e-3  # the two geometries rank differently
    assert raw == {k: v for k, v in retrieval_metrics(raw_emb, test_data.y).items() if k != "num_queries"} | {
        "lake_accuracy": pytest.approx(lake_runs_accuracy(lambda x: embed(model, x), runs)["accuracy"])
    }
    expected = retrieval_metrics(unit, test_data.y)  # every metric, Lake's runs included, on unit rows
    assert all(normalised[k] == expected[k] for k in expected if k != "num_queries")
    lake = lake_runs_accuracy(lambda x: torch.nn.functional.normalize(embed(model, x), dim=1), runs)["accuracy"]
    assert normalised["lake_accuracy"] == pytest.approx(lake)

    calc = AccuracyCalculator(
        include=("mean_average_precision_at_r", "precision_at_1"),
        k="max_bin_count",
        knn_func=CustomKNN(LpDistance(normalize_embeddings=False)),
        device=torch.device("cpu"),
    )
    theirs = calc.get_accuracy(unit, test_data.y)
    assert normalised["map_at_r"] == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-6)
    assert normalised["precision_at_1"] == pytest.approx(theirs["precision_at_1"], abs=1e-6)


# --------------------------------------------------------------------------- precision and LR schedule


def _batch_hard_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Triplet + batch-hard on fixed PK batches, in fp32 and eval mode: the yardstick for 'the loss went down'."""
    from bench.data.samplers import PKSampler
    from bench.registry import build_loss, build_miner

    loss, miner = build_loss("triplet", margin=0.2), build_miner("batch_hard")
    model.eval()
    with torch.no_grad():
        values = []
        for step in range(4):
            idx = PKSampler(y, 8, 4, seed=99).batch(step)
            emb = model(x[idx]).float()
            values.append(float(loss(emb, y[idx], miner(emb, y[idx]))))
    return sum(values) / len(values)


def test_bf16_run_trains_in_bf16_with_channels_last(omniglot) -> None:
    train_data, _ = omniglot
    config = quick(trunk="conv4", iterations=80, precision="bf16")
    torch.manual_seed(config.seed)  # train() seeds the same way before building the trunk
    untrained = build_trunk("conv4", in_shape=(1, 28, 28), embedding_dim=64)
    seen: dict[str, object] = {}

    def watch(it: int, trunk: torch.nn.Module) -> None:  # from iteration 10 on, record what the forward returns
        conv = next(p for p in trunk.parameters() if p.ndim == 4)
        seen["channels_last"] = conv.is_contiguous(memory_format=torch.channels_last) and conv.stride(1) == 1
        if "hook" not in seen:
            seen["hook"] = trunk.register_forward_hook(lambda m, i, out: seen.__setitem__("dtype", out.dtype))

    result = train(config, train_data, checkpoint_every=10, on_checkpoint=watch)
    assert seen["dtype"] == torch.bfloat16 and seen["channels_last"] is True
    _, labels = torch.unique(train_data.y, return_inverse=True)
    before, after = (
        _batch_hard_loss(untrained, train_data.x, labels),
        _batch_hard_loss(result.model, train_data.x, labels),
    )
    assert math.isfinite(result.final_loss) and after < before - 0.01  # fp32 at this budget: 0.218 -> 0.196


def test_losses_on_bf16_embeddings_cast_to_fp32_equal_pml(omniglot) -> None:
    """What the loop does with a bf16 trunk: embeddings cast to fp32, then loss and miner in fp32, as PML's."""
    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.losses import TripletMarginLoss
    from pytorch_metric_learning.miners import BatchHardMiner
    from pytorch_metric_learning.reducers import AvgNonZeroReducer

    from bench.data.samplers import PKSampler
    from bench.registry import build_loss, build_miner

    train_data, _ = omniglot
    _, labels = torch.unique(train_data.y, return_inverse=True)
    torch.manual_seed(0)
    trunk = build_trunk("conv4", in_shape=(1, 28, 28), embedding_dim=64).to(memory_format=torch.channels_last)
    own_loss, own_miner = build_loss("triplet", margin=0.2), build_miner("batch_hard")
    pml_loss = TripletMarginLoss(
        margin=0.2, distance=LpDistance(normalize_embeddings=True, p=2, power=1), reducer=AvgNonZeroReducer()
    )
    for step in range(3):
        idx = PKSampler(labels, 16, 4, seed=1).batch(step)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            raw = trunk(train_data.x[idx].contiguous(memory_format=torch.channels_last))
        assert raw.dtype == torch.bfloat16
        emb, y = raw.float(), labels[idx]
        own = own_loss(emb, y, own_miner(emb, y))
        pml = pml_loss(emb, y, BatchHardMiner()(emb, y))
        assert own.dtype == torch.float32 and float(own) > 0
        assert abs(float(own) - float(pml)) <= 1e-6


def test_fp32_defaults_written_out_are_the_same_run(omniglot) -> None:
    """precision fp32, a constant schedule and channels_last false are today's loop, bit for bit."""
    train_data, _ = omniglot
    plain = train(quick(trunk="conv4", iterations=8), train_data)
    explicit = train(
        quick(trunk="conv4", iterations=8, precision="fp32", channels_last=False, schedule={"type": "constant"}),
        train_data,
    )
    assert plain.final_loss == explicit.final_loss
    assert all(torch.equal(p, q) for p, q in zip(plain.model.parameters(), explicit.model.parameters()))


@pytest.mark.parametrize(
    "schedule, checks",
    [
        ({"type": "constant", "warmup": 4}, {1: 0.25, 3: 0.75, 4: 1.0, 5: 1.0, 100: 1.0}),
        ({"type": "cosine", "warmup": 0}, {1: 1.0, 51: 0.5, 100: 0.5 * (1 + math.cos(math.pi * 99 / 100))}),
        (
            {"type": "cosine", "warmup": 10},
            {5: 0.5, 10: 1.0, 11: 1.0, 56: 0.5, 100: 0.5 * (1 + math.cos(math.pi * 89 / 90))},
        ),
        ({"type": "step", "warmup": 0, "gamma": 0.1, "milestones": [0.5, 0.75]}, {50: 1.0, 51: 0.1, 75: 0.1, 76: 0.01}),
        ({"type": "step", "warmup": 2, "gamma": 0.5, "milestones": [0.01]}, {1: 0.5, 2: 0.5, 3: 0.5, 100: 0.5}),
        # Hermans et al.: constant to t0 = 60, then down to gamma at the end: 0.001 ** ((t - 60) / 40)
        (
            {"type": "exponential", "start": 0.6, "gamma": 0.001},
            {1: 1.0, 60: 1.0, 61: 0.001 ** (1 / 40), 80: 0.001**0.5, 100: 0.001},
        ),
    ],
)
def test_lr_factor_follows_the_formula(schedule: dict, checks: dict) -> None:
    from bench.training import lr_factor, schedule_problem

    assert schedule_problem(schedule, 100) is None
    for it, expected in checks.items():
        assert lr_factor(schedule, it, 100) == pytest.approx(expected, rel=1e-12, abs=1e-15), it


def test_train_applies_the_schedule(omniglot) -> None:
    """Warm-up: the first step at lr/W is the first step of a run at lr/W; a step to ~0 freezes the weights."""
    train_data, _ = omniglot
    snapshots: dict[int, list[torch.Tensor]] = {}

    def keep(it: int, trunk: torch.nn.Module) -> None:
        snapshots.setdefault(it, [p.detach().clone() for p in trunk.parameters()])

    def first_step(lr: float, iterations: int, schedule: dict | None = None) -> list[torch.Tensor]:
        snapshots.clear()
        changes = {"schedule": schedule} if schedule else {}
        train(
            quick(iterations=iterations, lr=lr, optimizer="sgd", **changes),
            train_data,
            checkpoint_every=1,
            on_checkpoint=keep,
        )
        return snapshots[1]

    warm = first_step(1e-3, 11, {"type": "constant", "warmup": 10})
    assert all(torch.allclose(p, q, rtol=0, atol=1e-7) for p, q in zip(warm, first_step(1e-4, 2)))
    assert not all(torch.allclose(p, q, rtol=0, atol=1e-7) for p, q in zip(warm, first_step(1e-3, 2)))
    snapshots.clear()
    frozen = train(
        quick(iterations=20, schedule={"type": "step", "gamma": 1e-30, "milestones": [0.5]}),
        train_data,
        checkpoint_every=5,
        on_checkpoint=keep,
    )
    assert not all(torch.equal(p, q) for p, q in zip(snapshots[5], snapshots[10]))  # full LR up to iteration 10
    assert all(torch.equal(p, q) for p, q in zip(snapshots[10], frozen.model.parameters()))  # then 1e-30 of it


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"precision": "fp8"}, "unknown precision 'fp8'"),
        ({"precision": "fp16"}, "precision fp16 needs a CUDA device"),
        ({"channels_last": "yes"}, "channels_last must be true, false or null"),
        ({"schedule": {"type": "linear"}}, "schedule: unknown type 'linear'"),
        ({"schedule": {"type": "cosine", "warmup": 30}}, r"warmup must be a whole number of iterations in \[0, 30\)"),
        ({"schedule": {"type": "cosine", "gamma": 0.1}}, "a cosine schedule has no 'gamma'"),
        ({"schedule": {"type": "step", "gamma": 0.1, "milestones": [0.8, 0.4]}}, "increasing fractions"),
        ({"schedule": {"type": "step", "milestones": [0.5]}}, "needs gamma in"),
        ({"schedule": {"type": "exponential", "gamma": 0.5}}, "an exponential schedule needs start"),
        (
            {"schedule": {"type": "exponential", "start": 0.5, "gamma": 0.5, "milestones": [0.5]}},
            "an exponential schedule has no 'milestones'",
        ),
    ],
)
def test_bad_precision_and_schedule_are_bench_errors(omniglot, changes: dict, message: str) -> None:
    with pytest.raises(BenchError, match=message):
        train(quick(**changes), omniglot[0])


def test_protocol_training_precision_and_schedule_fields() -> None:
    """Defaults fill in (so writing them out keeps the hash); bad values are one line naming the key."""
    from _shared import MINIMAL

    from bench.protocol import ProtocolError, parse_protocol

    base = parse_protocol(MINIMAL)
    defaults = {"precision": "fp32", "channels_last": None, "schedule": {"type": "constant", "warmup": 0}}
    assert {k: base.doc["training"][k] for k in defaults} == defaults
    line = "training: {optimizer: adam, lr: 1.0e-3, P: 4, K: 2, iterations: 5}"
    written = parse_protocol(MINIMAL.replace(line, line[:-1] + ", precision: fp32, schedule: {type: constant}}"))
    assert written.hash == base.hash
    cosine = parse_protocol(MINIMAL.replace(line, line[:-1] + ", precision: bf16, schedule: {type: cosine}}"))
    assert cosine.doc["training"]["schedule"] == {"type": "cosine", "warmup": 0} and cosine.hash != base.hash
    for extra, message in [
        (", precision: fp8", "training.precision: expected one of fp32, bf16, fp16"),
        (", schedule: {type: step, milestones: [0.5]}", "training.schedule.gamma: missing"),
        (", schedule: {type: exponential, gamma: 0.1}", "training.schedule.start: missing"),
        (
            ", schedule: {type: step, gamma: 0.1, milestones: [1.5]}",
            "training.schedule.milestones[0]: expected a value < 1",
        ),
        (", channels_last: 1", "training.channels_last: expected true or false or null"),
    ]:
        with pytest.raises(ProtocolError, match=re.escape(message)):
            parse_protocol(MINIMAL.replace(line, line[:-1] + extra + "}"))
