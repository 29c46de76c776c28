"""One training run as a library call: build the data, train one trunk with one loss (and miner), evaluate, record.

This is what `dmlbench train` does, callable from a notebook or a test
without the command line: the quick way to try a method before putting it
in a protocol. The training classes and the test classes must be disjoint,
so that the metrics speak of classes the model never saw; Lake's one-shot
runs are added when the test set is Omniglot's evaluation alphabets.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from bench import registry
from bench.cell import build_cell, classes_of
from bench.errors import BenchError
from bench.evaluation import evaluate, pair_scorer_of
from bench.metrics import geometry
from bench.spec import DataSpec, LoaderSpec, SplitSpec, ValidationSpec
from bench.stores import provenance, tracking
from bench.stores.mlflow_runs import MlflowWriter
from bench.sweep.progress import is_terminal
from bench.training import TrainConfig, check_classes, seed_everything, train
from bench.trunks import check_size

DEFAULT_TRAIN = "omniglot:background"
DEFAULT_TEST = "omniglot:evaluation"


@dataclass(frozen=True)
class SingleRun:
    """What one run produced: its test metrics, the untrained trunk's (`floor`), and where MLflow recorded it."""

    metrics: dict[str, float]
    run_id: str
    tracking_uri: str
    floor: dict[str, float] = field(default_factory=dict)  # metric -> the untrained trunk's score


def initial_models(config: TrainConfig, train_data: Any) -> tuple[Any, Any]:
    """The trunk and the learned metric (`bench.evaluation.pair_scorer_of`; None for a distance-based loss)
    `bench.training.train` starts from with this config's seed: its own seeding, then its own build
    (`bench.cell.build_cell`), in eval mode: what the run's floor scores."""
    seed_everything(config.seed)
    in_shape, classes = tuple(train_data.x.shape[1:]), classes_of(train_data.y)
    trunk, loss, _ = build_cell(config, in_shape, classes, torch.device(config.device))
    metric = pair_scorer_of(loss)
    return trunk.to(config.device).eval(), metric


def check_config(config: TrainConfig, size: int | None = None) -> None:
    """Unknown names and parameters fail in a second, before data, models and MLflow are loaded."""
    for kind, name, params in (
        ("trunk", config.trunk, config.trunk_params),
        ("loss", config.loss, config.loss_params),
        ("miner", config.miner, config.miner_params),
    ):
        if name is None:
            if params:
                raise BenchError("miner parameters given without a miner")
            continue
        registry.check_params(registry.get(kind, name), params)
    config.check()
    if size is not None:
        check_size(config.trunk, (1, size, size), config.embedding_dim, config.trunk_params)


def trained_normalized(config: TrainConfig) -> bool:
    """Whether the loss trained on L2-normalised embeddings, so that evaluation measures in the same geometry.

    The loss's ``normalize`` as given, else its default; a loss without one
    (PML-backed) normalises, as PML's default distances do. A protocol run
    takes the same from ``model.normalize`` (`bench.evaluation.score_model`).
    """
    default = registry.get("loss", config.loss).parameters().get("normalize", True)
    return bool(config.loss_params.get("normalize", default))


def split_fingerprints(train_classes: tuple[int, ...], test_classes: tuple[int, ...]) -> dict[str, str]:
    """The fingerprint of the train/test split and of each side, as the results tables name them."""
    from bench.data.splits import ClassSplit, fingerprint

    train, test = ClassSplit("train", train_classes), ClassSplit("test", test_classes)
    return {"split": fingerprint(train, test), "train": train.fingerprint, "test": test.fingerprint}


@dataclass(frozen=True)
class DataChoice:
    """Which classes of which data, as a protocol's data section says it (`bench.spec.schema`).

    `train_classes`/`test_classes`: None (all), a count (a seeded sample) or
    a list of ids or folder names; `split`: a count or fraction of test
    classes cut from the one training dataset (then `test_spec` is ignored);
    `resize` and `channels` as ``data.resize`` and ``data.channels``.
    """

    train_classes: int | list[int | str] | None = None
    test_classes: int | list[int | str] | None = None
    split: float | None = None
    split_seed: int = 0
    resize: str = "stretch"
    channels: int | None = None
    augment: dict[str, Any] | None = None  # data.augment, for image files
    loader: dict[str, Any] | None = None  # data.loader
    layout: str | None = None  # data.layout: how an npz's 4-D x is ordered

    def section(self, train_spec: str, test_spec: str, size: int) -> DataSpec:
        """The equivalent ``data`` section, so `train` selects classes exactly as `run` does."""
        split = None if self.split is None else SplitSpec(self.split, self.split_seed)
        test = train_spec if split is not None else test_spec
        if (
            split is None
            and train_spec == test_spec
            and not (isinstance(self.train_classes, list) and isinstance(self.test_classes, list))
        ):
            raise BenchError(
                "train and test name the same dataset: give disjoint --train-classes and "
                "--test-classes lists, or --split"
            )
        return DataSpec(
            train=train_spec,
            test=test,
            image_size=size,
            validation=ValidationSpec(folds=1, use=1),  # one run: no validation folds, the field unused
            resize=self.resize,
            channels=self.channels,
            train_classes=self.train_classes,
            test_classes=self.test_classes,
            split=split,
            augment=self.augment,
            loader=LoaderSpec(**(self.loader or {})),
            layout=self.layout,
        )


def train_and_evaluate(
    config: TrainConfig,
    train_spec: str = DEFAULT_TRAIN,
    test_spec: str = DEFAULT_TEST,
    data_root: str | None = None,
    size: int = 28,
    tracking_uri: str | None = None,
    experiment: str = "dmlbench-train",
    progress_bar: bool = False,
    choice: DataChoice | None = None,
) -> SingleRun:
    """Load, train, evaluate and record one run.

    `train_spec` and `test_spec` are dataset specs (`omniglot:background`);
    `data_root` the folder holding the datasets (default: $DMLBENCH_DATA,
    then ../shared/data); `size` the image side in pixels; `tracking_uri` the
    MLflow store (default: $MLFLOW_TRACKING_URI, then ./runs/mlflow.db);
    `progress_bar` draws a tqdm bar on stderr. A `BenchError` names a bad
    name, parameter or overlapping class sets; a diverged loss raises
    `DivergedError`. `choice` selects classes, splits one dataset, and sets
    the resize mode and channels (default: every class, stretched, as stored).
    """
    from bench import data as datasets
    from bench.sweep.prepare import load_sides, make_guard, select_sides

    check_config(config)
    d = (choice or DataChoice()).section(train_spec, test_spec, size)
    test_spec = d.test
    train_all, test_all = load_sides(d, data_root)
    train_split, test_split = select_sides(d, train_all, test_all, config.seed)
    make_guard(d, train_all, test_all, test_split).check(train_split.classes, "train")
    train_data, test_data = train_all.subset(train_split.classes), test_all.subset(test_split.classes)
    lake_runs = datasets.load_lake_runs(data_root, size) if d.split is None and test_spec == DEFAULT_TEST else None
    miner = registry.get("miner", config.miner) if config.miner else None
    if miner is None or not miner.dataset_level(config.miner_params):
        check_classes(config, len(train_data.classes))  # refused before a run is recorded, not as a FAILED one

    uri = tracking.resolve_tracking_uri(tracking_uri)
    prints = split_fingerprints(train_data.classes, test_data.classes)
    tags = provenance.standard_tags(
        prints["split"],
        train_fingerprint=prints["train"],
        test_fingerprint=prints["test"],
        train_data=train_spec,
        test_data=test_spec,
        command="train",
    )
    run_name = f"{config.loss}+{config.miner or 'none'}/{config.trunk}/seed{config.seed}"
    writer = MlflowWriter(uri, experiment, tags)
    with writer.recording(run_name) as run_id:
        split = None if d.split is None else {"test_classes": d.split.test_classes, "seed": d.split.seed}
        given: dict[str, Any] = {
            "train_classes": d.train_classes,
            "test_classes": d.test_classes,
            "split": split,
            "channels": d.channels,
        }
        chosen = {k: v for k, v in given.items() if v is not None}
        if d.augment:  # recorded as the protocol records it (bare names written out)
            from bench.data.augment import normalise

            chosen["augment"] = json.dumps(normalise(d.augment), sort_keys=True)
        writer.log(
            run_id,
            params={
                **config.to_dict(),
                "train_data": train_spec,
                "test_data": test_spec,
                "size": size,
                "resize": d.resize,
                **{k: str(v) for k, v in chosen.items()},
            },
        )
        bar = tqdm(
            total=config.iterations,
            desc="train",
            unit="it",
            file=sys.stderr,
            disable=not progress_bar or not is_terminal(sys.stderr),
            leave=False,
        )

        def progress(iteration: int, total: int, loss: float) -> None:
            bar.update(iteration - bar.n)
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

        try:
            result = train(config, train_data, progress=progress)
        finally:
            bar.close()
        normalize = trained_normalized(config)
        metric = pair_scorer_of(result.loss_module)  # a learned metric ranks its own run (docs/METHODS.md)
        metrics = evaluate(
            result.model,
            test_data,
            lake_runs=lake_runs,
            device=config.device,
            seed=config.seed,
            normalize=normalize,
            metric=metric,
        )
        # the floor: the same seed's initial trunk (and initial metric), scored by the same call on the same data
        start_trunk, start_metric = initial_models(config, train_data)
        floor = evaluate(
            start_trunk,
            test_data,
            lake_runs=lake_runs,
            device=config.device,
            seed=config.seed,
            normalize=normalize,
            metric=start_metric,
        )
        writer.log(
            run_id,
            params={"geometry": geometry(normalize)},
            metrics={
                **metrics,
                **{f"floor_{k}": v for k, v in floor.items()},
                "final_loss": result.final_loss,
                "wall_time_s": result.wall_time_s,
                "samples_seen": result.samples_seen,
                "iterations": result.iterations,
            },
        )
        if result.reason:
            writer.log(run_id, params={"train_note": result.reason})
    return SingleRun(metrics, run_id, uri, floor)
