"""MargOHNM (`bench.miners.margohnm`): margins and selection against float64 loops, the unlisted path equal to the listed one."""

from __future__ import annotations

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
from bench.losses.quadruplet import QuadrupletLoss
from bench.miners.margohnm import MargOHNMMiner
from bench.registry import build_loss, build_miner
from bench.tuples import Quadruplets, ViolatingQuadruplets


def ref_margins(g, labels, w1=1.0, w2=0.5):
    n = len(labels)
    pos = [float(g[a][b]) for a in range(n) for b in range(n) if a != b and labels[a] == labels[b]]
    neg = [float(g[a][b]) for a in range(n) for b in range(n) if labels[a] != labels[b]]
    mu_p, mu_n = sum(pos) / len(pos), sum(neg) / len(neg)
    return w1 * (mu_n - mu_p), w2 * (mu_n - mu_p), mu_p, mu_n


class MetricOnly:
    """A loss's metric without its closed-form sum: what a plugin quadruplet loss may look like."""

    def __init__(self, loss: QuadrupletLoss) -> None:
        self.distance_matrix = loss.distance_matrix


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
