"""The entry of a method or trunk, its search-space distributions, and which loss can use which miner.

An entry is everything the planner and the validator know of a method:
where its code is (imported only when built), what tuples it exchanges,
its default search space, its batch needs. `incompatibility` decides a
loss x miner pair from the tuple kinds alone.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

KINDS = ("loss", "miner", "trunk")
TUPLE_KINDS = ("pairs", "triplets", "quadruplets", "npair", "proxy")  # what `tuples` may say (COMPATIBLE below)
TUPLES_ATTRIBUTE = "tuples"  # the class attribute an entry-point loss or miner without `register` declares them in


@dataclass(frozen=True)
class ServedBatch:
    """How big a batch a dataset-level miner serves: at most ``tuple_size x sum(counts)`` samples a step.

    The budget counts samples too, so the validator refuses a miner that
    would serve more than P x K, and refuses searching ``counts``.
    """

    counts: tuple[str, ...]  # constructor parameters whose sum is the tuples served per step
    tuple_size: int  # samples per tuple
    tuple_size_if: tuple[str, Any, int] | None = None  # (parameter, value, size): another tuple kind's size

    def size(self, params: dict[str, Any]) -> int:
        """Samples per tuple under these parameter values."""
        if self.tuple_size_if is not None and params.get(self.tuple_size_if[0]) == self.tuple_size_if[1]:
            return self.tuple_size_if[2]
        return self.tuple_size


@dataclass(frozen=True)
class Entry:
    """One method or trunk: where its code is, what it exchanges, and what the planner must know of it."""

    name: str
    kind: str  # "loss" | "miner" | "trunk"
    target: str  # "module:attribute"
    summary: str
    counterpart: str  # the PML class and settings that make it equal, or how it is checked
    tuples: str  # losses: what they consume; miners: what they produce
    search_space: dict[str, dict[str, Any]] = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # build-time context: "num_classes", "embedding_size"
    pml_backed: bool = False
    # miners: "batch" mines inside each P x K batch; "dataset" builds its own batch from the training set
    # (a constructor parameter `dataset_level`, where the class has one, switches it per protocol)
    scope: Literal["batch", "dataset"] = "batch"
    # miners: loss parameters their tuples override (MargOHNM's adaptive margins): never searched on the loss
    supplies: tuple[str, ...] = ()
    batch: ServedBatch | None = None  # dataset-level miners: the batch they serve
    # images embedded without gradient per training step, from (parameters, training images): for the estimate
    embeds_per_step: Callable[[dict[str, Any], float], float] | None = None
    min_classes: int = 2  # classes a P x K batch needs (training.P at least this)
    min_per_class: int = 2  # samples of each class a batch needs (training.K at least this)
    # where the code came from: "built-in", "pml" (generic adapter), "entry point <package>", "--plugin <file>"
    source: str = "built-in"
    version: str = ""  # the plugin package's version (entry points)
    source_hash: str = ""  # sha256 of the module file that defines it (plugins)
    # what `dmlbench crosscheck` compares it with: a registry name ("pml:TripletMarginLoss") or a callable
    # taking the same parameters and returning the reference module
    reference: Any = None

    @property
    def plugin(self) -> bool:
        """Code from outside bench/ and PML: recorded with every run and folded into the protocol hash."""
        return self.source not in ("built-in", "pml", "timm")

    def resolve(self) -> Any:
        """The class or function named by ``target``, imported only now, so that listing the registry
        never imports PML or the other methods."""
        module, attr = self.target.split(":")
        return getattr(importlib.import_module(module), attr)

    def parameters(self) -> dict[str, Any]:
        """Constructor parameters and their defaults (inspect.Parameter.empty where required)."""
        sig = inspect.signature(self.resolve())
        return {
            n: p.default
            for n, p in sig.parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in self.needs
        }

    def settings(self, params: dict[str, Any]) -> dict[str, Any]:
        """The constructor's defaults overridden by ``params``: the values the method will run with."""
        return {**self.parameters(), **params}

    def dataset_level(self, params: dict[str, Any]) -> bool:
        """Whether this miner, with these parameters, builds its own batches from the training set."""
        return bool(self.settings(params).get("dataset_level", self.scope == "dataset"))


def float_space(low: float, high: float, log: bool = False) -> dict[str, Any]:
    """A float range as a protocol's ``search_space`` writes it."""
    return {"type": "float", "low": low, "high": high, "log": log}


def int_space(low: int, high: int, log: bool = False) -> dict[str, Any]:
    """An integer range as a protocol's ``search_space`` writes it."""
    return {"type": "int", "low": low, "high": high, "log": log}


# Loss consumes (key) -> miner outputs it can use. Pair and triplet losses
# convert between pairs and triplets (PML's convention, bench.tuples);
# quadruplets carry a type only the quadruplet loss reads; N-pair takes one
# positive pair per class; proxy losses learn from labels alone.
COMPATIBLE: dict[str, frozenset[str]] = {
    "pairs": frozenset({"pairs", "triplets"}),
    "triplets": frozenset({"pairs", "triplets"}),
    "quadruplets": frozenset({"quadruplets"}),
    "npair": frozenset({"pairs"}),
    "proxy": frozenset(),
}


def incompatibility(loss: Entry, miner: Entry | None) -> str | None:
    """Why this loss cannot use this miner's output, or None when it can."""
    if miner is None:
        return None
    produces, consumes = miner.tuples, loss.tuples
    if produces in COMPATIBLE.get(consumes, frozenset()):
        return None
    if consumes in _REFUSAL:
        why = _REFUSAL[consumes]
    elif produces == "quadruplets":
        why = "{miner} produces quadruplets, which only a quadruplet loss consumes; {loss} takes {consumes}"
    else:
        why = "{loss} consumes {consumes}; {miner} produces {produces}"
    return why.format(loss=loss.name, miner=miner.name, produces=produces, consumes=consumes)


# why a loss that consumes these tuples cannot use a miner's other tuples (`incompatibility`)
_REFUSAL = {
    "proxy": "{loss} learns from labels alone (tuples 'proxy': a proxy loss, or any loss that ignores mined "
    "tuples), so {miner}'s {produces} would be ignored",
    "npair": "{loss} takes one positive pair per class (N-pair batches); {miner} produces {produces}",
    "quadruplets": "{loss} needs quadruplets; {miner} produces {produces} (use a quadruplet-capable miner)",
}
