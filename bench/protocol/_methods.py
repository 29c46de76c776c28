"""The grid's losses and miners against the registry: names, parameters, merged search spaces, whether each
builds, and what a P x K batch must hold for it."""

from __future__ import annotations

import copy
import math
from typing import Any

from bench import registry
from bench.cell import build_methods, planned_classes
from bench.cell import method_params as cell_method_params
from bench.errors import BenchError
from bench.protocol._report import Reporter
from bench.protocol.types import NO_MINER


def entry_or_report(kind: str, name: str, path: tuple, report: Reporter) -> Any:
    """The registry entry of ``name``, or None with the unknown name reported at ``path``."""
    try:
        return registry.get(kind, name)
    except BenchError as e:
        report.add(path, str(e))
        return None


def check_methods(doc: dict[str, Any], report: Reporter) -> None:
    """Every loss and miner of the grid: unique labels, known names and parameters, search spaces merged
    with the registry's (written back into ``doc``), each built once, batch needs met, no dead search."""
    labels: dict[str, tuple] = {}
    written: dict[int, list[str]] = {}  # loss index -> parameters its search_space names (before the merge)
    for kind, section in (("loss", "losses"), ("miner", "miners")):
        for i, item in enumerate(doc["grid"][section]):
            path = ("grid", section, i)
            if item["label"] in labels and labels[item["label"]][0] == section:
                report.add(
                    (*path, "label"),
                    f"label {item['label']!r} is used twice in grid.{section}: give one of them another label",
                )
            labels[item["label"]] = (section, i)
            if kind == "miner" and item["name"] == NO_MINER:
                if item["params"] or item["search_space"]:
                    report.add(path, "miner 'none' takes no params or search_space")
                continue
            if kind == "miner" and "miners" in item:
                report.add((*path, "miners"), "only a loss can restrict its miners")
            entry = entry_or_report(kind, item["name"], (*path, "name"), report)
            if entry is None:
                continue
            if kind == "loss":
                written[i] = [k for k, v in item["search_space"].items() if v is not None]
            merged = _merge_search_space(entry, item, path, report)
            if merged is None:  # a parameter name it lacks, said once: building it would only say it again
                continue
            item["search_space"] = merged
            _try_build(kind, entry, item, doc, path, report)
            _check_batch_needs(entry, doc["training"], path, report)
            if kind == "miner":
                _check_served_batch(entry, item, doc["training"], path, report)

    miner_labels = [m["label"] for m in doc["grid"]["miners"]]
    for i, item in enumerate(doc["grid"]["losses"]):
        for j, name in enumerate(item.get("miners", [])):
            if name not in miner_labels:
                report.add(
                    ("grid", "losses", i, "miners", j),
                    f"no miner labelled {name!r} in grid.miners: expected one of {', '.join(miner_labels)}",
                )
    _check_supplied(doc, written, report)


def check_param_names(
    entry: Any, names: dict[str, Any], path: tuple, report: Reporter, exclude: tuple[str, ...] = ()
) -> bool:
    """Whether every key of ``names`` is a constructor parameter of the entry (less ``exclude``); each one
    that is not is reported at its path, naming the allowed ones."""
    try:
        allowed = [n for n in entry.parameters() if n not in exclude]
    except (ImportError, AttributeError) as e:
        report.add(path, f"{entry.kind} {entry.name!r} cannot be imported: {e}")
        return False
    ok = True
    for name in names:
        if name not in allowed:
            report.add(
                (*path, name),
                f"{entry.kind} {entry.name!r} has no parameter {name!r}: "
                f"expected one of {', '.join(allowed) or '(none)'}",
            )
            ok = False
    return ok


def _merge_search_space(entry: Any, item: dict[str, Any], path: tuple, report: Reporter) -> dict | None:
    """Registry defaults, overridden key by key by the protocol; `null` removes; fixed params are not searched."""
    override = item["search_space"]
    ok = check_param_names(entry, override, (*path, "search_space"), report)
    ok = check_param_names(entry, item["params"], (*path, "params"), report) and ok
    inherited = {k: v for k, v in entry.search_space.items() if k not in override}  # the entry's own defaults
    ok = check_param_names(entry, inherited, (*path, "search_space"), report) and ok
    if not ok:
        return None
    merged = {k: copy.deepcopy(v) for k, v in entry.search_space.items()}
    for name, dist in override.items():
        if dist is None:
            merged.pop(name, None)
            continue
        if name in item["params"]:
            report.add((*path, "search_space", name), f"{name!r} is also fixed in params: fix it or search it")
        merged[name] = {**({"log": False} if dist["type"] != "categorical" else {}), **dist}
        problem = _distribution_problem(merged[name])
        if problem:
            report.add((*path, "search_space", name), problem)
    for name in item["params"]:
        merged.pop(name, None)
    return dict(sorted(merged.items()))


def _distribution_problem(dist: dict[str, Any]) -> str | None:
    if dist["type"] == "categorical":
        return None
    low, high = dist["low"], dist["high"]
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"expected finite bounds, got low={low}, high={high}"
    if low > high:
        return f"expected low <= high, got low={low}, high={high}"
    if dist.get("log") and low <= 0:
        return f"a log-scale range needs low > 0, got low={low}"
    if dist.get("log") and dist.get("step"):
        return "step and log cannot be combined"
    return None


def _try_build(kind: str, entry: Any, item: dict[str, Any], doc: dict[str, Any], path: tuple, report: Reporter) -> None:
    """Build the method with its fixed parameters: a bad value (a misspelt choice) fails now, not mid-sweep.
    Then once with each categorical choice of its search space: an unknown choice would otherwise fail
    every trial that draws it, and a sweep whose trials all fail still said "cells done"."""
    problem = _build_problem(kind, entry, item["params"], doc)
    if problem is not None:
        report.add((*path, problem[0]), problem[1])
        return
    for name, dist in item["search_space"].items():
        if not isinstance(dist, dict) or dist.get("type") != "categorical":
            continue
        for choice in dist["choices"]:
            problem = _build_problem(kind, entry, {**item["params"], name: choice}, doc)
            if problem is not None:
                report.add((*path, "search_space", name), f"choice {choice!r} cannot be used: {problem[1]}")
                break


def _build_problem(kind: str, entry: Any, fixed: dict[str, Any], doc: dict[str, Any]) -> tuple[str, str] | None:
    """Where and what, if the method cannot be built with ``fixed``."""
    import torch  # only here: importing the protocol package must not import torch

    model = doc["model"]
    params = _method_params(entry, fixed, model)
    loss, miner = (entry.name, None) if kind == "loss" else (None, entry.name)
    try:
        with torch.random.fork_rng(devices=[]):  # a learned metric draws its weights: leave the RNG as it was
            build_methods(
                loss,
                params if loss else {},
                miner,
                params if miner else {},
                num_classes=planned_classes(doc["training"]["P"]),
                embedding_dim=model["embedding_dim"],
            )
    except BenchError as e:
        return "params", str(e)
    except ImportError as e:
        return "name", f"{kind} {entry.name!r} cannot be imported: {e}"
    return None


def _check_served_batch(
    entry: Any, item: dict[str, Any], training: dict[str, Any], path: tuple, report: Reporter
) -> None:
    """A dataset-level miner may not serve more samples a step than P x K: the budget counts samples too."""
    served = entry.batch
    if served is None or not entry.dataset_level(item["params"]):
        return
    names = served.counts
    if any(n in item["search_space"] for n in names):
        report.add(
            (*path, "search_space"),
            f"{', '.join(names)} set the batch size of {entry.name}: fix them in "
            "params, the batch is part of the budget",
        )
        return
    params = entry.settings(item["params"])
    per_tuple = served.size(params)
    tuples = sum(int(params[n]) for n in names)
    largest, batch = tuples * per_tuple, training["P"] * training["K"]
    if largest > batch:
        report.add(
            (*path, "params"),
            f"{entry.name} serves up to {largest} samples a step ({per_tuple} x "
            f"({' + '.join(f'{n}={params[n]}' for n in names)})), more than the batch P x K = {batch}: "
            f"lower {' and '.join(names)} so every method sees at most {batch} samples a step",
        )


def _check_batch_needs(entry: Any, training: dict[str, Any], path: tuple, report: Reporter) -> None:
    """The classes and samples per class a P x K batch must hold for this method to find any tuple."""
    if training["P"] < entry.min_classes:
        report.add(
            (*path, "name"),
            f"{entry.kind} {entry.name!r} needs at least {entry.min_classes} classes a "
            f"batch: training.P is {training['P']}",
        )
    if training["K"] < entry.min_per_class:
        report.add(
            (*path, "name"),
            f"{entry.kind} {entry.name!r} needs at least {entry.min_per_class} samples "
            f"of each class a batch: training.K is {training['K']}",
        )


def _check_supplied(doc: dict[str, Any], written: dict[int, list[str]], report: Reporter) -> None:
    """A loss parameter searched in the protocol but supplied by every miner it is paired with is dead:
    the miner's tuples override it, so its search would only add noise. Refused, naming the miners."""
    miners = {m["label"]: m for m in doc["grid"]["miners"]}
    for i, item in enumerate(doc["grid"]["losses"]):
        explicit = written.get(i, [])
        if not explicit:
            continue
        try:
            loss = registry.get("loss", item["name"])
            paired = []
            for label in item.get("miners", list(miners)):
                name = miners[label]["name"] if label in miners else NO_MINER
                entry = None if name == NO_MINER else registry.get("miner", name)
                if registry.incompatibility(loss, entry) is None:
                    paired.append(entry)
        except BenchError:
            continue  # an unknown name is reported where it is written
        for key in explicit:
            suppliers = [m.name for m in paired if m is not None and key in m.supplies]
            if paired and len(suppliers) == len(paired):
                report.add(
                    ("grid", "losses", i, "search_space", key),
                    f"{key!r} is supplied by the miner's tuples ({', '.join(suppliers)}) in every cell of "
                    f"{item['label']}: searching it has no effect; remove it from search_space",
                )


def _method_params(entry: Any, fixed: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """`bench.cell.method_params` with the ``model`` section of a protocol document."""
    return cell_method_params(entry, fixed, model["normalize"], model.get("distance"))
