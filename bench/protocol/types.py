"""What loading a protocol gives: the validated `Protocol`, or a `ProtocolError` listing every problem."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

from bench.devices import AUTO
from bench.errors import BenchError
from bench.spec import Spec

NO_MINER = "none"  # the grid's name for a cell without a miner


class ProtocolError(BenchError):
    """Every problem of a protocol file, one line each; the message is the first one."""

    def __init__(self, problems: list[str]) -> None:
        more = f" (and {len(problems) - 1} more: see dmlbench validate)" if len(problems) > 1 else ""
        super().__init__(problems[0] + more)
        self.problems = problems


@dataclass(frozen=True)
class Protocol:
    """A validated protocol: the normalised document, its hash and where it came from.

    `doc` is the canonical form (defaults filled, registry search spaces
    merged), what the hash covers, read only inside this package; `spec`
    is the same as typed sections (`bench.spec.Spec`), what the rest of the
    package reads, so every consumer sees the values the hash covers, except
    that paths are absolute (`resolve_paths`) where the hash took them as
    written. `text` is the
    file as written, kept as the artifact of every record. `data` is the
    fingerprint of the data a sweep read (`bench.data.fingerprint`), set
    once the data are loaded. `shared_hash` covers what every cell shares
    (all but the grid): a sweep's records are keyed per cell by it, the
    cell's own definition and the data (`bench.plan.cell_key`), the floor
    by `shared_key`, so a sweep on changed data never reuses or mixes old
    records, and one with a cell added keeps the other cells'.
    """

    doc: dict[str, Any]
    hash: str
    source: str
    text: str
    data: str = ""
    shared_hash: str = ""  # sha256 of the shared settings: everything but the grid (`shared_hash`)
    spec: Spec = field(init=False, repr=False, compare=False)  # `doc` as typed sections: what code reads

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", Spec.from_doc(self.doc))

    def with_data(self, fingerprint: str) -> Protocol:
        """This protocol bound to the data it runs on (its records' key then names both)."""
        return replace(self, data=fingerprint)

    def with_precision(self, precision: str, channels_last: bool) -> Protocol:
        """This protocol with ``precision: auto`` resolved to what a sweep chose at its start (`bench.sweep.
        precision`): the same hash, text and records (auto is what the file says and the hash covers), the
        document's ``training.precision`` and ``channels_last`` the chosen ones, so every run trains in them."""
        doc = copy.deepcopy(self.doc)
        doc["training"]["precision"], doc["training"]["channels_last"] = precision, channels_last
        return replace(self, doc=doc)

    def with_seed(self, seed: int) -> Protocol:
        """This protocol with another top-level ``seed`` (a tuning draw's, `bench.sweep.tuning`): the same
        hash, text and records; every seed derived from ``seed`` changes."""
        doc = copy.deepcopy(self.doc)
        doc["seed"] = seed
        return replace(self, doc=doc)

    def with_device(self, device: str) -> Protocol:
        """This protocol trained on ``device`` (`dmlbench run --device`): the same hash, text and records (a
        sweep resumed on another device continues the same cells), the document's ``training.device`` the
        given one; the sweep's manifest names the override, since results agree across devices only within
        rounding."""
        doc = copy.deepcopy(self.doc)
        doc["training"]["device"] = device
        return replace(self, doc=doc)

    @property
    def precision_auto(self) -> bool:
        """Whether the file says ``precision: auto`` (and no sweep has resolved it in this object yet)."""
        return self.spec.training.precision == AUTO

    @property
    def key12(self) -> str:
        """The whole protocol's hash, and the data once bound (records are keyed per cell: `shared_key`)."""
        return f"{self.hash12}.{self.data[:8]}" if self.data else self.hash12

    @property
    def shared_key(self) -> str:
        """What records common to every cell (the floor) are keyed by: the shared settings' hash, and the
        data once bound. Two versions of a protocol with the same shared key differ only by their cells."""
        return f"{self.shared_hash[:12]}.{self.data[:8]}" if self.data else self.shared_hash[:12]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def hash12(self) -> str:
        return self.hash[:12]

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def final_seeds(self) -> list[int]:
        """Every final seed a cell may train, in order: the list, or a range's 0 .. max - 1 (`bench.plan.seeds`)."""
        return list(self.spec.final.seeds)

    @property
    def primary(self) -> str:
        return self.spec.evaluation.primary
