"""Class-disjoint splits: train/test and k validation folds, with fingerprints.

Metric learning is scored on classes never seen in training, so every
split here divides classes, never samples. Shuffles are keyed by
sha256(seed, class id) rather than a random generator: the same seed gives
the same split on any machine and any numpy or torch version, which is what
lets a fingerprint stored with a result be compared with one computed
years later.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from bench.errors import BenchError


def fold_label(index: int) -> str:
    """How every output names validation fold `index`: ``fold 0`` for the first, 0-based.

    One numbering everywhere a fold is shown: `validate`'s split counts, the
    leaderboard's and regress's fingerprints, failure reasons, MLflow run names,
    and the split names (``fold0-train``) and MLflow ``fold`` tags it matches.
    """
    return f"fold {int(index)}"


@dataclass(frozen=True)
class ClassSplit:
    """A named set of class ids, kept sorted and unique so equal sets compare and hash equal."""

    name: str
    classes: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(sorted({int(c) for c in self.classes})))

    @property
    def fingerprint(self) -> str:
        """sha256 hex of the sorted class list: names the exact classes, whatever the split is called."""
        return _sha256(",".join(map(str, self.classes)))

    def __len__(self) -> int:
        return len(self.classes)


def fingerprint(*splits: ClassSplit) -> str:
    """One sha256 for several splits, in order and with their names.

    ``train``/``test`` swapped is another protocol, so names and order count.
    """
    return _sha256(";".join(f"{s.name}={s.fingerprint}" for s in splits))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _shuffled(items: Iterable[Hashable], seed: int) -> list:
    """A seeded, platform-independent permutation: sort by sha256(seed, item)."""
    return sorted(items, key=lambda item: (_sha256(f"{seed}:{item!r}"), repr(item)))


def _unique_classes(classes: Iterable[int], need: int, what: str) -> list[int]:
    unique = sorted({int(c) for c in classes})
    if len(unique) < need:
        raise BenchError(f"{what} needs at least {need} classes, got {len(unique)}")
    return unique


def split_classes(classes: Iterable[int], test_fraction: float, seed: int) -> tuple[ClassSplit, ClassSplit]:
    """Divide classes into disjoint (train, test); the test side gets round(fraction x n) classes.

    Both sides keep at least one class: an empty side is a protocol mistake.
    """
    if not 0.0 < float(test_fraction) < 1.0:
        raise BenchError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction!r}")
    unique = _unique_classes(classes, 2, "a train/test split")
    return _cut(unique, min(max(round(test_fraction * len(unique)), 1), len(unique) - 1), seed)


def _cut(unique: list[int], n_test: int, seed: int) -> tuple[ClassSplit, ClassSplit]:
    order = _shuffled(unique, seed)
    return ClassSplit("train", tuple(order[n_test:])), ClassSplit("test", tuple(order[:n_test]))


# a test side of one class ranks every neighbour as correct: every retrieval metric would be 1 whatever trained
MIN_TEST_CLASSES = 2
ONE_CLASS = "a test needs at least 2 classes (with one, every neighbour is of the right class and every metric is 1)"


def split_pool(classes: Iterable[int], test_classes: float, seed: int) -> tuple[ClassSplit, ClassSplit]:
    """(train, test) of one pool: `test_classes` is a count (an integer >= 2) or a fraction in (0, 1).

    What ``data.split`` of a protocol asks for; a count must leave at least
    one training class, like a fraction, and the test side at least 2.
    """
    if isinstance(test_classes, bool) or not isinstance(test_classes, (int, float)):
        raise BenchError(f"data.split.test_classes: expected a count or a fraction, got {test_classes!r}")
    if 0 < test_classes < 1:
        train, test = split_classes(classes, float(test_classes), seed)
        if len(test) < MIN_TEST_CLASSES:
            raise BenchError(
                f"data.split.test_classes: {test_classes:g} of {len(train) + len(test)} classes leaves "
                f"{len(test)} test class; {ONE_CLASS}"
            )
        return train, test
    unique = _unique_classes(classes, MIN_TEST_CLASSES + 1, "a train/test split")
    if float(test_classes) != int(test_classes) or not MIN_TEST_CLASSES <= test_classes < len(unique):
        raise BenchError(
            f"data.split.test_classes: expected a fraction in (0, 1) or a count from {MIN_TEST_CLASSES} to "
            f"{len(unique) - 1} (the pool has {len(unique)} classes), got {test_classes}"
            + (f"; {ONE_CLASS}" if test_classes == 1 else "")
        )
    return _cut(unique, int(test_classes), seed)


def class_folds(
    classes: Iterable[int], k: int, seed: int, groups: Mapping[int, Hashable] | None = None
) -> list[tuple[ClassSplit, ClassSplit]]:
    """k (train, validation) pairs: each class is validated in exactly one fold.

    With `groups` (e.g. the alphabet of each Omniglot character) whole groups
    go to one fold, so validation never sees a sibling of a training class
    from the same alphabet; groups are dealt largest first to the smallest
    fold, which keeps fold sizes close. Without groups fold sizes differ by
    at most one.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise BenchError(f"k must be an integer of at least 2 folds, got {k!r}")
    unique = _unique_classes(classes, k, f"{k}-fold cross-validation")
    members: dict[Hashable, list[int]]
    if groups is None:
        members = {c: [c] for c in unique}
    else:
        missing = [c for c in unique if c not in groups]
        if missing:
            raise BenchError(f"groups give no group for {len(missing)} class(es), e.g. {missing[0]}")
        members = {}
        for c in unique:
            members.setdefault(groups[c], []).append(c)
        if len(members) < k:
            raise BenchError(f"{k}-fold cross-validation by group needs at least {k} groups, got {len(members)}")
    folds: list[list[int]] = [[] for _ in range(k)]
    for group in sorted(_shuffled(members, seed), key=lambda g: -len(members[g])):  # stable: ties keep the shuffle
        smallest = min(range(k), key=lambda i: (len(folds[i]), i))
        folds[smallest].extend(members[group])
    everything = set(unique)
    return [
        (ClassSplit(f"fold{i}-train", tuple(everything - set(fold))), ClassSplit(f"fold{i}-validation", tuple(fold)))
        for i, fold in enumerate(folds)
    ]
