"""`dmlbench train`: one trunk, one loss (and miner), evaluated on unseen classes, logged to MLflow.

The quick way to try a method before putting it in a protocol: train on one
set of classes, evaluate retrieval (and Lake's one-shot runs for Omniglot)
on another, record everything needed to rerun it.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from bench.errors import BenchError

DEFAULT_TRAIN = "omniglot:background"
DEFAULT_TEST = "omniglot:evaluation"


def parse_params(pairs: tuple[str, ...], option: str) -> dict[str, Any]:
    """``k=v`` strings to a dict, each value read as a YAML scalar (``0.2``, ``true``, ``[64, 32]``)."""
    import yaml

    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise BenchError(f"{option} expects NAME=VALUE, got {pair!r}")
        try:
            params[key.strip()] = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            raise BenchError(f"{option} {key.strip()}: cannot read value {text!r}") from None
    return params


def _check_names(config) -> None:
    """Unknown names and parameters fail in a second, before data, models and MLflow are loaded."""
    from bench import registry

    for kind, name, params in (("trunk", config.trunk, config.trunk_params),
                               ("loss", config.loss, config.loss_params),
                               ("miner", config.miner, config.miner_params)):
        if name is None:
            if params:
                raise BenchError("--miner-param given without --miner")
            continue
        registry.check_params(registry.get(kind, name), params)
    config.check()


def split_fingerprints(train_classes: tuple[int, ...], test_classes: tuple[int, ...]) -> dict[str, str]:
    """The fingerprint of the train/test split and of each side, as the results tables name them."""
    from bench.splits import ClassSplit, fingerprint

    train, test = ClassSplit("train", train_classes), ClassSplit("test", test_classes)
    return {"split": fingerprint(train, test), "train": train.fingerprint, "test": test.fingerprint}


def _table(metrics: dict[str, float]) -> str:
    width = max(map(len, metrics))
    return "\n".join(f"{name:<{width}}  {value:.4f}" for name, value in metrics.items())


@click.command("train")
@click.option("--data", "train_spec", default=DEFAULT_TRAIN, show_default=True, help="training classes (dataset spec)")
@click.option("--test-data", "test_spec", default=DEFAULT_TEST, show_default=True,
              help="test classes (dataset spec), disjoint from the training classes")
@click.option("--data-root", default=None, help="folder holding the datasets (default: $DMLBENCH_DATA, ../shared/data)")
@click.option("--size", default=28, show_default=True, help="image side in pixels")
@click.option("--trunk", default="conv4", show_default=True)
@click.option("--trunk-param", multiple=True, metavar="NAME=VALUE", help="trunk parameter (repeatable)")
@click.option("--embedding-dim", default=128, show_default=True)
@click.option("--loss", default="triplet", show_default=True)
@click.option("--loss-param", multiple=True, metavar="NAME=VALUE", help="loss parameter, a YAML scalar (repeatable)")
@click.option("--miner", default=None, help="miner (default: none, every valid tuple of the batch)")
@click.option("--miner-param", multiple=True, metavar="NAME=VALUE", help="miner parameter (repeatable)")
@click.option("--P", "P", default=32, show_default=True, help="classes per batch")
@click.option("--K", "K", default=4, show_default=True, help="samples per class in a batch")
@click.option("--iterations", default=1000, show_default=True)
@click.option("--optimizer", type=click.Choice(["adam", "sgd"]), default="adam", show_default=True)
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--weight-decay", default=0.0, show_default=True)
@click.option("--augmentation", type=click.Choice(["shift", "affine"]), default=None)
@click.option("--seed", default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--tracking-uri", default=None,
              help="MLflow URI or path (default: $MLFLOW_TRACKING_URI, else ./runs/mlflow.db)")
@click.option("--experiment", default="dmlbench-train", show_default=True, help="MLflow experiment")
@click.option("--quiet", is_flag=True, help="no progress bar")
def command(train_spec: str, test_spec: str, data_root: str | None, size: int, trunk: str,
            trunk_param: tuple[str, ...], embedding_dim: int, loss: str, loss_param: tuple[str, ...],
            miner: str | None, miner_param: tuple[str, ...], P: int, K: int, iterations: int, optimizer: str,
            lr: float, weight_decay: float, augmentation: str | None, seed: int, device: str,
            tracking_uri: str | None, experiment: str, quiet: bool) -> None:
    """Train one trunk with one loss (and miner), evaluate on the test classes, log to MLflow."""
    from bench.training import TrainConfig

    config = TrainConfig(
        trunk=trunk, trunk_params=parse_params(trunk_param, "--trunk-param"), embedding_dim=embedding_dim,
        loss=loss, loss_params=parse_params(loss_param, "--loss-param"), miner=miner,
        miner_params=parse_params(miner_param, "--miner-param"), optimizer=optimizer, lr=lr,
        weight_decay=weight_decay, P=P, K=K, iterations=iterations, seed=seed, augmentation=augmentation,
        device=device,
    )
    _check_names(config)
    metrics, run_id, uri = run(config, train_spec, test_spec, data_root, size, tracking_uri, experiment, quiet)
    click.echo(_table(metrics))
    click.echo(f"MLflow run {run_id} in {uri}")


def run(config, train_spec: str, test_spec: str, data_root: str | None, size: int, tracking_uri: str | None,
        experiment: str, quiet: bool = True) -> tuple[dict[str, float], str, str]:
    """Load, train, evaluate and record; returns the metrics, the MLflow run id and the tracking URI."""
    from tqdm import tqdm

    from bench import data as datasets
    from bench import tracking
    from bench.training import evaluate, train

    train_data = datasets.load(train_spec, data_root, size)
    test_data = datasets.load(test_spec, data_root, size)
    shared = set(train_data.classes) & set(test_data.classes)
    if shared:
        raise BenchError(f"{train_spec} and {test_spec} share {len(shared)} classes: the test classes must be unseen")
    lake_runs = datasets.load_lake_runs(data_root, size) if test_spec == DEFAULT_TEST else None

    uri = tracking.resolve_tracking_uri(tracking_uri)
    prints = split_fingerprints(train_data.classes, test_data.classes)
    tags = tracking.standard_tags(prints["split"], train_fingerprint=prints["train"],
                                  test_fingerprint=prints["test"], train_data=train_spec, test_data=test_spec,
                                  command="train")
    run_name = f"{config.loss}+{config.miner or 'none'}/{config.trunk}/seed{config.seed}"
    with tracking.start_run(experiment, run_name, tags, tracking_uri=uri) as run_id:
        tracking.log_params({**config.to_dict(), "train_data": train_spec, "test_data": test_spec, "size": size})
        bar = tqdm(total=config.iterations, desc="train", unit="it", file=sys.stderr, disable=quiet, leave=False)

        def progress(iteration: int, total: int, loss: float) -> None:
            bar.update(iteration - bar.n)
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

        try:
            result = train(config, train_data, progress=progress)
        finally:
            bar.close()
        metrics = evaluate(result.model, test_data, lake_runs=lake_runs, device=config.device, seed=config.seed)
        tracking.log_metrics({**metrics, "final_loss": result.final_loss, "wall_time_s": result.wall_time_s,
                              "samples_seen": result.samples_seen, "iterations": result.iterations})
        if result.reason:
            tracking.log_params({"train_note": result.reason})
    return metrics, run_id, uri
