"""One training run as a library call: build the data, train one trunk with one loss (and miner), evaluate, record.

This is what `dmlbench train` does, callable from a notebook or a test
without the command line: the quick way to try a method before putting it
in a protocol. The training classes and the test classes must be disjoint,
so that the metrics speak of classes the model never saw; Lake's one-shot
runs are added when the test set is Omniglot's evaluation alphabets.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from bench.errors import BenchError
from bench.training import TrainConfig


DEFAULT_TRAIN = "omniglot:background"
DEFAULT_TEST = "omniglot:evaluation"


@dataclass(frozen=True)
class SingleRun:
    """What one run produced: its test metrics and where MLflow recorded it."""

    metrics: dict[str, float]
    run_id: str
    tracking_uri: str


def check_config(config: TrainConfig, size: int | None = None) -> None:
    """Unknown names and parameters fail in a second, before data, models and MLflow are loaded."""
    from bench import registry

    for kind, name, params in (("trunk", config.trunk, config.trunk_params),
                               ("loss", config.loss, config.loss_params),
                               ("miner", config.miner, config.miner_params)):
        if name is None:
            if params:
                raise BenchError("miner parameters given without a miner")
            continue
        registry.check_params(registry.get(kind, name), params)
    config.check()
    if size is not None:
        from bench.models import check_size

        check_size(config.trunk, (1, size, size), config.embedding_dim, config.trunk_params)


def split_fingerprints(train_classes: tuple[int, ...], test_classes: tuple[int, ...]) -> dict[str, str]:
    """The fingerprint of the train/test split and of each side, as the results tables name them."""
    from bench.splits import ClassSplit, fingerprint

    train, test = ClassSplit("train", train_classes), ClassSplit("test", test_classes)
    return {"split": fingerprint(train, test), "train": train.fingerprint, "test": test.fingerprint}


def train_and_evaluate(config: TrainConfig, train_spec: str = DEFAULT_TRAIN, test_spec: str = DEFAULT_TEST,
                       data_root: str | None = None, size: int = 28, tracking_uri: str | None = None,
                       experiment: str = "dmlbench-train", progress_bar: bool = False) -> SingleRun:
    """Load, train, evaluate and record one run.

    `train_spec` and `test_spec` are dataset specs (`omniglot:background`);
    `data_root` the folder holding the datasets (default: $DMLBENCH_DATA,
    then ../shared/data); `size` the image side in pixels; `tracking_uri` the
    MLflow store (default: $MLFLOW_TRACKING_URI, then ./runs/mlflow.db);
    `progress_bar` draws a tqdm bar on stderr. A `BenchError` names a bad
    name, parameter or overlapping class sets; a diverged loss raises
    `DivergedError`.
    """
    from tqdm import tqdm

    from bench import data as datasets
    from bench import tracking
    from bench.training import evaluate, train

    check_config(config)
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
        bar = tqdm(total=config.iterations, desc="train", unit="it", file=sys.stderr, disable=not progress_bar,
                   leave=False)

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
    return SingleRun(metrics, run_id, uri)
