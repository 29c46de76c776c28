"""A validated protocol as typed, read-only sections: what the package reads, never the raw document.

`Spec.from_doc` is called once, by `bench.protocol.Protocol`, on the
normalised document (schema-checked, defaults of `bench.spec.schema` filled
in, search spaces merged), so every default is stated here or in the schema
and a renamed key fails in one place. The document itself stays what the
hash covers; these objects are built from a copy of it, so a caller that
alters a dict inside them (``params``, ``search_space``) cannot alter the
hash or another caller's view.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from bench.spec.schema import ABSENT_DEFAULTS, image_hw

Classes = int | list[int | str] | None  # data.train_classes / test_classes: all, a seeded count, or a list


def _absent(doc: dict[str, Any], dotted: str) -> Any:
    """A key whose default is its absence (`bench.spec.schema.ABSENT_DEFAULTS`): its value or that default."""
    section, key = dotted.split(".")
    return copy.deepcopy(doc[section].get(key, ABSENT_DEFAULTS[dotted]))


@dataclass(frozen=True)
class SplitSpec:
    """``data.split``: one dataset cut into train and test classes, a count or a fraction, seeded."""

    test_classes: int | float
    seed: int


@dataclass(frozen=True)
class LoaderSpec:
    """``data.loader``: how image files are decoded (None: each option's default, `bench.data.loading`)."""

    workers: int | None = None
    pin_memory: bool | None = None
    cache: bool | None = None
    cache_max_gb: float | None = None
    augment_on: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The options set, as the data loaders take them (an option left at None is absent)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class ValidationSpec:
    """``data.validation``: class-disjoint folds of the training classes; ``use`` of them train trials."""

    folds: int
    use: int
    group_by: str | None = None


@dataclass(frozen=True)
class DataSpec:
    """``data``: which data, which classes, the image size, augmentation and the validation folds.

    ``train`` and ``test`` are dataset specs (a ``pool`` is both by now);
    ``test`` may be ``{"query": spec, "gallery": spec}``. ``image_size`` is
    as written (a side, or [height, width]); `hw` is (height, width)."""

    train: str
    test: Any  # a dataset spec, or {"query": spec, "gallery": spec}
    image_size: Any  # a side (int), or [height, width]
    validation: ValidationSpec
    train_classes: Classes = None
    test_classes: Classes = None
    split: SplitSpec | None = None
    resize: str = "stretch"
    channels: int | None = None  # None: as stored
    min_samples_per_class: int = 2
    small_classes: str = "refuse"
    augmentation: str | None = None
    augment: dict[str, Any] | None = None  # {train: [...], eval: [...]} of {Name: {kwargs}}
    loader: LoaderSpec = LoaderSpec()
    layout: str | None = None  # how an npz's 4-D x is ordered: nchw, nhwc; None: NCHW, channels-last refused

    @property
    def hw(self) -> tuple[int, int]:
        return image_hw(self.image_size)

    @property
    def test_spec(self) -> Any:
        """``test`` as the data readers take it: a spec string, or a plain query/gallery mapping."""
        return dict(self.test) if isinstance(self.test, dict) else self.test

    @classmethod
    def from_doc(cls, data: dict[str, Any], small_classes: str = "refuse") -> DataSpec:
        data = copy.deepcopy(data)
        split = data.get("split")
        return cls(
            train=data["train"],
            test=data["test"],
            image_size=data["image_size"],
            validation=ValidationSpec(**data["validation"]),
            train_classes=data.get("train_classes"),
            test_classes=data.get("test_classes"),
            split=SplitSpec(split["test_classes"], split["seed"]) if split else None,
            resize=data.get("resize") or "stretch",
            channels=data.get("channels"),
            min_samples_per_class=data.get("min_samples_per_class", 2),
            small_classes=small_classes,
            augmentation=data.get("augmentation"),
            augment=data.get("augment") or None,
            loader=LoaderSpec(**(data.get("loader") or {})),
            layout=data.get("layout"),
        )


@dataclass(frozen=True)
class ModelSpec:
    """``model``: the trunk, its embedding, the evaluation geometry and the trunk's start."""

    trunk: str
    embedding_dim: int
    normalize: bool
    trunk_params: dict[str, Any]
    distance: str | None = None  # None: each method's own default
    pretrained: str | None = None  # None: random initialisation
    freeze_bn: bool = False


@dataclass(frozen=True)
class EarlyStoppingSpec:
    """``training.early_stopping``: a validation score every ``check_every`` iterations, stop after
    ``patience`` checks without improvement; ``max_iterations`` is the budget."""

    metric: str
    patience: int
    check_every: int
    max_iterations: int


@dataclass(frozen=True)
class TrainingSpec:
    """``training``: the optimiser, the P x K batch, the budget in iterations, device and precision."""

    optimizer: str
    lr: float
    P: int
    K: int
    iterations: int
    weight_decay: float = 0.0
    trunk_lr: float | None = None  # None: lr for the whole trunk
    short_classes: str = "repeat"
    device: str = "cpu"
    precision: str = "fp32"
    channels_last: bool | None = None  # None: on for images under bf16 or fp16
    schedule: dict[str, Any] | None = None  # {type, warmup, ...}; None only before defaults
    early_stopping: EarlyStoppingSpec | None = None

    @property
    def batch_size(self) -> int:
        return self.P * self.K


@dataclass(frozen=True)
class EvaluationSpec:
    """``evaluation``: the metrics scored on the test classes (canonical order), the primary one, the ks, and the
    precision the trunk embeds in for scoring (`bench.evaluation.scoring_precision`)."""

    metrics: tuple[str, ...]
    primary: str
    ks: tuple[int, ...] = (1, 2, 4, 8)
    precision: str = "fp32"


@dataclass(frozen=True)
class PrunerSpec:
    """``tuning.pruner``: none, median or successive halving, with its defaults filled in."""

    type: str = "none"
    check_every: int | None = None
    startup_trials: int = 2
    warmup_steps: int = 0
    min_resource: int = 1
    reduction_factor: int = 3


@dataclass(frozen=True)
class StrategySpec:
    """``tuning.strategy``: synchronous successive halving's rungs (`bench.plan.rungs`), defaults filled."""

    type: str
    min_iterations: int
    eta: int
    max_iterations: int


@dataclass(frozen=True)
class SeedRangeSpec:
    """``final.seeds`` as a range: seeds 0, 1, ... until the primary metric's 95% half-width is at most
    ``half_width``, at least ``min`` and at most ``max`` (`bench.plan.seeds`)."""

    min: int
    max: int
    half_width: float


@dataclass(frozen=True)
class TuningSpec:
    """``tuning``: trials per cell, TPE's random start, the pruner, and how many independent draws."""

    trials: int
    startup_trials: int = 10
    pruner: PrunerSpec = PrunerSpec()
    repeats: int = 1
    unsearched: str = "all"  # a cell with nothing searched: "all" runs every trial, "one" runs one
    strategy: StrategySpec | None = None  # None: every trial trains the whole budget


@dataclass(frozen=True)
class FinalSpec:
    """``final``: the final seeds, and retrain (one model a seed) or folds (one a validation fold)."""

    seeds: tuple[int, ...]
    mode: str = "retrain"
    keep_models: bool = True  # each final seed's model and test embeddings kept as MLflow artifacts
    seed_range: SeedRangeSpec | None = None  # a range: ``seeds`` is every seed it may train, 0 .. max - 1


@dataclass(frozen=True)
class MethodSpec:
    """One ``grid.losses`` or ``grid.miners`` item: a registry name, its label, fixed params, search space;
    ``miners`` (a loss's) the labels of the miners it pairs with (None: every one)."""

    name: str
    label: str
    params: dict[str, Any]
    search_space: dict[str, Any]
    miners: tuple[str, ...] | None = None

    @classmethod
    def from_doc(cls, item: dict[str, Any]) -> MethodSpec:
        item = copy.deepcopy(item)
        miners = item.get("miners")
        return cls(
            item["name"], item["label"], item["params"], item["search_space"], None if miners is None else tuple(miners)
        )


@dataclass(frozen=True)
class GridSpec:
    """``grid``: the losses and the miners whose pairs are the cells."""

    losses: tuple[MethodSpec, ...]
    miners: tuple[MethodSpec, ...]


@dataclass(frozen=True)
class Spec:
    """A protocol's settings, section by section, defaults filled in."""

    name: str
    description: str
    seed: int
    data: DataSpec
    model: ModelSpec
    training: TrainingSpec
    evaluation: EvaluationSpec
    tuning: TuningSpec
    final: FinalSpec
    grid: GridSpec

    @property
    def scored_in(self) -> str:
        """The precision the trunk embeds in for every score (``evaluation.precision``): fp32, or the training
        precision (``auto`` until a sweep resolves it)."""
        return self.training.precision if self.evaluation.precision == "training" else "fp32"

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Spec:
        """The sections of a normalised protocol document (`bench.protocol.load`)."""
        model, training, tuning = doc["model"], copy.deepcopy(doc["training"]), doc["tuning"]
        stopping = training.pop("early_stopping", None)
        training.pop("trunk_lr", None)
        training.pop("short_classes", None)
        pruner = tuning.get("pruner") or {"type": "none"}
        seeds = doc["final"]["seeds"]
        return cls(
            name=doc["name"],
            description=doc.get("description", ""),
            seed=doc.get("seed", 0),
            data=DataSpec.from_doc(doc["data"], _absent(doc, "data.small_classes")),
            model=ModelSpec(
                trunk=model["trunk"],
                embedding_dim=model["embedding_dim"],
                normalize=model["normalize"],
                trunk_params=copy.deepcopy(model.get("trunk_params", {})),
                distance=model.get("distance"),
                pretrained=_absent(doc, "model.pretrained"),
                freeze_bn=_absent(doc, "model.freeze_bn"),
            ),
            training=TrainingSpec(
                **training,
                trunk_lr=_absent(doc, "training.trunk_lr"),
                short_classes=_absent(doc, "training.short_classes"),
                early_stopping=EarlyStoppingSpec(**stopping) if stopping else None,
            ),
            evaluation=EvaluationSpec(
                metrics=tuple(doc["evaluation"]["metrics"]),
                primary=doc["evaluation"]["primary"],
                ks=tuple(doc["evaluation"].get("ks", (1, 2, 4, 8))),
                precision=_absent(doc, "evaluation.precision"),
            ),
            tuning=TuningSpec(
                trials=tuning["trials"],
                startup_trials=tuning.get("startup_trials", 10),
                pruner=PrunerSpec(**pruner),
                repeats=_absent(doc, "tuning.repeats"),
                unsearched=_absent(doc, "tuning.unsearched"),
                strategy=StrategySpec(**tuning["strategy"]) if tuning.get("strategy") else None,
            ),
            final=FinalSpec(
                seeds=tuple(range(seeds["max"])) if isinstance(seeds, dict) else tuple(seeds),
                seed_range=SeedRangeSpec(seeds["min"], seeds["max"], float(seeds["half_width"]))
                if isinstance(seeds, dict)
                else None,
                mode=_absent(doc, "final.mode"),
                keep_models=_absent(doc, "final.keep_models"),
            ),
            grid=GridSpec(
                losses=tuple(MethodSpec.from_doc(i) for i in doc["grid"]["losses"]),
                miners=tuple(MethodSpec.from_doc(i) for i in doc["grid"]["miners"]),
            ),
        )
