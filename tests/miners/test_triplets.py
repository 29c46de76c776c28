"""Triplet loss and triplet miners: PML cross-check, loop references, hand computations, bad input."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from bench import distances
from bench.crosscheck import TOLERANCE
from bench.crosscheck import triplets as crosscheck
from bench.errors import BenchError
from bench.losses.triplet import triplet_matrix
from bench.registry import build_loss, build_miner


def distance_matrix(x: torch.Tensor, distance: str = "euclidean") -> torch.Tensor:
    """What the triplet loss and miners compare: D up to a constant (-cos for cosine)."""
    return triplet_matrix(x, distances.resolve(distance))


def _pk(p: int, k: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(p * k, dim, generator=g, dtype=torch.float64), torch.arange(p).repeat_interleave(k)


def _as_set(triplets) -> set[tuple[int, int, int]]:
    return set(zip(*(t.tolist() for t in triplets)))


def test_crosscheck_against_pml_passes():
    results = list(crosscheck.checks(cases=30, seed=0))
    assert [r.name for r in results] == [c.name for c in crosscheck.COMBOS]
    for r in results:
        assert r.cases == 30
        assert r.passed, f"{r.name}: value {r.max_rel_value}, grad {r.max_rel_grad} {r.note}"


def test_crosscheck_detects_a_wrong_margin():
    """The comparison has teeth: PML with another margin is reported as different."""
    from pytorch_metric_learning.losses import TripletMarginLoss

    case = crosscheck.make_case(1, random.Random(3))  # a PK layout
    dist, reducer = crosscheck._pml_parts(case)
    own = build_loss(
        "triplet",
        margin=case.margin,
        distance=case.distance,
        normalize=case.normalize,
        soft=case.soft,
        reduction=case.reduction,
    )(case.embeddings, case.labels)
    same = TripletMarginLoss(margin=case.margin, smooth_loss=case.soft, distance=dist, reducer=reducer)
    other = TripletMarginLoss(margin=case.margin + 0.3, smooth_loss=case.soft, distance=dist, reducer=reducer)
    assert crosscheck.rel_diff(own, same(case.embeddings, case.labels)) <= TOLERANCE
    assert crosscheck.rel_diff(own, other(case.embeddings, case.labels)) > 1e-3


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_semihard_nearest_matches_loop_reference(distance):
    margin = 0.3
    for seed, (p, k) in enumerate([(5, 4), (3, 2), (8, 3), (1, 5)]):
        x, y = _pk(p, k, 6, seed)
        x[1] = x[2]  # a tie
        got = build_miner("semihard", semantics="nearest", margin=margin, distance=distance)(x, y)
        d = distance_matrix(x, distance=distance)
        expected = set()
        for a, pos in itertools.product(range(len(y)), repeat=2):
            if a == pos or y[a] != y[pos]:
                continue
            negs = [n for n in range(len(y)) if y[n] != y[a]]
            if not negs:
                continue
            semi = [n for n in negs if 0 < d[a, n] - d[a, pos] <= margin]
            pool = semi or negs
            expected.add((a, pos, min(pool, key=lambda n: (float(d[a, n]), n))))
        assert _as_set(got) == expected
        assert len(got[0]) == len(expected)


def test_semihard_nearest_is_a_subset_of_all_semihard_or_a_fallback():
    x, y = _pk(6, 4, 8, 7)
    nearest = _as_set(build_miner("semihard", semantics="nearest", margin=0.5)(x, y))
    every = _as_set(build_miner("semihard", margin=0.5)(x, y))
    d = distance_matrix(x)
    for a, p, n in nearest - every:  # fallbacks: no semi-hard negative exists for this pair
        assert not any((a, p, m) in every for m in range(len(y)))
        assert d[a, n] == min(d[a, m] for m in range(len(y)) if y[m] != y[a])
    assert nearest & every


def _offline_reference(x, y, margin, strategy):
    d = distance_matrix(x)
    chosen = []
    for a, p in itertools.product(range(len(y)), repeat=2):
        if a == p or y[a] != y[p]:
            continue
        negs = [n for n in range(len(y)) if y[n] != y[a]]
        if not negs:
            continue
        semi = [n for n in negs if 0 < d[a, n] - d[a, p] <= margin] if strategy == "semihard" else []
        n = min(semi or negs, key=lambda m: (float(d[a, m]), m))
        chosen.append((a, p, n, float(d[a, p] - d[a, n] + margin) > 0))
    violating = [t[:3] for t in chosen if t[3]]
    return set(violating) if violating else {t[:3] for t in chosen}


@pytest.mark.parametrize("strategy", ["hard", "semihard"])
def test_offline_mining_matches_loop_reference(strategy):
    x, y = _pk(7, 3, 5, 11)
    y[-1] = 99  # a singleton: an anchor without positive
    miner = build_miner("offline", strategy=strategy, margin=0.4, chunk_size=4)
    got = _as_set(miner(x, y))
    assert got == _offline_reference(x, y, 0.4, strategy)
    assert 0 < miner.stats["fraction_positive"] <= 1


def test_offline_batches_serve_pool_triplets_and_refresh():
    x, y = _pk(10, 4, 6, 5)
    calls = []

    def embed(indices):
        calls.append(indices.clone())
        return x[indices]

    miner = build_miner("offline", refresh_every=3, subset_size=24, triplets_per_batch=8)
    assert miner.dataset_level
    g = torch.Generator().manual_seed(0)
    for step in range(7):
        samples, (a, p, n) = miner.batch(step, embed, y, g)
        assert len(a) == 8
        sy = y[samples]
        assert bool((sy[a] == sy[p]).all() and (sy[a] != sy[n]).all() and (a != p).all())
        pool = set(zip(*(t.tolist() for t in miner._pool)))
        assert {(int(samples[i]), int(samples[j]), int(samples[k])) for i, j, k in zip(a, p, n)} <= pool
    assert len(calls) == 3  # steps 0, 3, 6
    assert all(len(c) == 24 for c in calls)
    assert not torch.equal(calls[0], calls[1])


def test_batch_all_fraction_positive_by_hand():
    # 1-D embeddings, no normalisation: distances are |x_i - x_j|
    x = torch.tensor([[0.0], [0.1], [1.0], [0.3]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])
    margin = 0.25
    # triplets (a,p,n) and D(a,p) - D(a,n) + margin:
    # (0,1,2): .1-1+.25<0  (0,1,3): .1-.3+.25=.05>0  (1,0,2): .1-.9+.25<0  (1,0,3): .1-.2+.25=.15>0
    # (2,3,0): .7-1+.25<0  (2,3,1): .7-.9+.25=.05>0  (3,2,0): .7-.3+.25>0  (3,2,1): .7-.2+.25>0
    miner = build_miner("batch_all", margin=margin, normalize=False)
    t = miner(x, y)
    assert len(t[0]) == 8 and miner.stats["num_tuples"] == 8
    assert miner.stats["fraction_positive"] == pytest.approx(5 / 8)
    loss = build_loss("triplet", margin=margin, normalize=False)
    value = loss(x, y, t)
    assert loss.stats["fraction_positive"] == pytest.approx(5 / 8)
    assert float(value) == pytest.approx((0.05 + 0.15 + 0.05 + 0.65 + 0.75) / 5)
    assert float(loss(x, y)) == pytest.approx(float(value))  # no tuple: the same every-triplet loss


def test_batch_hard_picks_farthest_positive_and_nearest_negative():
    x = torch.tensor([[0.0], [1.0], [3.0], [1.5], [10.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 1, 2])
    a, p, n = build_miner("batch_hard", normalize=False)(x, y)
    assert _as_set((a, p, n)) == {(0, 2, 3), (1, 2, 3), (2, 0, 3)}  # 3 and 4 have no positive


def test_soft_margin_and_squared_distance():
    x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1])
    soft = build_loss("triplet", margin=0.0, soft=True, normalize=False)(x, y)
    expected = (torch.log1p(torch.exp(torch.tensor(1.0 - 3.0))) + torch.log1p(torch.exp(torch.tensor(1.0 - 2.0)))) / 2
    assert float(soft) == pytest.approx(float(expected))
    sq = build_loss("triplet", margin=5.0, distance="squared_euclidean", normalize=False, reduction="sum")(x, y)
    assert float(sq) == pytest.approx(max(0, 1 - 9 + 5) + max(0, 1 - 4 + 5))


def test_no_valid_triplet_gives_a_connected_zero():
    x = torch.randn(4, 3, requires_grad=True)
    for y in (torch.zeros(4, dtype=torch.long), torch.arange(4)):
        loss = build_loss("triplet")
        value = loss(x, y)
        value.backward()
        assert float(value.detach()) == 0.0 and loss.stats["num_tuples"] == 0
        assert torch.equal(x.grad, torch.zeros_like(x))
        for name in ("batch_all", "batch_hard", "semihard", "hard"):
            assert all(len(t) == 0 for t in build_miner(name)(x, y))


def test_miners_do_not_track_gradients():
    x = torch.randn(8, 4, requires_grad=True)
    y = torch.arange(4).repeat_interleave(2)
    for name in ("batch_all", "batch_hard", "semihard", "hard", "offline"):
        t = build_miner(name)(x, y)
        assert all(not i.requires_grad and i.dtype == torch.long for i in t)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: build_miner("batch_hard", foo=1), "no parameter 'foo'"),
        (lambda: build_miner("semihard", semantics="closest"), "semantics"),
        (lambda: build_miner("hard", distance="manhattan"), "distance"),
        (lambda: build_miner("offline", refresh_every=0), "refresh_every"),
        (lambda: build_miner("offline", strategy="easy"), "strategy"),
        (lambda: build_loss("triplet", reduction="max"), "reduction"),
        (lambda: build_loss("triplet", margin="big"), "margin"),
        (lambda: build_miner("no_such_miner"), "unknown miner"),
    ],
)
def test_bad_parameters_raise_bench_error(build, message):
    with pytest.raises(BenchError, match=message):
        build()


def test_bad_inputs_raise_bench_error():
    x = torch.randn(6, 3)
    with pytest.raises(BenchError, match="labels"):
        build_miner("batch_hard")(x, torch.zeros(6, 1, dtype=torch.long))
    with pytest.raises(BenchError, match="labels has 5"):
        build_miner("semihard")(x, torch.zeros(5, dtype=torch.long))
    with pytest.raises(BenchError, match="embeddings"):
        build_loss("triplet")(torch.randn(6), torch.zeros(6, dtype=torch.long))
    with pytest.raises(BenchError, match="outside the batch"):
        build_loss("triplet")(
            x, torch.zeros(6, dtype=torch.long), (torch.tensor([0]), torch.tensor([1]), torch.tensor([9]))
        )


@pytest.mark.parametrize("miner", ["batch_all", "semihard", "hard"])
def test_dense_path_equals_per_triplet_gather(miner):
    """Mined triplets carry their mask; a plain copy of the same indices must give the same loss."""
    x, y = _pk(6, 3, 5, 2)
    mined = build_miner(miner, **({} if miner == "hard" else {"margin": 0.3}))(x, y)
    loss = build_loss("triplet", margin=0.3)
    dense = loss(x, y, mined)
    stats = dict(loss.stats)
    plain = loss(x, y, tuple(t.clone() for t in mined))
    assert float(dense) == pytest.approx(float(plain), rel=1e-12)
    assert stats == loss.stats and stats["num_tuples"] == len(mined[0]) > 0
