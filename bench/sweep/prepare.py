"""The data of a protocol, split once: classes selected, class-disjoint folds, and the test-class guard.

What every trial, final seed, floor seed and budget-check seed reads (`prepare`
-> `Prepared`), and what `validate` checks before a sweep records anything.

Test classes are never seen while tuning: `TestClassGuard` compares the
class set of every piece of data a trial trains or scores on with the test
classes and raises `TestLeakError` if they meet, whatever the protocol or a
bug elsewhere says.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from bench import data as datasets
from bench.data.csv_listing import ROW
from bench.data.fingerprint import content_fingerprint
from bench.data.images import ImageFiles
from bench.data.query_gallery import QueryGallery, is_query_gallery
from bench.data.splits import ClassSplit, class_folds, fingerprint, fold_label, split_pool
from bench.errors import BenchError
from bench.protocol import Protocol
from bench.spec import DataSpec
from bench.spec.schema import REID_METRICS


class TestLeakError(BenchError):
    """Data a trial would see contains test classes: a bug or a protocol error, never a trial result."""

    exit_code = 3
    __test__ = False  # not a pytest class, despite the name


class TestClassGuard:
    """Refuses any data that shares a class with the test split.

    Classes are compared by identity (`bench.data.class_keys`: the dataset
    and the class's name), not by number: two folders of one's own both
    number from 0. Without keys, ids are identities (one dataset).
    """

    __test__ = False  # not a pytest class, despite the name

    def __init__(
        self,
        test: ClassSplit,
        test_keys: Mapping[int, Hashable] | None = None,
        train_keys: Mapping[int, Hashable] | None = None,
        also: Iterable[Hashable] = (),
    ) -> None:
        self.test = test
        self._test_keys = dict(test_keys or {})
        self._train_keys = dict(train_keys or {})
        # `also`: identities of further test data (a gallery's classes), never to be trained on either
        self._classes = frozenset(self._test_keys.get(c, c) for c in test.classes) | frozenset(also)

    def _key(self, c: int) -> Hashable:
        """A training class's identity; an id the training data does not hold is taken as the test data's id
        (data that mixed in test samples is refused, not waved through as an unknown class)."""
        return self._train_keys.get(c, self._test_keys.get(c, c))

    def check(self, classes: Sequence[int], role: str) -> ClassSplit:
        shared = {int(c) for c in classes if self._key(int(c)) in self._classes}
        if shared:
            shown = ", ".join(map(str, sorted(shared)[:5]))
            raise TestLeakError(
                f"{role} data contains {len(shared)} test class(es) ({shown}): "
                f"test classes ({self.test.fingerprint[:12]}) are never used for training or tuning"
            )
        return ClassSplit(role, tuple(classes))


@dataclass
class Prepared:
    """The data of a protocol, split once: what every trial and final run reads."""

    train: Any  # LabeledData, all training classes
    test: Any  # LabeledData, the test classes; or a QueryGallery (bench.data.query_gallery)
    train_split: ClassSplit
    test_split: ClassSplit
    folds: list[tuple[ClassSplit, ClassSplit]]  # (fold train, fold validation), only the folds used
    guard: TestClassGuard
    lake_runs: Any = None
    # under data.small_classes: drop, what was left out: {"min_samples", "train"/"test": {"dropped", "of", "smallest"}}
    small_classes: dict[str, Any] | None = None
    _fold_data: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def fold(self, f: int) -> tuple[Any, Any]:
        """(training, validation) data of fold f, each checked by the guard; built once."""
        if f not in self._fold_data:
            tr_split, val_split = self.folds[f]
            self.guard.check(tr_split.classes, f"{fold_label(f)} training")
            self.guard.check(val_split.classes, f"{fold_label(f)} validation")
            self._fold_data[f] = (self.train.subset(tr_split.classes), self.train.subset(val_split.classes))
        tr, val = self._fold_data[f]
        self.guard.check(tr.classes, f"{fold_label(f)} training")  # the data itself, not only the split
        self.guard.check(val.classes, f"{fold_label(f)} validation")
        return tr, val

    def data_fingerprint(self) -> str:
        """The content of what training and testing read (`bench.data.fingerprint`): samples and labels."""

        return content_fingerprint(self.train, self.test, self.lake_runs)

    def fingerprints(self) -> dict[str, Any]:

        return {
            "split": fingerprint(self.train_split, self.test_split),
            "train": self.train_split.fingerprint,
            "test": self.test_split.fingerprint,
            "folds": [{"train": t.fingerprint, "validation": v.fingerprint} for t, v in self.folds],
        }


def _select(
    classes: Sequence[int], wanted: Any, seed: int, side: str, spec: str, names: Mapping[int, str] | None = None
) -> tuple[int, ...]:
    """All classes, exactly the listed ones (ids, or folder names), or a seeded sample of n (sha256 order)."""
    if wanted is None:
        return tuple(classes)
    if isinstance(wanted, list):
        return tuple(sorted(class_ids(wanted, classes, names or {}, f"data.{side}_classes", spec)))
    if wanted > len(classes):
        raise BenchError(f"data.{side}_classes: asked for {wanted} classes, {spec} has {len(classes)}")
    order = sorted(classes, key=lambda c: hashlib.sha256(f"{seed}:{side}:{c}".encode()).hexdigest())
    return tuple(sorted(order[:wanted]))


def class_ids(
    wanted: Sequence[int | str], classes: Sequence[int], names: Mapping[int, str], where: str, spec: str
) -> list[int]:
    """Class ids from a list of ids or class names (a folder's sub-folder names are its class names)."""
    present = set(classes)
    by_name = {str(n): int(c) for c, n in names.items() if int(c) in present}
    out = []
    for item in wanted:
        if isinstance(item, str):
            if item not in by_name:
                known = ", ".join(sorted(by_name)[:5]) or "none: its classes have no names, give ids"
                raise BenchError(f"{where}: {spec} has no class named {item!r} (names: {known})")
            out.append(by_name[item])
        elif int(item) not in present:
            raise BenchError(f"{where}: {spec} has no class {item}")
        else:
            out.append(int(item))
    if len(set(out)) != len(out):
        raise BenchError(f"{where}: a class is named twice (by id and by name)")
    return out


def load_sides(d: DataSpec, data_root: str | None) -> tuple[Any, Any]:
    """The train and test datasets of a protocol's data section, as the trunk will see them.

    A channel mismatch is refused here, before any training: the trunk is
    built for the training images and would crash on the test images.
    """

    options: dict[str, Any] = {
        "size": d.image_size,
        "resize": d.resize,
        "channels": d.channels,
        "augment": d.augment,
        "loader": d.loader.as_dict() or None,
        "layout": d.layout,
    }
    train_all = datasets.load(d.train, data_root, **options)
    loaded = {d.train: train_all}
    sides = (
        [("query", d.test["query"]), ("gallery", d.test["gallery"])] if is_query_gallery(d.test) else [("test", d.test)]
    )
    for role, spec in sides:
        if spec not in loaded:
            loaded[spec] = datasets.load(spec, data_root, **options)
        test_all = loaded[spec]
        if train_all.x.shape[1:] != test_all.x.shape[1:]:
            hint = (
                "set data.channels: 1 or 3" if train_all.x.dim() == test_all.x.dim() == 4 else "use one kind of input"
            )
            raise BenchError(
                f"data: train {d.train} gives inputs of shape {tuple(train_all.x.shape[1:])}, "
                f"{role} {spec} {tuple(test_all.x.shape[1:])}: {hint}"
            )
    if is_query_gallery(d.test):
        query, gallery = d.test["query"], d.test["gallery"]
        folders = query.startswith("folder:") and gallery.startswith("folder:")
        if (
            _source(query).startswith("csv:")
            and _source(query).rpartition("#")[0] == _source(gallery).rpartition("#")[0]
        ):
            # one CSV's validation rows: a row both query and gallery is the same sample, paired by its line

            q, g = loaded[query], loaded[gallery]
            return train_all, QueryGallery(q, g, q.per_sample[ROW], g.per_sample[ROW])
        return train_all, QueryGallery.of(
            loaded[query], loaded[gallery], same_set=_source(query) == _source(gallery), by_name=folders
        )
    return train_all, loaded[d.test]


def _source(spec: str) -> str:
    """A spec with its path resolved: ``folder:a`` and ``folder:./a`` are one set of samples."""

    kind, sep, path = spec.partition(":")
    if sep and kind == "csv":
        file, _, split = path.rpartition("#")
        return f"csv:{os.path.realpath(file)}#{split}"
    return f"{kind}:{os.path.realpath(path)}" if sep and kind in ("folder", "npz") else spec


def select_sides(d: DataSpec, train_all: Any, test_all: Any, seed: int) -> tuple[ClassSplit, ClassSplit]:
    """The (train, test) class splits: a seeded split of one pool, or each side's own selection."""
    split = d.split
    if split is not None:
        return split_pool(train_all.classes, split.test_classes, split.seed)
    train = _select(train_all.classes, d.train_classes, seed, "train", d.train, train_all.meta.get("class_names"))
    test = _select(test_all.classes, d.test_classes, seed, "test", d.test, test_all.meta.get("class_names"))
    return ClassSplit("train", train), ClassSplit("test", test)


def make_guard(d: DataSpec, train_all: Any, test_all: Any, test_split: ClassSplit) -> TestClassGuard:
    """The guard for these two datasets: by identity when they differ, by id when they are one."""
    if d.train == d.test:
        return TestClassGuard(test_split)

    train_keys = datasets.class_keys(d.train, train_all)
    if is_query_gallery(d.test):  # the query's classes are the test classes; the gallery's are kept out too
        gallery = datasets.class_keys(d.test["gallery"], test_all.gallery)
        return TestClassGuard(
            test_split, datasets.class_keys(d.test["query"], test_all.query), train_keys, also=gallery.values()
        )
    return TestClassGuard(test_split, datasets.class_keys(d.test, test_all), train_keys)


def _check_query_gallery(protocol: Protocol, test: Any) -> None:
    """Refuse, before any training, a query/gallery test that cannot be scored: no query with a match in
    the gallery, or re-ID metrics on data without per-sample cameras."""

    if test.matched_queries() == 0:
        raise BenchError(
            f"data.test: none of the {len(test.query)} queries ({test.query.name}) has a sample of "
            f"its class in the gallery ({test.gallery.name}): nothing to retrieve"
        )
    if set(REID_METRICS) & set(protocol.spec.evaluation.metrics):
        test.cameras()


def _try_pipelines(*sets: Any) -> None:
    """Decode the first image of each set of image files with both pipelines: a transform value that
    torchvision accepts when built but refuses on an image (a Normalize with more std values than
    channels, a crop larger than the image) or a pipeline that ends at the wrong size is found now,
    by `validate` and before a sweep records anything, not in the first trial."""

    with torch.random.fork_rng(devices=[]):  # random transforms draw from the global RNG: leave it as it was
        for data in sets:
            if isinstance(data.x, ImageFiles) and len(data.x):
                for train in (True, False):
                    data.x.decode(0, train=train)


def prepare(protocol: Protocol, data_root: str | None = None) -> Prepared:
    """Load the data, select classes, make the folds and check that training can run on every fold."""

    d, t = protocol.spec.data, protocol.spec.training
    train_all, test_all = load_sides(d, data_root)
    selected, test_split = select_sides(d, train_all, test_all, protocol.seed)
    guard = make_guard(d, train_all, test_all, test_split)
    train_split = guard.check(selected.classes, "train")
    train = train_all.subset(train_split.classes)
    small: dict[str, Any] | None = None
    if protocol.spec.data.small_classes == "drop":
        small = {"min_samples": d.min_samples_per_class}
        train_split, train, small["train"] = _drop_small(train_all, train_split, d.min_samples_per_class)
    sides = [(train, "train")]
    if is_query_gallery(d.test):  # used whole: a query needs a match in the gallery, not a class size
        test = test_all
        _check_query_gallery(protocol, test)
    else:
        if small is not None:
            test_split, test, small["test"] = _drop_small(test_all, test_split, d.min_samples_per_class)
        else:
            test = test_all.subset(test_split.classes)
        sides.append((test, "test"))
    for data, side in sides:
        classes, counts = torch.unique(data.y, return_counts=True)
        if not len(counts):  # everything dropped
            raise BenchError(
                f"{data.name}: no {side} class has {d.min_samples_per_class} samples "
                f"(data.min_samples_per_class; data.small_classes: drop left them all out)"
            )
        low = int(counts.argmin())
        if int(counts[low]) < d.min_samples_per_class:
            cls = int(classes[low])
            named = data.meta.get("class_names", {}).get(cls)
            label = f"class {cls}" + (f" ({named})" if named is not None and str(named) != str(cls) else "")
            raise BenchError(
                f"{data.name}: {label} has {int(counts[low])} sample(s); every {side} class needs "
                f"at least {d.min_samples_per_class} (data.min_samples_per_class), or set "
                f"data.small_classes: drop to leave such classes out"
            )
    _try_pipelines(train, *((test.query, test.gallery) if is_query_gallery(d.test) else (test,)))
    validation = d.validation
    groups = None
    if validation.group_by:
        groups = train.meta.get(validation.group_by)
        if not isinstance(groups, dict):
            raise BenchError(f"data.validation.group_by: {d.train} has no per-class {validation.group_by!r}")
    folds = class_folds(train_split.classes, validation.folds, protocol.seed, groups)[: validation.use]
    for i, (fold_train, _) in enumerate(folds):
        if len(fold_train) < t.P:
            raise BenchError(
                f"training.P: {t.P} classes per batch, but {fold_label(i)} trains on {len(fold_train)} classes"
            )
    lake = None
    if "lake_accuracy" in protocol.spec.evaluation.metrics:
        if d.test != "omniglot:evaluation":
            raise BenchError("evaluation.metrics: lake_accuracy needs omniglot:evaluation as the test data")
        lake = datasets.load_lake_runs(data_root, d.image_size)
    return Prepared(train, test, train_split, test_split, folds, guard, lake, small)


def _drop_small(data: Any, split: ClassSplit, need: int) -> tuple[ClassSplit, Any, dict[str, int]]:
    """`split`'s classes of `data` with at least `need` samples (the split keeps its name), their data, and
    the count left out: ``{"dropped", "of", "smallest"}`` (smallest: the fewest samples of a class left out,
    0 when none was)."""

    chosen = data.subset(split.classes)
    classes, counts = torch.unique(chosen.y, return_counts=True)
    keep = classes[counts >= need].tolist()
    short = counts[counts < need]
    kept = ClassSplit(split.name, tuple(keep))
    record = {"dropped": len(short), "of": len(classes), "smallest": int(short.min()) if len(short) else 0}
    return kept, (chosen if not len(short) else data.subset(kept.classes)), record


def small_classes_notice(small: Mapping[str, Any] | None) -> str | None:
    """Under ``data.small_classes: drop``, the one line saying how many classes were left out (None: none)."""
    if not small:
        return None
    parts = [
        f"{small[side]['dropped']} of {small[side]['of']} {side} classes"
        for side in ("train", "test")
        if side in small and small[side]["dropped"]
    ]
    if not parts:
        return None
    smallest = min(small[s]["smallest"] for s in ("train", "test") if s in small and small[s]["dropped"])
    return (
        f"left out {' and '.join(parts)} with fewer than {small['min_samples']} samples "
        f"(the smallest {smallest}; data.small_classes: drop)"
    )
