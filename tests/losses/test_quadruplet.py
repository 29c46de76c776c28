"""Quadruplet loss, learned metric, MargOHNM and hardest-of-pool against slow loop references.

No library has these methods, so every value is recomputed here by plain
Python loops over samples and tuples, in float64, and compared to rel 1e-9
(values and gradients with respect to the embeddings).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from bench.errors import BenchError
from bench.losses.quadruplet import QuadrupletLoss, all_quadruplets
from bench.miners.hardest_of_pool import HardestOfPoolMiner, draw_quadruplets, draw_triplets
from bench.miners.margohnm import MargOHNMMiner
from bench.registry import build_loss, build_miner
from bench.tuples import Quadruplets, ViolatingQuadruplets, is_pairs, is_triplets

DISTANCES = ("squared_euclidean", "euclidean", "cosine")
REDUCTIONS = ("mean", "avg_nonzero", "sum")
LAYOUTS = {
    "pk": [0, 0, 1, 1, 2, 2, 3, 3],
    "uneven": [5, 5, 5, 1, 1, 2, 9, 9, 9],
    "singletons_mixed": [0, 0, 1, 2, 3, 3],
}
DEGENERATE = {"one_class": [4] * 6, "all_singletons": [0, 1, 2, 3, 4, 5], "two_classes": [0, 0, 0, 1, 1]}


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-12)


def embeddings(n: int, dim: int = 4, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g, dtype=torch.float64).requires_grad_()


# ---- loop references ------------------------------------------------------


def ref_pair(x: torch.Tensor, y: torch.Tensor, distance: str) -> torch.Tensor:
    if distance == "cosine":
        return 1 - sum(x[t] * y[t] for t in range(len(x))) / (
            torch.sqrt(sum(v * v for v in x)) * torch.sqrt(sum(v * v for v in y))
        )
    sq = sum((x[t] - y[t]) ** 2 for t in range(len(x)))
    return sq if distance == "squared_euclidean" else torch.sqrt(sq)


def ref_matrix(emb: torch.Tensor, distance: str, normalize: bool) -> list[list[torch.Tensor]]:
    rows = [e / torch.sqrt((e * e).sum()) if normalize else e for e in emb]
    return [[ref_pair(a, b, distance) if ia != ib else None for ib, b in enumerate(rows)] for ia, a in enumerate(rows)]


def ref_quadruplets(labels: list[int]) -> list[tuple[int, int, int, int]]:
    n = len(labels)
    return [
        (i, j, l, k)
        for i, j, l, k in itertools.product(range(n), repeat=4)
        if i != j
        and labels[i] == labels[j]
        and labels[l] != labels[k]
        and labels[l] != labels[i]
        and labels[k] != labels[i]
    ]


def ref_terms(g, quads, alpha1, alpha2) -> list[torch.Tensor]:
    out = []
    for t, (i, j, l, k) in enumerate(quads):
        a1 = alpha1[t] if isinstance(alpha1, (list, torch.Tensor)) and len(alpha1) == len(quads) else alpha1
        a2 = alpha2[t] if isinstance(alpha2, (list, torch.Tensor)) and len(alpha2) == len(quads) else alpha2
        out.append(torch.relu(g[i][j] - g[i][k] + a1) + torch.relu(g[i][j] - g[l][k] + a2))
    return out


def ref_reduce(terms: list[torch.Tensor], reduction: str, emb: torch.Tensor) -> torch.Tensor:
    if reduction == "avg_nonzero":
        terms = [t for t in terms if float(t.detach()) > 0]
    if not terms:
        return (emb * 0).sum()
    total = sum(terms)
    return total if reduction == "sum" else total / len(terms)


def value_and_grad(fn, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    value = fn(emb)
    (grad,) = torch.autograd.grad(value, emb)
    return value.detach(), grad


# ---- the loss over every quadruplet of the batch ---------------------------


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


# ---- given quadruplets -----------------------------------------------------


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


# ---- the learned metric ----------------------------------------------------


def ref_learned(loss: QuadrupletLoss, emb: torch.Tensor, squared: bool = False) -> list[list[torch.Tensor]]:
    """g one pair at a time through the plain network input: the concatenation averaged over both orders,
    or ``[|a-b|; a*b]``; the loss's value is ``g^2`` (``squared``), as the paper writes every term."""
    metric = loss.metric
    rows = [e / torch.sqrt((e * e).sum()) for e in emb]

    def h(a, b):
        features = torch.cat([a, b]) if metric.pair_input == "concat" else torch.cat([(a - b).abs(), a * b])
        z = metric.rest(metric.first(features))
        return torch.exp(z[1]) / (torch.exp(z[0]) + torch.exp(z[1]))

    def g(a, b):
        value = (h(a, b) + h(b, a)) / 2 if metric.pair_input == "concat" else h(a, b)
        return value * value if squared else value

    return [[g(a, b) for b in rows] for a in rows]


PAIR_INPUTS = ("concat", "difference_product")


@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
def test_learned_metric_matrix_is_symmetric_probability_and_matches_loop(pair_input: str) -> None:
    torch.manual_seed(0)
    loss = QuadrupletLoss(learned_metric=True, metric_hidden=7, metric_layers=3, pair_input=pair_input).double()
    emb = embeddings(6, dim=5)
    x = torch.nn.functional.normalize(emb.detach(), dim=1)
    g = loss.metric.matrix(x)
    assert g.shape == (6, 6)
    assert bool(((g >= 0) & (g <= 1)).all())
    assert torch.equal(g, g.T)
    ref = ref_learned(loss, emb.detach())
    close(g.detach(), torch.stack([torch.stack(r) for r in ref]))
    # the loss's G is g squared (Chen et al.'s eqs. 2-4)
    big_g = loss.distance_matrix(emb).detach()
    close(big_g, torch.stack([torch.stack(r) for r in ref_learned(loss, emb.detach(), squared=True)]))
    close(loss.metric.paired(x[:3], x[3:]), g.detach()[torch.arange(3), torch.arange(3, 6)])
    close(loss.metric.scores(x[:2], x), g.detach()[:2])  # a block of rows: what ranking computes
    if pair_input == "concat":
        assert not torch.allclose(loss.metric.one_way(x), loss.metric.one_way(x).T)  # the network is asymmetric


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


def test_materialize_draws_the_metric_from_the_seed() -> None:
    """The trainer materialises the metric right after building the loss: its initial weights are a function
    of the random state then, which the floor reproduces."""
    weights = []
    for _ in range(2):
        torch.manual_seed(4)
        loss = build_loss("quadruplet", learned_metric=True, pair_input="difference_product")
        loss.materialize(12)
        weights.append(torch.cat([p.detach().flatten() for p in loss.parameters()]))
    assert loss.metric.first.weight.shape == (10, 24) and torch.equal(weights[0], weights[1])


def test_learned_metric_batch_of_128_is_affordable() -> None:
    loss = QuadrupletLoss(learned_metric=True)
    y = torch.arange(32).repeat_interleave(4)
    emb = torch.randn(128, 64, requires_grad=True)
    value = loss(emb, y)
    value.backward()
    assert loss.stats["num_tuples"] == 128 * 3 * 124 * 120
    assert math.isfinite(float(value.detach())) and emb.grad is not None


# ---- MargOHNM --------------------------------------------------------------


def ref_margins(g, labels, w1=1.0, w2=0.5):
    n = len(labels)
    pos = [float(g[a][b]) for a in range(n) for b in range(n) if a != b and labels[a] == labels[b]]
    neg = [float(g[a][b]) for a in range(n) for b in range(n) if labels[a] != labels[b]]
    mu_p, mu_n = sum(pos) / len(pos), sum(neg) / len(neg)
    return w1 * (mu_n - mu_p), w2 * (mu_n - mu_p), mu_p, mu_n


def test_margohnm_margins_and_selection_match_loop() -> None:
    labels = LAYOUTS["uneven"]
    y = torch.tensor(labels)
    emb = embeddings(len(labels), seed=2).detach()
    miner = MargOHNMMiner(warmup_iterations=2, distance="euclidean")  # default: every violating one
    g = ref_matrix(emb, "euclidean", True)
    quads = ref_quadruplets(labels)
    a1, a2, mu_p, mu_n = ref_margins(g, labels)
    for call in range(4):
        q = miner(emb, y)
        warm = call < 2
        m1, m2 = (1.0, 0.5) if warm else (a1, a2)
        assert miner.stats["warmup"] == float(warm)
        assert miner.stats["alpha1"] == pytest.approx(m1, rel=1e-9)
        assert miner.stats["alpha2"] == pytest.approx(m2, rel=1e-9)
        assert miner.stats["mu_p"] == pytest.approx(mu_p, rel=1e-9)
        assert miner.stats["mu_n"] == pytest.approx(mu_n, rel=1e-9)
        assert q.alpha1 == pytest.approx(m1, rel=1e-9) and q.alpha2 == pytest.approx(m2, rel=1e-9)
        want = {t for t, v in zip(quads, ref_terms(g, quads, m1, m2)) if float(v) > 0}
        got = set(zip(*(t.tolist() for t in q[:4])))
        assert got == want and len(got) == len(q.i)
        assert 0 < len(want) < len(quads)
        assert miner.stats["num_tuples"] == len(want) == miner.stats["num_violating"]
    assert a1 == pytest.approx(2 * a2) and a1 > 0


def test_margohnm_hardest_cap_keeps_the_hardest() -> None:
    labels = LAYOUTS["pk"]
    y = torch.tensor(labels)
    emb = embeddings(len(labels), seed=4).detach()
    miner = MargOHNMMiner(warmup_iterations=0, max_tuples=25, keep="hardest")
    q = miner(emb, y)
    g = ref_matrix(emb, "squared_euclidean", True)
    a1, a2, _, _ = ref_margins(g, labels)
    quads = ref_quadruplets(labels)
    losses = sorted(((float(v), t) for t, v in zip(quads, ref_terms(g, quads, a1, a2)) if float(v) > 0), reverse=True)
    assert len(losses) > 25 and miner.stats["num_violating"] == len(losses)
    assert list(zip(*(t.tolist() for t in q[:4]))) == [t for _, t in losses[:25]]


def test_margohnm_random_cap_is_a_uniform_sample_of_the_violating() -> None:
    labels = LAYOUTS["pk"]
    y = torch.tensor(labels)
    emb = embeddings(len(labels), seed=4).detach()
    g = ref_matrix(emb, "squared_euclidean", True)
    a1, a2, _, _ = ref_margins(g, labels)
    quads = ref_quadruplets(labels)
    violating = [t for t, v in zip(quads, ref_terms(g, quads, a1, a2)) if float(v) > 0]
    rank = {t: r for r, t in enumerate(violating)}
    torch.manual_seed(0)
    counts = torch.zeros(len(violating), dtype=torch.float64)
    draws = 400
    for _ in range(draws):
        q = MargOHNMMiner(warmup_iterations=0, max_tuples=25)(emb, y)
        got = list(zip(*(t.tolist() for t in q[:4])))
        assert len(got) == len(set(got)) == 25 and set(got) <= set(violating)
        counts[[rank[t] for t in got]] += 1
    # each violating quadruplet is drawn with probability 25 / n: the hardest are not favoured
    expected = draws * 25 / len(violating)
    hardest = sorted(range(len(violating)), key=lambda r: -float(ref_terms(g, [violating[r]], a1, a2)[0]))[:25]
    assert float(counts.sum()) == draws * 25
    assert float(counts[hardest].mean()) < 1.5 * expected
    assert float(((counts - expected) ** 2).mean()) < 3 * expected  # binomial spread, not a fixed subset


@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
def test_margohnm_bound_to_learned_metric_and_margins_reach_the_loss(pair_input: str) -> None:
    """MargOHNM's means are over g^2 (the loss's G), its margins clipped at 0 as the paper writes them."""
    torch.manual_seed(2)
    labels = LAYOUTS["pk"]
    y = torch.tensor(labels)
    loss = QuadrupletLoss(learned_metric=True, pair_input=pair_input).double()
    miner = build_miner("margohnm", warmup_iterations=0)
    miner.bind_loss(loss)
    emb = embeddings(len(labels), seed=6)
    q = miner(emb, y)
    with torch.no_grad():
        g = ref_learned(loss, emb, squared=True)
    a1, a2, mu_p, mu_n = ref_margins(g, labels)
    a1, a2 = max(a1, 0.0), max(a2, 0.0)
    assert miner.stats["mu_p"] == pytest.approx(mu_p, rel=1e-9)
    assert miner.stats["mu_n"] == pytest.approx(mu_n, rel=1e-9)
    quads = ref_quadruplets(labels)
    want = [t for t, v in zip(quads, ref_terms(g, quads, a1, a2)) if float(v) > 0]
    assert len(want) > 0
    # bound to a loss that sums them, the miner lists nothing: the margins and the count reach the loss
    assert isinstance(q, ViolatingQuadruplets) and q.count == len(want) == miner.stats["num_tuples"]
    assert (q.alpha1, q.alpha2) == pytest.approx((a1, a2), rel=1e-9, abs=1e-15)
    got, got_grad = value_and_grad(lambda e: loss(e, y, q), emb)
    ref, ref_grad = value_and_grad(
        lambda e: ref_reduce(ref_terms(ref_learned(loss, e, squared=True), want, a1, a2), "mean", e), emb
    )
    close(got, ref)
    close(got_grad, ref_grad)
    assert loss.stats["fraction_positive"] == 1.0 and loss.stats["num_tuples"] == len(want)
    # bound to the same metric through a loss that does not sum them, it lists them
    lister = build_miner("margohnm", warmup_iterations=0)
    lister.bind_loss(MetricOnly(loss))
    listed = lister(emb, y)
    assert isinstance(listed, Quadruplets) and set(zip(*(t.tolist() for t in listed[:4]))) == set(want)


def test_margohnm_clips_negative_margins_at_zero() -> None:
    """Negatives nearer than positives on average: the paper's margins are max(w (mu_n - mu_p), 0); with
    ``clip_margins: false`` the negative values stay (the pre-issue-23 behaviour)."""
    labels = LAYOUTS["pk"]
    y = torch.tensor(labels)
    rank = [labels[:i].count(c) for i, c in enumerate(labels)]
    base = embeddings(max(rank) + 1, seed=5).detach()
    emb = base[rank] + 0.01 * embeddings(len(labels), seed=6).detach()  # same-rank samples of other classes meet
    g = ref_matrix(emb, "squared_euclidean", True)
    a1, a2, mu_p, mu_n = ref_margins(g, labels)
    assert mu_n < mu_p and a1 < 0
    quads = ref_quadruplets(labels)
    for clip, (m1, m2) in ((True, (0.0, 0.0)), (False, (a1, a2))):
        miner = MargOHNMMiner(warmup_iterations=0, clip_margins=clip)
        q = miner(emb, y)
        assert (q.alpha1, q.alpha2) == pytest.approx((m1, m2), rel=1e-9, abs=1e-15)
        want = {t for t, v in zip(quads, ref_terms(g, quads, m1, m2)) if float(v) > 0}
        assert set(zip(*(t.tolist() for t in q[:4]))) == want and len(want) > 0
    with pytest.raises(BenchError, match="clip_margins"):
        build_miner("margohnm", clip_margins="yes")


class MetricOnly:
    """A loss's metric without its closed-form sum: what a plugin quadruplet loss may look like."""

    def __init__(self, loss: QuadrupletLoss) -> None:
        self.distance_matrix = loss.distance_matrix


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("layout", ["pk", "uneven", "singletons_mixed", "two_classes"])
def test_margohnm_unlisted_equals_listed(layout: str, distance: str, reduction: str) -> None:
    """The closed-form sum over the violating quadruplets gives the loss and gradient of the listed ones,
    in warm-up and with adaptive margins (negative ones included, where negatives sit nearer)."""
    labels = {**LAYOUTS, **DEGENERATE}[layout]
    y = torch.tensor(labels)
    loss = QuadrupletLoss(distance=distance, reduction=reduction)
    bound = MargOHNMMiner(warmup_iterations=1, distance=distance, clip_margins=False)  # negative margins reach it
    bound.bind_loss(loss)
    listed_miner = MargOHNMMiner(warmup_iterations=1, distance=distance, clip_margins=False)
    for call, seed in enumerate((3, 3, 5)):
        emb = embeddings(len(labels), seed=seed)
        if call == 2:  # a sample sits by the same-rank samples of other classes: negatives nearer, margins < 0
            rank = [labels[:i].count(c) for i, c in enumerate(labels)]
            emb = (embeddings(max(rank) + 1, seed=seed).detach()[rank] + 0.01 * emb.detach()).requires_grad_()
        lazy, listed = bound(emb, y), listed_miner(emb, y)
        if call == 2 and layout not in DEGENERATE:
            assert lazy.alpha1 < 0 and lazy.alpha2 < 0
        assert isinstance(lazy, ViolatingQuadruplets) and isinstance(listed, Quadruplets)
        assert (lazy.alpha1, lazy.alpha2) == (listed.alpha1, listed.alpha2)
        assert lazy.count == len(listed.i) == bound.stats["num_violating"]
        assert bound.stats["mean_loss"] == pytest.approx(listed_miner.stats["mean_loss"], rel=1e-9, abs=1e-12)
        got, got_grad = value_and_grad(lambda e: loss(e, y, lazy), emb)
        ref, ref_grad = value_and_grad(lambda e: loss(e, y, listed), emb)
        close(got, ref)
        close(got_grad, ref_grad)


def test_margohnm_with_nothing_violating_gives_no_gradient_to_the_metric() -> None:
    """Valid quadruplets, none violating (the learned g lies in [0, 1], so fixed margins of -1 and -2 ask
    nothing): zero loss, and the learned metric's parameters get no gradient, as when a listed miner
    returns nothing."""
    y = torch.tensor(LAYOUTS["pk"])
    emb = embeddings(len(y))
    loss = QuadrupletLoss(learned_metric=True, reduction="sum").double()
    miner = MargOHNMMiner(warmup_iterations=5, alpha1=-1.0, alpha2=-2.0)
    miner.bind_loss(loss)
    q = miner(emb, y)
    assert isinstance(q, ViolatingQuadruplets) and q.count == 0
    value = loss(emb, y, q)
    value.backward()
    assert float(value.detach()) == 0.0 and loss.stats["num_tuples"] == 0
    assert all(p.grad is None for p in loss.parameters())


def test_margohnm_lists_for_a_cap_or_another_loss() -> None:
    """Only an uncapped miner bound to a loss that sums violating quadruplets leaves them unlisted."""
    y = torch.tensor(LAYOUTS["pk"])
    emb = embeddings(len(y)).detach()
    capped = MargOHNMMiner(warmup_iterations=0, max_tuples=5)
    capped.bind_loss(QuadrupletLoss())
    assert isinstance(capped(emb, y), Quadruplets)
    other = MargOHNMMiner(warmup_iterations=0)
    other.bind_loss(build_loss("contrastive"))
    assert isinstance(other(emb, y), Quadruplets)

    class Reweighted(QuadrupletLoss):  # a plugin's variant that reads the indices itself
        def compute(self, embeddings, labels, indices_tuple):
            return super().compute(embeddings, labels, indices_tuple) * 2

    variant = MargOHNMMiner(warmup_iterations=0)
    variant.bind_loss(Reweighted())
    assert isinstance(variant(emb, y), Quadruplets)
    with pytest.raises(BenchError, match="batch of 8"):
        QuadrupletLoss()(emb[:6], y[:6], ViolatingQuadruplets(8, 1.0, 0.5, 3))


def test_margohnm_without_negatives_returns_nothing() -> None:
    miner = MargOHNMMiner(warmup_iterations=0)
    q = miner(embeddings(5).detach(), torch.tensor([1] * 5))
    assert len(q.i) == 0 and miner.stats["num_tuples"] == 0 and q.alpha1 == 1.0


# ---- hardest of pool -------------------------------------------------------


def ref_pool_losses(pool, g, kind, margin=0.2, alpha1=1.0, alpha2=0.5) -> list[float]:
    if kind == "triplet":
        return [max(float(g[a][p]) - float(g[a][n]) + margin, 0.0) for a, p, n in zip(*(t.tolist() for t in pool))]
    quads = list(zip(*(t.tolist() for t in pool)))
    return [float(v) for v in ref_terms(g, quads, alpha1, alpha2)]


@pytest.mark.parametrize("kind", ["quadruplet", "triplet"])
def test_hardest_of_pool_keeps_exactly_the_hardest(kind: str) -> None:
    labels = torch.arange(6).repeat_interleave(3)
    emb = embeddings(len(labels), seed=8).detach()
    miner = HardestOfPoolMiner(pool_size=60, num_hardest=10, num_random=5, kind=kind, seed=3)
    out = miner(emb, labels)
    assert isinstance(out, Quadruplets) == (kind == "quadruplet") and len(out) == (6 if kind == "quadruplet" else 3)
    draw = draw_quadruplets if kind == "quadruplet" else draw_triplets
    pool = draw(labels, 60, torch.Generator().manual_seed(3))
    losses = ref_pool_losses(pool, ref_matrix(emb, "squared_euclidean", True), kind)
    rows = list(zip(*(t.tolist() for t in pool)))
    order = sorted(range(60), key=lambda t: -losses[t])  # stable: ties (repeated tuples, zeros) in pool order
    assert losses[order[9]] > 0 and len(set(rows)) > 40
    kept = list(zip(*(t.tolist() for t in out[: len(rows[0])])))
    assert kept[:10] == [rows[t] for t in order[:10]]
    rest = [rows[t] for t in order[10:]]
    assert len(kept) == 15 and all(r in rest for r in kept[10:])
    assert miner.stats["num_tuples"] == 15
    assert miner.stats["hardest_loss"] == pytest.approx(sum(losses[t] for t in order[:10]) / 10, rel=1e-9)
    again = HardestOfPoolMiner(pool_size=60, num_hardest=10, num_random=5, kind=kind, seed=3)(emb, labels)
    assert all(torch.equal(a, b) for a, b in zip(out[:3], again[:3]))


def test_random_tuples_are_valid_and_cover_the_classes() -> None:
    labels = torch.tensor([3, 3, 1, 1, 1, 7, 2, 2, 9, 9, 9, 9])
    g = torch.Generator().manual_seed(0)
    i, j, l, k = draw_quadruplets(labels, 3000, g)
    assert bool(
        (
            (labels[i] == labels[j])
            & (i != j)
            & (labels[l] != labels[k])
            & (labels[l] != labels[i])
            & (labels[k] != labels[i])
        ).all()
    )
    assert set(i.tolist()) == set(range(12)) - {5}  # the singleton class 7 is never an anchor
    assert set(l.tolist()) == set(k.tolist()) == set(range(12))
    a, p, n = draw_triplets(labels, 3000, g)
    assert bool(((labels[a] == labels[p]) & (a != p) & (labels[a] != labels[n])).all())
    assert all(len(t) == 0 for t in draw_quadruplets(torch.tensor([0, 0, 1, 1]), 10, g))
    assert all(len(t) == 0 for t in draw_triplets(torch.tensor([0, 1, 2]), 10, g))


def test_hardest_of_pool_dataset_level() -> None:
    labels = torch.arange(20).repeat_interleave(5)
    table = embeddings(100, dim=8, seed=9).detach()
    calls: list[torch.Tensor] = []

    def embed(idx: torch.Tensor) -> torch.Tensor:
        calls.append(idx)
        return table[idx]

    loss = QuadrupletLoss(alpha1=0.6, alpha2=0.3, distance="euclidean")
    miner = HardestOfPoolMiner(pool_size=40, num_hardest=8, num_random=4)
    assert miner.dataset_level
    miner.bind_loss(loss)
    samples, q = miner.batch(0, embed, labels, torch.Generator().manual_seed(5))
    pool = draw_quadruplets(labels, 40, torch.Generator().manual_seed(5))
    assert len(calls) == 1 and torch.equal(calls[0], torch.unique(torch.cat(pool)))
    kept = list(zip(*(samples[t].tolist() for t in q[:4])))
    assert torch.equal(torch.unique(samples[torch.cat(list(q[:4]))]), samples)  # every sample is used
    assert len(kept) == 12 and len(samples) <= 48
    losses = ref_pool_losses(pool, ref_matrix(table, "euclidean", True), "quadruplet", alpha1=0.6, alpha2=0.3)
    rows = list(zip(*(t.tolist() for t in pool)))
    order = sorted(range(40), key=lambda t: -losses[t])
    assert kept[:8] == [rows[t] for t in order[:8]]
    value = loss(table[samples].clone().requires_grad_(), labels[samples], q)  # positions within samples
    assert float(value.detach()) == pytest.approx(sum(losses[rows.index(r)] for r in kept) / 12, rel=1e-9)
    with pytest.raises(BenchError, match="3 classes"):
        miner.batch(0, embed, torch.tensor([0, 0, 1, 1]), torch.Generator())


# ---- bad inputs ------------------------------------------------------------


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
