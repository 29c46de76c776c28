"""`dmlbench train`: one trunk, one loss (and miner), evaluated on unseen classes, logged to MLflow.

A thin layer over `bench.single_run.train_and_evaluate`: this module only
reads options (``NAME=VALUE`` parameters as YAML scalars) and prints.
"""

from __future__ import annotations

from typing import Any

import click

from bench.commands._output import emit, format_option, log, quiet_option
from bench.errors import BenchError
from bench.single_run import DEFAULT_TEST, DEFAULT_TRAIN


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


def _table(metrics: dict[str, float]) -> str:
    width = max(map(len, metrics))
    return "\n".join(f"{name:<{width}}  {value:.4f}" for name, value in metrics.items())


@click.command("train")
@click.option("--data", "train_spec", default=DEFAULT_TRAIN, show_default=True, help="training classes (dataset spec)")
@click.option("--test-data", "test_spec", default=DEFAULT_TEST, show_default=True,
              help="test classes (dataset spec), disjoint from the training classes")
@click.option("--data-root", default=None, help="folder holding the datasets (default: $DMLBENCH_DATA, ../shared/data)")
@click.option("--size", default=28, show_default=True, help="image side in pixels")
@click.option("--trunk", default="conv4", show_default=True, help="trunk name (see `dmlbench list --kind trunk`)")
@click.option("--trunk-param", multiple=True, metavar="NAME=VALUE", help="trunk parameter (repeatable)")
@click.option("--embedding-dim", default=128, show_default=True, help="size of the embedding")
@click.option("--loss", default="triplet", show_default=True, help="loss name (see `dmlbench list --kind loss`)")
@click.option("--loss-param", multiple=True, metavar="NAME=VALUE", help="loss parameter, a YAML scalar (repeatable)")
@click.option("--miner", default=None, help="miner (default: none, every valid tuple of the batch)")
@click.option("--miner-param", multiple=True, metavar="NAME=VALUE", help="miner parameter (repeatable)")
@click.option("--P", "P", default=32, show_default=True, help="classes per batch")
@click.option("--K", "K", default=4, show_default=True, help="samples per class in a batch")
@click.option("--iterations", default=1000, show_default=True, help="training iterations (batches)")
@click.option("--optimizer", type=click.Choice(["adam", "sgd"]), default="adam", show_default=True,
              help="optimizer")
@click.option("--lr", default=1e-3, show_default=True, help="learning rate")
@click.option("--weight-decay", default=0.0, show_default=True, help="L2 weight decay of the optimizer")
@click.option("--augmentation", type=click.Choice(["shift", "affine"]), default=None,
              help="training augmentation (default: none)")
@click.option("--seed", default=0, show_default=True, help="seed of weights, batches and augmentation")
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda:0")
@click.option("--tracking-uri", default=None,
              help="MLflow URI or path (default: $MLFLOW_TRACKING_URI, else ./runs/mlflow.db)")
@click.option("--experiment", default="dmlbench-train", show_default=True, help="MLflow experiment")
@format_option
@quiet_option
def command(train_spec: str, test_spec: str, data_root: str | None, size: int, trunk: str,
            trunk_param: tuple[str, ...], embedding_dim: int, loss: str, loss_param: tuple[str, ...],
            miner: str | None, miner_param: tuple[str, ...], P: int, K: int, iterations: int, optimizer: str,
            lr: float, weight_decay: float, augmentation: str | None, seed: int, device: str,
            tracking_uri: str | None, experiment: str, fmt: str, quiet: bool) -> int:
    """Train one trunk with one loss (and miner), evaluate on the test classes, log to MLflow.

    Exit 1 when the loss diverges (the MLflow run is recorded as failed).
    """
    from bench.single_run import check_config, train_and_evaluate
    from bench.training import TrainConfig

    miner_params = parse_params(miner_param, "--miner-param")
    if miner is None and miner_params:
        raise BenchError("--miner-param given without --miner")
    config = TrainConfig(
        trunk=trunk, trunk_params=parse_params(trunk_param, "--trunk-param"), embedding_dim=embedding_dim,
        loss=loss, loss_params=parse_params(loss_param, "--loss-param"), miner=miner,
        miner_params=miner_params, optimizer=optimizer, lr=lr,
        weight_decay=weight_decay, P=P, K=K, iterations=iterations, seed=seed, augmentation=augmentation,
        device=device,
    )
    check_config(config, size)  # before MLflow and the data are loaded
    from bench.cli import quiet_libraries

    quiet_libraries()
    run = train_and_evaluate(config, train_spec, test_spec, data_root, size, tracking_uri, experiment,
                             progress_bar=not quiet)
    emit(fmt, lambda: _table(run.metrics), lambda: [{"metric": k, "value": v} for k, v in run.metrics.items()],
         lambda: {"metrics": run.metrics, "run_id": run.run_id, "tracking_uri": run.tracking_uri})
    log.info(f"MLflow run {run.run_id} in {run.tracking_uri}")
    return 0
