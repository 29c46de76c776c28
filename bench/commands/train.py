"""`dmlbench train`: one trunk, one loss (and miner), evaluated on unseen classes, logged to MLflow.

A thin layer over `bench.single_run.train_and_evaluate`: this module only
reads options (``NAME=VALUE`` parameters as YAML scalars) and prints.
"""

from __future__ import annotations

from typing import Any

import click
import torch
import yaml

from bench.cli import quiet_libraries
from bench.commands._output import emit, format_option, log, quiet_option
from bench.devices import PRECISIONS
from bench.errors import BenchError
from bench.single_run import DEFAULT_TEST, DEFAULT_TRAIN, DataChoice, check_config, train_and_evaluate
from bench.spec.schema import CHANNELS
from bench.training import TrainConfig


def parse_params(pairs: tuple[str, ...], option: str) -> dict[str, Any]:
    """``k=v`` strings to a dict, each value read as a YAML scalar (``0.2``, ``true``, ``[64, 32]``)."""
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


def parse_augment(text: str | None) -> dict[str, Any] | None:
    """``--augment``: a YAML mapping like a protocol's ``data.augment``, every transform built once to check it."""
    if text is None:
        return None

    from bench.data.augment import check, normalise

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise BenchError(f"--augment: cannot read {text!r} as YAML") from None
    check(value)
    return normalise(value)


def parse_classes(text: str | None, option: str) -> int | list[int | str] | None:
    """``12`` (a seeded sample of 12 classes) or ``a,b,3`` (those classes: folder names or ids), as in a protocol."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",") if item.strip()]
    if len(items) == 1 and items[0].isdigit() and "," not in text:
        count = int(items[0])
        if count < 2:
            raise BenchError(f"{option}: expected a count of at least 2 classes or a list, got {text!r}")
        return count
    if len(items) < 2 or len(set(items)) != len(items):
        raise BenchError(f"{option}: expected at least 2 distinct classes separated by commas, got {text!r}")
    return [int(item) if item.lstrip("-").isdigit() else item for item in items]


def parse_split(text: str | None) -> float | None:
    """``0.5`` (a fraction of the classes) or ``10`` (a count) held out as test classes."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise BenchError(f"--split: expected a fraction in (0, 1) or a count of test classes, got {text!r}") from None
    if not (0 < value < 1 or (value >= 1 and value.is_integer())):
        raise BenchError(f"--split: expected a fraction in (0, 1) or a count of test classes, got {text!r}")
    return value if value < 1 else int(value)


def _table(metrics: dict[str, float], floor: dict[str, float]) -> str:
    """Each metric's score beside the untrained trunk's (the floor): what training added."""
    width = max(map(len, metrics))
    head = f"{'metric':<{width}}  {'trained':>7}  {'floor':>7}"
    return "\n".join(
        [head, *(f"{name:<{width}}  {value:>7.4f}  {_score(floor.get(name)):>7}" for name, value in metrics.items())]
    )


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


@click.command("train")
@click.option("--data", "train_spec", default=DEFAULT_TRAIN, show_default=True, help="training classes (dataset spec)")
@click.option(
    "--test-data",
    "test_spec",
    default=DEFAULT_TEST,
    show_default=True,
    help="test classes (dataset spec), disjoint from the training classes",
)
@click.option(
    "--train-classes",
    default=None,
    metavar="N|A,B,...",
    help="training classes: a count (seeded sample) or a comma list of ids or folder names",
)
@click.option(
    "--test-classes",
    default=None,
    metavar="N|A,B,...",
    help="test classes: a count (seeded sample) or a comma list of ids or folder names",
)
@click.option(
    "--split",
    default=None,
    metavar="FRACTION|COUNT",
    help="hold out this fraction or count of --data's classes as test classes (seeded by --seed)",
)
@click.option(
    "--resize",
    type=click.Choice(["stretch", "pad", "center_crop"]),
    default="stretch",
    show_default=True,
    help="how a non-square image becomes square",
)
@click.option(
    "--channels",
    type=click.Choice(["1", "3", "grey", "rgb"]),
    default=None,
    help="image channels given to the trunk (default: as stored)",
)
@click.option(
    "--layout",
    type=click.Choice(["nchw", "nhwc"]),
    default=None,
    help="how an npz's 4-D x is ordered (data.layout; default: NCHW, a channels-last shape refused)",
)
@click.option(
    "--threads", default=None, type=click.IntRange(min=1), help="torch CPU threads (default: torch's, one per core)"
)
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
@click.option(
    "--optimizer", type=click.Choice(["adam", "sgd", "rmsprop"]), default="adam", show_default=True, help="optimizer"
)
@click.option("--lr", default=1e-3, show_default=True, help="learning rate")
@click.option("--weight-decay", default=0.0, show_default=True, help="L2 weight decay of the optimizer")
@click.option(
    "--augmentation", type=click.Choice(["shift", "affine"]), default=None, help="training augmentation (default: none)"
)
@click.option(
    "--augment",
    default=None,
    metavar="YAML",
    help="transforms.v2 pipelines for image files, as data.augment, e.g. "
    "'{train: [{RandomResizedCrop: {size: 28}}, RandomHorizontalFlip]}'",
)
@click.option(
    "--workers",
    default=None,
    type=click.IntRange(min=0),
    help="data-loader worker processes for image files (default: one per core, at most 8)",
)
@click.option("--seed", default=0, show_default=True, help="seed of weights, batches and augmentation")
@click.option(
    "--precision",
    type=click.Choice(list(PRECISIONS)),
    default="fp32",
    show_default=True,
    help="of the trunk's forward pass (fp16 needs a CUDA device; losses always run in fp32)",
)
@click.option(
    "--schedule",
    type=click.Choice(["constant", "cosine"]),
    default="constant",
    show_default=True,
    help="learning-rate schedule over the iterations",
)
@click.option("--warmup", default=0, show_default=True, help="iterations of linear LR warm-up before the schedule")
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda:0")
@click.option(
    "--tracking-uri", default=None, help="MLflow URI or path (default: $MLFLOW_TRACKING_URI, else ./runs/mlflow.db)"
)
@click.option("--experiment", default="dmlbench-train", show_default=True, help="MLflow experiment")
@format_option
@quiet_option
def command(
    train_spec: str,
    test_spec: str,
    train_classes: str | None,
    test_classes: str | None,
    split: str | None,
    resize: str,
    channels: str | None,
    layout: str | None,
    threads: int | None,
    data_root: str | None,
    size: int,
    trunk: str,
    trunk_param: tuple[str, ...],
    embedding_dim: int,
    loss: str,
    loss_param: tuple[str, ...],
    miner: str | None,
    miner_param: tuple[str, ...],
    P: int,
    K: int,
    iterations: int,
    optimizer: str,
    lr: float,
    weight_decay: float,
    augmentation: str | None,
    augment: str | None,
    workers: int | None,
    seed: int,
    precision: str,
    schedule: str,
    warmup: int,
    device: str,
    tracking_uri: str | None,
    experiment: str,
    fmt: str,
    quiet: bool,
) -> int:
    """Train one trunk with one loss (and miner), evaluate on the test classes, log to MLflow.

    Each metric is printed beside the floor: the same seed's untrained trunk,
    scored the same way (recorded as ``floor_<metric>``).

    Exit 1 when the loss diverges (the MLflow run is recorded as failed);
    2 on bad input; 3 when a test class is also a training class (compared
    by dataset and class name, so two folders that both number from 0 are fine).
    """
    choice = DataChoice(
        parse_classes(train_classes, "--train-classes"),
        parse_classes(test_classes, "--test-classes"),
        parse_split(split),
        seed,
        resize,
        None if channels is None else CHANNELS[channels],
        parse_augment(augment),
        {"workers": workers},
        layout,
    )

    miner_params = parse_params(miner_param, "--miner-param")
    if miner is None and miner_params:
        raise BenchError("--miner-param given without --miner")
    config = TrainConfig(
        trunk=trunk,
        trunk_params=parse_params(trunk_param, "--trunk-param"),
        embedding_dim=embedding_dim,
        loss=loss,
        loss_params=parse_params(loss_param, "--loss-param"),
        miner=miner,
        miner_params=miner_params,
        optimizer=optimizer,
        lr=lr,
        weight_decay=weight_decay,
        P=P,
        K=K,
        iterations=iterations,
        seed=seed,
        augmentation=augmentation,
        device=device,
        precision=precision,
        schedule={"type": schedule, "warmup": warmup},
    )
    check_config(config, size)  # before MLflow and the data are loaded

    quiet_libraries()
    if threads is not None:
        torch.set_num_threads(threads)
    run = train_and_evaluate(
        config, train_spec, test_spec, data_root, size, tracking_uri, experiment, progress_bar=not quiet, choice=choice
    )
    emit(
        fmt,
        lambda: _table(run.metrics, run.floor),
        lambda: [{"metric": k, "value": v, "floor": run.floor.get(k)} for k, v in run.metrics.items()],
        lambda: {"metrics": run.metrics, "floor": run.floor, "run_id": run.run_id, "tracking_uri": run.tracking_uri},
    )
    log.info(f"MLflow run {run.run_id} in {run.tracking_uri}")
    return 0
