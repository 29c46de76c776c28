"""Defaults filled in and equal meanings written one way, so that equal meanings hash equal."""

from __future__ import annotations

import copy
from typing import Any

from bench.errors import BenchError
from bench.spec.schema import ABSENT_DEFAULTS, CHANNELS, DEFAULTS, METRICS, PRUNER_DEFAULTS


def with_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """The schema-valid document ``raw`` with every default of `DEFAULTS` (and the pruner's, the strategy's)
    filled in, the data section normalised, seeds as a list or a range, metrics in `METRICS` order."""
    doc = copy.deepcopy(raw)
    _normalise_data(doc["data"], raw.get("seed", DEFAULTS["seed"]))
    _drop_absent_defaults(doc)
    for dotted, value in DEFAULTS.items():
        *parents, key = dotted.split(".")
        target = doc
        for p in parents:
            target = target[p]
        if key not in target:
            target[key] = copy.deepcopy(value)
    pruner = doc["tuning"]["pruner"]
    if pruner["type"] != "none":
        for key, value in PRUNER_DEFAULTS.items():
            pruner.setdefault(key, value)
        if pruner["check_every"] is None:  # under early stopping the pruner is told the early-stopping scores
            stopping = doc["training"].get("early_stopping")
            pruner["check_every"] = stopping["check_every"] if stopping else max(1, doc["training"]["iterations"] // 4)
    validation = doc["data"]["validation"]
    if validation["use"] is None:
        validation["use"] = validation["folds"]
    seeds = doc["final"]["seeds"]
    if isinstance(seeds, dict):  # a range (bench.plan.seeds): kept as written, the seeds are 0 .. max - 1
        doc["final"]["seeds"] = {"min": seeds["min"], "max": seeds["max"], "half_width": seeds["half_width"]}
    else:
        doc["final"]["seeds"] = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    strategy = doc["tuning"].get("strategy")
    if strategy:
        strategy.setdefault("eta", 3)
        strategy.setdefault("max_iterations", doc["training"]["iterations"])
    for kind in ("losses", "miners"):
        for entry in doc["grid"][kind]:
            entry.setdefault("label", entry["name"].replace(":", "-"))
            entry.setdefault("params", {})
            entry.setdefault("search_space", {})
    if "metrics" in doc["evaluation"]:
        doc["evaluation"]["metrics"] = [m for m in METRICS if m in doc["evaluation"]["metrics"]]
    return doc


def _normalise_data(data: dict[str, Any], seed: int) -> None:
    """One canonical form, so equal meanings hash equal: a pool is train = test = pool with a split;
    the split's seed defaults to the protocol seed; channel names become 1 or 3; defaults of the
    image options are dropped (their absence is the default, and old protocols keep their hash)."""
    if "pool" in data:
        data["train"] = data["test"] = data.pop("pool")
    if "split" in data:
        data["split"].setdefault("seed", seed)
        count = data["split"]["test_classes"]
        if isinstance(count, float) and count.is_integer():
            data["split"]["test_classes"] = int(count)
    size = data.get("image_size")
    if isinstance(size, list) and len(size) == 2 and size[0] == size[1]:
        data["image_size"] = size[0]  # [s, s] is s: one meaning, one hash
    if data.get("resize") == "stretch":
        del data["resize"]
    if "augment" in data:  # bare names as {Name: {}}; no pipeline is the default (decode, make square, resize)
        from bench.data.augment import normalise as normalise_augment

        try:
            data["augment"] = normalise_augment(data["augment"])
        except BenchError:
            pass  # reported with its place by the augment check (`_checks`)
        if not data["augment"]:
            del data["augment"]
    if "loader" in data:  # null is each option's default, so it is left out
        data["loader"] = {k: v for k, v in data["loader"].items() if v is not None}
        if not data["loader"]:
            del data["loader"]
    if "channels" in data:
        channels = data.pop("channels")
        if channels is not None:
            data["channels"] = CHANNELS[str(channels)]


def _drop_absent_defaults(doc: dict[str, Any]) -> None:
    """Keys of ABSENT_DEFAULTS written at their default are removed (and trunk_lr equal to lr), so writing
    a default out keeps the hash of the protocol that leaves it out."""
    for dotted, default in ABSENT_DEFAULTS.items():
        section, key = dotted.split(".")
        if key in doc[section] and doc[section][key] == default and type(doc[section][key]) is type(default):
            del doc[section][key]
    training = doc["training"]
    if training.get("trunk_lr") == training["lr"]:
        del training["trunk_lr"]
