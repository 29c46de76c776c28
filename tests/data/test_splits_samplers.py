"""Class-disjoint splits and folds, fingerprints, and the PK sampler."""

from __future__ import annotations

import hashlib
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest
import torch

from bench.data import load
from bench.data.samplers import PKSampler
from bench.data.splits import ClassSplit, class_folds, fingerprint, split_classes, split_pool
from bench.errors import BenchError

# --------------------------------------------------------------------------- splits


def test_split_classes_is_disjoint_complete_and_seeded() -> None:
    classes = range(100, 200)
    train, test = split_classes(classes, 0.25, seed=3)
    assert set(train.classes).isdisjoint(test.classes)
    assert set(train.classes) | set(test.classes) == set(classes)
    assert len(test) == 25 and len(train) == 75
    assert split_classes(reversed(classes), 0.25, seed=3) == (train, test)  # input order does not matter
    assert split_classes(classes, 0.25, seed=4)[1] != test
    assert test.classes != tuple(range(100, 125))  # shuffled, not the first quarter


def test_split_classes_errors() -> None:
    with pytest.raises(BenchError, match="test_fraction must lie strictly between 0 and 1"):
        split_classes(range(10), 1.0, 0)
    with pytest.raises(BenchError, match="needs at least 2 classes, got 1"):
        split_classes([3, 3], 0.5, 0)


def test_tiny_fraction_still_leaves_one_test_class() -> None:
    train, test = split_classes(range(5), 0.01, seed=0)
    assert len(test) == 1 and len(train) == 4


def test_fingerprint_is_the_sha256_of_the_sorted_class_list() -> None:
    split = ClassSplit("test", (7, 3, 3, 10))
    assert split.classes == (3, 7, 10)
    assert split.fingerprint == hashlib.sha256(b"3,7,10").hexdigest()
    assert ClassSplit("other name", (10, 7, 3)).fingerprint == split.fingerprint
    assert ClassSplit("test", (3, 7, 11)).fingerprint != split.fingerprint


def test_combined_fingerprint_counts_names_and_order() -> None:
    a, b = ClassSplit("train", (1, 2)), ClassSplit("test", (3,))
    assert fingerprint(a, b) == fingerprint(ClassSplit("train", (2, 1)), ClassSplit("test", (3,)))
    assert fingerprint(a, b) != fingerprint(b, a)
    assert fingerprint(a, b) != fingerprint(ClassSplit("x", (1, 2)), b)
    assert len(fingerprint(a, b)) == 64


def test_folds_validate_each_class_exactly_once() -> None:
    classes = list(range(964, 1001))
    folds = class_folds(classes, k=5, seed=1)
    assert len(folds) == 5
    validated = Counter(c for _, val in folds for c in val.classes)
    assert sorted(validated) == classes and set(validated.values()) == {1}
    for train, val in folds:
        assert set(train.classes).isdisjoint(val.classes)
        assert set(train.classes) | set(val.classes) == set(classes)
    sizes = [len(val) for _, val in folds]
    assert max(sizes) - min(sizes) <= 1
    assert class_folds(classes, k=5, seed=1) == folds
    assert class_folds(classes, k=5, seed=2) != folds


def test_folds_keep_groups_together(data_root: Path) -> None:
    background = load("omniglot:background", root=data_root)
    alphabet = background.meta["alphabet"]
    folds = class_folds(background.classes, k=3, seed=0, groups=alphabet)
    validated = [c for _, val in folds for c in val.classes]
    assert sorted(validated) == list(background.classes)
    for train, val in folds:
        val_alphabets = {alphabet[c] for c in val.classes}
        assert val_alphabets.isdisjoint(alphabet[c] for c in train.classes)
    sizes = [len(val) for _, val in folds]
    assert max(sizes) - min(sizes) < 60  # largest alphabet has 55 characters


def test_folds_errors() -> None:
    with pytest.raises(BenchError, match="k must be an integer of at least 2"):
        class_folds(range(10), 1, 0)
    with pytest.raises(BenchError, match="4-fold cross-validation needs at least 4 classes, got 3"):
        class_folds(range(3), 4, 0)
    with pytest.raises(BenchError, match="needs at least 3 groups, got 2"):
        class_folds(range(6), 3, 0, groups={c: c % 2 for c in range(6)})
    with pytest.raises(BenchError, match="no group for 1 class"):
        class_folds(range(6), 3, 0, groups={c: c for c in range(5)})


# --------------------------------------------------------------------------- PK sampler


def test_pk_batches_have_p_classes_of_k_samples_on_omniglot(data_root: Path) -> None:
    labels = load("omniglot:evaluation", root=data_root).y
    sampler = PKSampler(labels, P=16, K=4, seed=0)
    for batch in islice(sampler, 20):
        assert batch.dtype == torch.int64 and batch.shape == (64,)
        assert len(set(batch.tolist())) == 64  # 20 drawers per character: no repeats needed
        counts = Counter(labels[batch].tolist())
        assert len(counts) == 16 and set(counts.values()) == {4}
        assert labels[batch].view(16, 4).eq(labels[batch].view(16, 4)[:, :1]).all()  # grouped by class


def test_pk_same_seed_same_batches_and_resume_by_step() -> None:
    labels = torch.arange(50).repeat_interleave(6)
    a = list(islice(PKSampler(labels, 8, 3, seed=11), 10))
    b = list(islice(PKSampler(labels, 8, 3, seed=11), 10))
    c = list(islice(PKSampler(labels, 8, 3, seed=12), 10))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    assert len({tuple(x.tolist()) for x in a}) == 10  # batches differ from step to step
    resumed = list(islice(PKSampler(labels, 8, 3, seed=11).iterate(start=6), 4))
    assert all(torch.equal(x, y) for x, y in zip(resumed, a[6:]))
    assert torch.equal(PKSampler(labels, 8, 3, seed=11).batch(9), a[9])


def test_pk_covers_classes_uniformly() -> None:
    labels = torch.arange(10).repeat_interleave(5)
    sampler = PKSampler(labels, P=5, K=2, seed=0)
    seen = Counter(c for b in islice(sampler, 400) for c in labels[b].unique().tolist())
    assert set(seen) == set(range(10))
    assert max(seen.values()) - min(seen.values()) < 0.25 * 200  # each class in about half the batches


def test_pk_small_classes_are_drawn_with_replacement() -> None:
    labels = torch.tensor([0, 0, 1, 1, 1, 1, 1, 2])
    sampler = PKSampler(labels, P=3, K=4, seed=5)
    for batch in islice(sampler, 10):
        by_class = labels[batch].view(3, 4)
        assert by_class.eq(by_class[:, :1]).all()
        for row, idx in zip(by_class, batch.view(3, 4)):
            members = (labels == row[0]).nonzero().flatten().tolist()
            assert set(idx.tolist()) <= set(members)
            if len(members) >= 4:
                assert len(set(idx.tolist())) == 4  # enough samples: no repeats
            else:
                assert len(set(idx.tolist())) <= len(members)


def test_pk_errors_say_what_is_missing() -> None:
    with pytest.raises(BenchError, match="at least 2 classes, the labels have 1"):
        PKSampler(torch.zeros(10, dtype=torch.int64), P=1, K=2, seed=0)
    with pytest.raises(BenchError, match="P=8 needs at least 8 classes, the labels have 3"):
        PKSampler(torch.arange(3).repeat(4), P=8, K=2, seed=0)
    with pytest.raises(BenchError, match="K must be a positive integer, got 0"):
        PKSampler(torch.arange(3).repeat(4), P=2, K=0, seed=0)
    with pytest.raises(BenchError, match="labels must be integer class ids"):
        PKSampler(torch.rand(10), P=2, K=2, seed=0)


def test_pk_batches_are_the_same_whatever_order_they_are_asked_in() -> None:
    """Batches are drawn in chunks; a step is still a pure function of (seed, step), across chunk boundaries."""
    from bench.data.samplers import CHUNK

    labels = torch.arange(30).repeat_interleave(5)
    steps = [0, CHUNK - 1, CHUNK, 2 * CHUNK + 7, 3]
    forward = {s: PKSampler(labels, 6, 3, seed=4).batch(s) for s in steps}
    shared = PKSampler(labels, 6, 3, seed=4)
    for s in reversed(steps):
        assert torch.equal(shared.batch(s), forward[s])
    streamed = list(islice(PKSampler(labels, 6, 3, seed=4).iterate(start=CHUNK - 2), 4))
    assert torch.equal(streamed[1], forward[CHUNK - 1]) and torch.equal(streamed[2], forward[CHUNK])
    assert not torch.equal(forward[CHUNK - 1], forward[CHUNK])


def test_pk_samples_of_a_class_are_a_uniform_k_subset() -> None:
    labels = torch.tensor([0] * 5 + [1] * 5)
    sampler = PKSampler(labels, P=2, K=2, seed=0)
    pairs = Counter()
    for batch in islice(sampler, 4000):
        first = batch.view(2, 2)[labels[batch].view(2, 2)[:, 0] == 0][0]
        pairs[tuple(sorted(first.tolist()))] += 1
    assert len(pairs) == 10  # every one of the C(5, 2) pairs, none with a repeat
    assert max(pairs.values()) < 480 and min(pairs.values()) > 320  # 400 each expected; 4 sigma is 76


def test_pk_replacement_only_where_a_class_is_too_small() -> None:
    sizes = [2, 3, 4, 50, 1000]
    labels = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    sampler = PKSampler(labels, P=5, K=4, seed=2)
    repeats, seen_large = Counter(), set()
    for batch in islice(sampler, 300):
        for idx in batch.view(5, 4):
            c = int(labels[idx[0]])
            assert (labels[idx] == c).all()
            distinct = len(set(idx.tolist()))
            if sizes[c] >= 4:
                assert distinct == 4
            repeats[c] += distinct < 4
            if c == 4:
                seen_large.update(idx.tolist())
    assert repeats[0] == repeats[1] == 300  # 4 draws from 2 or 3 members (pigeonhole)
    assert repeats[2] == repeats[3] == repeats[4] == 0
    assert len(seen_large) > 600 and max(seen_large) > sum(sizes) - 20  # the whole large class is reachable


def test_split_pool_takes_a_fraction_or_a_count() -> None:
    assert split_pool(range(10), 0.3, 5) == split_classes(range(10), 0.3, 5)
    train, test = split_pool(range(10), 4, 5)
    assert len(test) == 4 and len(train) == 6 and not set(train.classes) & set(test.classes)
    assert split_pool(range(10), 4, 5) == (train, test) and split_pool(range(10), 4, 6) != (train, test)
    assert split_pool(range(10), 4.0, 5) == (train, test)
    for bad in (10, 0, 2.5, True):
        with pytest.raises(BenchError):
            split_pool(range(10), bad, 5)
