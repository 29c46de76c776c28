"""Quadruplet loss, learned metric, MargOHNM and hardest-of-pool against slow loop references.

No library has these methods, so every value is recomputed here by plain
Python loops over samples and tuples, in float64, and compared to rel 1e-9
(values and gradients with respect to the embeddings).
"""

from __future__ import annotations

import math

import pytest
import torch
from _quadruplet_refs import (
    DEGENERATE,
    DISTANCES,
    LAYOUTS,
    PAIR_INPUTS,
    REDUCTIONS,
    close,
    embeddings,
    ref_learned,
    ref_matrix,
    ref_quadruplets,
    ref_reduce,
    ref_terms,
    value_and_grad,
)

from bench.errors import BenchError
from bench.losses.quadruplet import QuadrupletLoss, all_quadruplets
from bench.miners.margohnm import MargOHNMMiner
from bench.registry import build_loss, build_miner
from bench.tuples import Quadruplets, is_pairs, is_triplets


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("distance", DISTANCES)
def test_all_quadruplets_match_loop(layout: str, distance: str) -> None:
    labels = LAYOUTS[layout]
    y = torch.tensor(labels)
    emb = embeddings(len(labels), seed=len(layout))
    quads = ref_quadruplets(labels)
    assert len(quads) > 0
    fractions = []
    for reduction in REDUCTIONS:
        for normalize in (True, False):
            loss = QuadrupletLoss(alpha1=0.9, alpha2=0.4, distance=distance, normalize=normalize, reduction=reduction)
            got, got_grad = value_and_grad(lambda e: loss(e, y), emb)

            def ref(e):
                return ref_reduce(ref_terms(ref_matrix(e, distance, normalize), quads, 0.9, 0.4), reduction, e)

            want, want_grad = value_and_grad(ref, emb)
            close(got, want)
            close(got_grad, want_grad)
            terms = ref_terms(ref_matrix(emb.detach(), distance, normalize), quads, 0.9, 0.4)
            assert loss.stats["num_tuples"] == len(quads)
            assert loss.stats["fraction_positive"] == pytest.approx(
                sum(float(t) > 0 for t in terms) / len(quads), rel=1e-12
            )
            fractions.append(loss.stats["fraction_positive"])
    assert any(0 < f < 1 for f in fractions)  # avg_nonzero is tested apart from mean


def test_all_quadruplets_equals_explicit_enumeration() -> None:
    labels = [0, 0, 1, 1, 1, 2, 3, 3, 4, 4, 4, 4]
    y = torch.tensor(labels)
    q = all_quadruplets(y)
    assert list(zip(*(t.tolist() for t in q[:4]))) == ref_quadruplets(labels)
    emb = embeddings(len(labels), dim=6, seed=3)
    for reduction in REDUCTIONS:
        loss = QuadrupletLoss(alpha1=1.5, alpha2=0.7, reduction=reduction)
        a, ga = value_and_grad(lambda e: loss(e, y), emb)
        b, gb = value_and_grad(lambda e: loss(e, y, q), emb)
        close(a, b)
        close(ga, gb)


@pytest.mark.parametrize("layout", sorted(DEGENERATE))
def test_degenerate_batches_give_zero_loss_and_zero_gradient(layout: str) -> None:
    y = torch.tensor(DEGENERATE[layout])
    emb = embeddings(len(y))
    assert ref_quadruplets(DEGENERATE[layout]) == []
    for distance in DISTANCES:
        for reduction in REDUCTIONS:
            loss = QuadrupletLoss(distance=distance, reduction=reduction)
            value, grad = value_and_grad(lambda e: loss(e, y), emb)
            assert float(value) == 0.0
            assert torch.equal(grad, torch.zeros_like(grad))
            assert loss.stats == {"num_tuples": 0.0, "fraction_positive": 0.0}


def test_duplicate_embeddings_give_finite_gradients() -> None:
    y = torch.tensor([0, 0, 1, 1, 2, 2])
    emb = torch.tensor([[1.0, 0.0]] * 2 + [[0.0, 1.0]] * 4, dtype=torch.float64, requires_grad=True)
    for distance in DISTANCES:
        value, grad = value_and_grad(lambda e: QuadrupletLoss(distance=distance)(e, y), emb)
        assert math.isfinite(float(value)) and bool(torch.isfinite(grad).all())


@pytest.mark.parametrize("distance", DISTANCES)
def test_given_quadruplets_with_duplicates_and_margins(distance: str) -> None:
    labels = LAYOUTS["uneven"]
    y = torch.tensor(labels)
    every = ref_quadruplets(labels)
    g = torch.Generator().manual_seed(7)
    pick = torch.randint(len(every), (40,), generator=g).tolist()  # with repetitions
    quads = [every[t] for t in pick]
    cols = [torch.tensor(c) for c in zip(*quads)]
    emb = embeddings(len(labels), seed=11)
    per_tuple = torch.rand(len(quads), generator=g, dtype=torch.float64)
    margins = {
        "own": (None, None, 1.0, 0.5),
        "scalar": (0.3, 0.1, 0.3, 0.1),
        "zero_dim": (torch.tensor(0.8, dtype=torch.float64), 0.2, 0.8, 0.2),
        "per_tuple": (per_tuple + 0.5, per_tuple, (per_tuple + 0.5).tolist(), per_tuple.tolist()),
    }
    for reduction in REDUCTIONS:
        loss = QuadrupletLoss(distance=distance, reduction=reduction)
        for m1, m2, r1, r2 in margins.values():
            q = Quadruplets(*cols, alpha1=m1, alpha2=m2)
            got, got_grad = value_and_grad(lambda e: loss(e, y, q), emb)
            want, want_grad = value_and_grad(
                lambda e: ref_reduce(ref_terms(ref_matrix(e, distance, True), quads, r1, r2), reduction, e), emb
            )
            close(got, want)
            close(got_grad, want_grad)
            assert loss.stats["num_tuples"] == 40


def test_quadruplets_field_defaults_and_tuple_kinds() -> None:
    t = torch.tensor([0])
    q = Quadruplets(t, t, t, t)
    assert q.alpha1 is None and q.alpha2 is None
    assert not is_pairs(q) and not is_triplets(q)
    assert is_pairs((t, t, t, t)) and is_triplets((t, t, t))


def test_empty_given_quadruplets_give_zero() -> None:
    y = torch.tensor(LAYOUTS["pk"])
    emb = embeddings(len(y))
    e = torch.empty(0, dtype=torch.long)
    value, grad = value_and_grad(lambda x: QuadrupletLoss()(x, y, Quadruplets(e, e, e, e)), emb)
    assert float(value) == 0.0 and torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
def test_learned_metric_loss_matches_loop_and_trains_its_parameters(pair_input: str) -> None:
    torch.manual_seed(1)
    labels = LAYOUTS["pk"]
    y = torch.tensor(labels)
    loss = QuadrupletLoss(learned_metric=True, alpha1=0.3, alpha2=0.1, pair_input=pair_input).double()
    optimiser = torch.optim.SGD(loss.parameters(), lr=0.5)  # built before the lazy layer materialises
    emb = embeddings(len(labels), dim=3, seed=5)
    quads = ref_quadruplets(labels)
    for reduction in REDUCTIONS:
        loss.reduction = reduction
        got, got_grad = value_and_grad(lambda e: loss(e, y), emb)
        want, want_grad = value_and_grad(
            lambda e: ref_reduce(ref_terms(ref_learned(loss, e, squared=True), quads, 0.3, 0.1), reduction, e), emb
        )
        close(got, want)
        close(got_grad, want_grad)
    params = list(loss.parameters())
    assert len(params) == 8  # 3 hidden layers and the 2-way output, weight and bias each
    assert loss.metric.first.weight.shape == (10, 6)  # [a; b] or [|a-b|; a*b]: twice the embedding width
    before = [p.detach().clone() for p in params]
    optimiser.zero_grad()
    loss.reduction = "mean"
    loss(emb, y).backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in params)
    optimiser.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, params))


def test_pair_input_is_named_and_needs_the_learned_metric() -> None:
    with pytest.raises(BenchError, match="pair_input must be one of concat, difference_product"):
        build_loss("quadruplet", learned_metric=True, pair_input="sum")
    with pytest.raises(BenchError, match="needs learned_metric: true"):
        build_loss("quadruplet", pair_input="difference_product")
    assert build_loss("quadruplet", learned_metric=True).metric.pair_input == "concat"  # the paper's, by default
    assert build_loss("quadruplet").pair_scorer() is None


def test_bad_parameters_raise_bench_error() -> None:
    for a1, a2 in [(0.5, 0.5), (0.2, 0.5)]:
        with pytest.raises(BenchError, match="alpha1 must be greater than alpha2"):
            QuadrupletLoss(alpha1=a1, alpha2=a2)
        with pytest.raises(BenchError, match="alpha1 must be greater"):
            build_loss("quadruplet", alpha1=a1, alpha2=a2)
    with pytest.raises(BenchError, match="no parameter 'beta'"):
        build_loss("quadruplet", beta=1.0)
    with pytest.raises(BenchError, match="no parameter 'margin'"):
        build_miner("margohnm", margin=1.0)
    with pytest.raises(BenchError, match="unknown distance"):
        build_loss("quadruplet", distance="manhattan")
    with pytest.raises(BenchError, match="unknown reduction"):
        build_loss("quadruplet", reduction="max")
    with pytest.raises(BenchError, match="metric_hidden"):
        build_loss("quadruplet", learned_metric=True, metric_hidden=0)
    with pytest.raises(BenchError, match="exceeds pool_size"):
        build_miner("hardest_of_pool", pool_size=10, num_hardest=8, num_random=8)
    with pytest.raises(BenchError, match="unknown kind"):
        build_miner("hardest_of_pool", kind="pairs")
    with pytest.raises(BenchError, match="max_tuples"):
        build_miner("margohnm", max_tuples=0)
    with pytest.raises(BenchError, match="keep must be one of random, hardest"):
        build_miner("margohnm", keep="easiest")
    assert isinstance(build_loss("quadruplet", learned_metric=True), QuadrupletLoss)


def test_bad_inputs_raise_bench_error() -> None:
    loss = QuadrupletLoss()
    y = torch.tensor([0, 0, 1, 1])
    emb = torch.randn(4, 3)
    t = torch.tensor([0, 1])
    with pytest.raises(BenchError, match="embeddings must be a 2-D float tensor"):
        loss(torch.randn(4), y)
    with pytest.raises(BenchError, match="labels has 3 entries"):
        loss(emb, y[:3])
    with pytest.raises(BenchError, match="needs Quadruplets"):
        loss(emb, y, (t, t, t))
    with pytest.raises(BenchError, match="needs Quadruplets"):
        loss(emb, y, (t, t, t, t))
    with pytest.raises(BenchError, match="mismatched lengths"):
        loss(emb, y, Quadruplets(t, t, t, t[:1]))
    with pytest.raises(BenchError, match="outside the batch"):
        loss(emb, y, Quadruplets(t, t, t, t + 3))
    with pytest.raises(BenchError, match="Quadruplets.alpha1"):
        loss(emb, y, Quadruplets(t, t, t, t, alpha1=torch.ones(3)))
    with pytest.raises(BenchError, match="Quadruplets.alpha2"):
        loss(emb, y, Quadruplets(t, t, t, t, alpha2=float("nan")))
    with pytest.raises(BenchError, match="embeddings must be"):
        MargOHNMMiner()(torch.randn(4), y)
