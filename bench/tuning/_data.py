"""The data of a protocol, split once: classes selected, class-disjoint folds, and the test-class guard.

Test classes are never seen while tuning: `TestClassGuard` compares the
class set of every piece of data a trial trains or scores on with the test
classes and raises `TestLeakError` if they meet, whatever the protocol or a
bug elsewhere says.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.errors import BenchError
from bench.protocol import Protocol
from bench.splits import ClassSplit, class_folds


class TestLeakError(BenchError):
    """Data a trial would see contains test classes: a bug or a protocol error, never a trial result."""

    exit_code = 3
    __test__ = False  # not a pytest class, despite the name



class TestClassGuard:
    """Refuses any data that shares a class with the test split."""

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, test: ClassSplit) -> None:
        self.test = test
        self._classes = frozenset(test.classes)

    def check(self, classes: Sequence[int], role: str) -> ClassSplit:
        shared = self._classes.intersection(int(c) for c in classes)
        if shared:
            shown = ", ".join(map(str, sorted(shared)[:5]))
            raise TestLeakError(f"{role} data contains {len(shared)} test class(es) ({shown}): "
                                f"test classes ({self.test.fingerprint[:12]}) are never used for training or tuning")
        return ClassSplit(role, tuple(classes))


@dataclass
class Prepared:
    """The data of a protocol, split once: what every trial and final run reads."""

    train: Any  # LabeledData, all training classes
    test: Any  # LabeledData, the test classes
    train_split: ClassSplit
    test_split: ClassSplit
    folds: list[tuple[ClassSplit, ClassSplit]]  # (fold train, fold validation), only the folds used
    guard: TestClassGuard
    lake_runs: Any = None
    _fold_data: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def fold(self, f: int) -> tuple[Any, Any]:
        """(training, validation) data of fold f, each checked by the guard; built once."""
        if f not in self._fold_data:
            tr_split, val_split = self.folds[f]
            self.guard.check(tr_split.classes, f"fold {f} training")
            self.guard.check(val_split.classes, f"fold {f} validation")
            self._fold_data[f] = (self.train.subset(tr_split.classes), self.train.subset(val_split.classes))
        tr, val = self._fold_data[f]
        self.guard.check(tr.classes, f"fold {f} training")  # the data itself, not only the split
        self.guard.check(val.classes, f"fold {f} validation")
        return tr, val

    def fingerprints(self) -> dict[str, Any]:
        from bench.splits import fingerprint

        return {"split": fingerprint(self.train_split, self.test_split), "train": self.train_split.fingerprint,
                "test": self.test_split.fingerprint,
                "folds": [{"train": t.fingerprint, "validation": v.fingerprint} for t, v in self.folds]}


def _select(classes: Sequence[int], wanted: Any, seed: int, side: str, spec: str) -> tuple[int, ...]:
    """All classes, exactly the listed ones, or a seeded sample of n (sha256 order: platform-independent)."""
    if wanted is None:
        return tuple(classes)
    if isinstance(wanted, list):
        missing = sorted(set(wanted) - set(classes))
        if missing:
            raise BenchError(f"data.{side}_classes: {spec} has no class {missing[0]}")
        return tuple(sorted(wanted))
    if wanted > len(classes):
        raise BenchError(f"data.{side}_classes: asked for {wanted} classes, {spec} has {len(classes)}")
    order = sorted(classes, key=lambda c: hashlib.sha256(f"{seed}:{side}:{c}".encode()).hexdigest())
    return tuple(sorted(order[:wanted]))


def prepare(protocol: Protocol, data_root: str | None = None) -> Prepared:
    """Load the data, select classes, make the folds and check that training can run on every fold."""
    import torch

    from bench import data as datasets

    d, t = protocol.doc["data"], protocol.doc["training"]
    train_all = datasets.load(d["train"], data_root, d["image_size"])
    test_all = train_all if d["test"] == d["train"] else datasets.load(d["test"], data_root, d["image_size"])
    train_classes = _select(train_all.classes, d["train_classes"], protocol.seed, "train", d["train"])
    test_classes = _select(test_all.classes, d["test_classes"], protocol.seed, "test", d["test"])
    test_split = ClassSplit("test", test_classes)
    guard = TestClassGuard(test_split)
    train_split = guard.check(train_classes, "train")
    train, test = train_all.subset(train_classes), test_all.subset(test_classes)
    for data, side in ((train, "train"), (test, "test")):
        _, counts = torch.unique(data.y, return_counts=True)
        low = int(counts.argmin())
        if int(counts[low]) < d["min_samples_per_class"]:
            cls = int(torch.unique(data.y)[low])
            raise BenchError(f"{data.name}: class {cls} has {int(counts[low])} sample(s); every {side} class needs "
                             f"at least {d['min_samples_per_class']} (data.min_samples_per_class)")
    validation = d["validation"]
    groups = None
    if validation["group_by"]:
        groups = train.meta.get(validation["group_by"])
        if not isinstance(groups, dict):
            raise BenchError(f"data.validation.group_by: {d['train']} has no per-class {validation['group_by']!r}")
    folds = class_folds(train_split.classes, validation["folds"], protocol.seed, groups)[: validation["use"]]
    for i, (fold_train, _) in enumerate(folds):
        if len(fold_train) < t["P"]:
            raise BenchError(f"training.P: {t['P']} classes per batch, but fold {i} trains on {len(fold_train)} classes")
    lake = None
    if "lake_accuracy" in protocol.doc["evaluation"]["metrics"]:
        if d["test"] != "omniglot:evaluation":
            raise BenchError("evaluation.metrics: lake_accuracy needs omniglot:evaluation as the test data")
        lake = datasets.load_lake_runs(data_root, d["image_size"])
    return Prepared(train, test, train_split, test_split, folds, guard, lake)
