"""Distances and reductions as objects, and every searched parameter of an own method being live."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from bench import distances, reducers
from bench.errors import BenchError
from bench.registry import ENTRIES, build_loss, build_miner


def _x(n: int = 7, dim: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---- distances -------------------------------------------------------------------


def test_each_name_has_one_meaning_computed_by_hand() -> None:
    x, y = _x(4, 3, 1), _x(5, 3, 2)
    xn, yn = F.normalize(x, dim=1), F.normalize(y, dim=1)
    for i in range(4):
        for j in range(5):
            d = math.dist(xn[i].tolist(), yn[j].tolist())
            cos = float(xn[i] @ yn[j])
            assert float(distances.resolve("euclidean").matrix(x, y)[i, j]) == pytest.approx(d, rel=1e-12)
            assert float(distances.resolve("squared_euclidean").matrix(x, y)[i, j]) == pytest.approx(d * d, rel=1e-12)
            assert float(distances.resolve("cosine").matrix(x, y)[i, j]) == pytest.approx(1 - cos, rel=1e-12)
            assert float(distances.resolve("cosine").similarity(x, y)[i, j]) == pytest.approx(cos, rel=1e-12)
            raw = math.dist(x[i].tolist(), y[j].tolist())
            assert float(distances.resolve("euclidean", normalize=False).matrix(x, y)[i, j]) == pytest.approx(raw)
            assert float(
                distances.resolve("dot", False, distances.SIMILARITIES).similarity(x, y)[i, j]
            ) == pytest.approx(float(x[i] @ y[j]))


@pytest.mark.parametrize("name", distances.DISTANCES)
@pytest.mark.parametrize("normalize", [True, False])
def test_similarity_is_minus_the_distance_up_to_a_constant_and_paired_is_the_diagonal(
    name: str, normalize: bool
) -> None:
    d = distances.resolve(name, normalize)
    x, y = _x(6, 4, 3), _x(6, 4, 4)
    shift = d.matrix(x, y) + d.similarity(x, y)
    assert torch.allclose(shift, shift[0, 0].expand_as(shift), atol=1e-12)
    assert float(shift[0, 0]) == pytest.approx(1.0 if name == "cosine" else 0.0, abs=1e-12)
    assert torch.allclose(d.paired(x, y), torch.diagonal(d.matrix(x, y)), atol=1e-12)
    assert torch.equal(d.matrix(x), d.matrix(x, x))
    gap = d.matrix(x, y) - d.shifted(x, y)
    assert torch.allclose(gap, gap[0, 0].expand_as(gap), atol=1e-12)


def test_losses_and_miners_take_names_or_objects_alike() -> None:
    x, y = _x(12, 6, 5), torch.arange(4).repeat_interleave(3)
    for name in distances.DISTANCES:
        mined = build_miner("batch_hard", distance=name, normalize=False)(x, y)
        by_name = build_loss("triplet", distance=name, normalize=False)(x, y, mined)
        obj = distances.resolve(name, normalize=False)
        assert all(torch.equal(a, b) for a, b in zip(build_miner("batch_hard", distance=obj)(x, y), mined))
        by_object = build_loss("triplet", distance=obj)(x, y, mined)
        assert torch.equal(by_name, by_object)
    loss = build_loss("lifted_structure", distance="cosine", normalize=False)
    assert loss.distance == distances.Cosine(normalize=False) and loss.normalize is False


def test_unknown_distances_and_reductions_are_bench_errors() -> None:
    with pytest.raises(BenchError, match="unknown distance 'manhattan': expected one of euclidean"):
        distances.resolve("manhattan")
    with pytest.raises(BenchError, match="unknown distance 'dot'"):
        build_loss("triplet", distance="dot")  # a similarity only: no margin formula may use it
    with pytest.raises(BenchError, match="unknown reduction 'median': expected one of mean, avg_nonzero, sum"):
        reducers.resolve("median")


# ---- reductions ------------------------------------------------------------------


def test_reductions_follow_pml_and_keep_the_graph_when_empty() -> None:
    losses = torch.tensor([0.0, 2.0, 0.0, 4.0], dtype=torch.float64)
    assert float(reducers.resolve("mean")(losses)) == 1.5
    assert float(reducers.resolve("avg_nonzero")(losses)) == 3.0
    assert float(reducers.resolve("sum")(losses)) == 6.0
    e = _x(3, 2).requires_grad_(True)
    for name in reducers.REDUCTIONS:
        r = reducers.resolve(name)
        for empty in [losses.new_zeros(0)] + ([losses.new_zeros(2)] if name == "avg_nonzero" else []):
            value = r(empty, e)
            value.backward()
            assert float(value.detach()) == 0.0 and e.grad is not None and not e.grad.any()
        assert float(r.divide(torch.tensor(6.0), 4, 2, e)) == {"mean": 1.5, "avg_nonzero": 3.0, "sum": 6.0}[name]


def test_the_reduction_is_read_and_set_by_name() -> None:
    loss = build_loss("quadruplet")
    assert loss.reduction == "mean" and isinstance(loss.reducer, reducers.MeanReduction)
    loss.reduction = "sum"
    assert isinstance(loss.reducer, reducers.SumReduction)
    with pytest.raises(BenchError, match="unknown reduction"):
        loss.reduction = "max"


# ---- every searched parameter is live --------------------------------------------


def probe_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """16 classes x 4, L2-normalised: class centres plus noise of a per-sample scale, so that
    distances within a class span the whole range a trained model shows (pure noise in many
    dimensions puts every pair near sqrt(2), where a positive margin below 1 can never act)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(16).repeat_interleave(4)
    centres = torch.randn(16, 32, generator=g, dtype=torch.float64)[y]
    spread = torch.exp(torch.empty(64, 1, dtype=torch.float64).uniform_(math.log(0.1), math.log(2.0), generator=g))
    return F.normalize(centres + spread * torch.randn(64, 32, generator=g, dtype=torch.float64), dim=1), y


PARTNER = {"triplets": "triplet", "quadruplets": "quadruplet"}  # the loss a miner's search is probed with


def gradient(
    loss_name: str,
    loss_params: dict[str, Any],
    miner_name: str | None = None,
    miner_params: dict[str, Any] | None = None,
) -> torch.Tensor:
    x, y = probe_batch()
    x.requires_grad_(True)
    torch.manual_seed(0)  # the learned metric's initialisation, when any
    loss = build_loss(loss_name, **loss_params)
    tuples = None
    if miner_name is not None:
        miner = build_miner(miner_name, **(miner_params or {}))
        if hasattr(miner, "bind_loss"):
            miner.bind_loss(loss)
        tuples = miner(x, y)
    loss(x, y, tuples).backward()
    assert x.grad is not None
    return x.grad.flatten()


def _ends(space: dict[str, Any]) -> tuple[Any, Any]:
    return space["low"], space["high"]


SEARCHED = [
    (e.kind, e.name, p, s)
    for e in ENTRIES
    if e.kind in ("loss", "miner") and not e.pml_backed
    for p, s in e.search_space.items()
]


def test_every_own_method_search_is_probed() -> None:
    probed = {(kind, name) for kind, name, _, _ in SEARCHED}
    assert {("loss", "lifted_structure"), ("loss", "npair"), ("miner", "margohnm")} <= probed
    assert ("miner", "hard") not in probed  # its margin could never act: no search


@pytest.mark.parametrize("kind, name, param, space", SEARCHED, ids=[f"{k}:{n}.{p}" for k, n, p, _ in SEARCHED])
def test_both_ends_of_each_searched_range_give_different_gradient_directions(
    kind: str, name: str, param: str, space: dict[str, Any]
) -> None:
    """A rescaled gradient changes nothing under Adam: the two ends must turn the gradient."""
    low, high = _ends(space)
    entry = next(e for e in ENTRIES if e.kind == kind and e.name == name)
    if kind == "loss":
        g_low, g_high = gradient(name, {param: low}), gradient(name, {param: high})
    else:
        partner = PARTNER[entry.tuples]
        g_low, g_high = gradient(partner, {}, name, {param: low}), gradient(partner, {}, name, {param: high})
    cosine = float(F.cosine_similarity(g_low, g_high, dim=0))
    assert cosine < 1 - 1e-4, f"{kind} {name}: {param} at {low} and {high} gives the same direction ({cosine:.6f})"


@pytest.mark.parametrize("warmup", [100, 0])
def test_margohnm_supplies_the_margins_and_its_weights_act(warmup: int) -> None:
    """With MargOHNM the loss's alpha1/alpha2 change nothing; the miner's w1/w2 do, in warm-up and after."""
    miner = {"warmup_iterations": warmup}
    assert torch.equal(
        gradient("quadruplet", {"alpha1": 0.6, "alpha2": 0.05}, "margohnm", miner),
        gradient("quadruplet", {"alpha1": 2.0, "alpha2": 0.5}, "margohnm", miner),
    )
    for low, high in ({"w1": 0.6}, {"w1": 2.0}), ({"w2": 0.1}, {"w2": 0.5}):
        cosine = F.cosine_similarity(
            gradient("quadruplet", {}, "margohnm", {**miner, **low}),
            gradient("quadruplet", {}, "margohnm", {**miner, **high}),
            dim=0,
        )
        assert float(cosine) < 1 - 1e-4


def test_margohnm_warmup_margins_are_the_weights_unless_given() -> None:
    x, y = probe_batch()
    q = build_miner("margohnm", w1=1.5, w2=0.25)(x, y)
    assert (q.alpha1, q.alpha2) == (1.5, 0.25)
    q = build_miner("margohnm", w1=1.5, w2=0.25, alpha1=0.9, alpha2=0.3)(x, y)
    assert (q.alpha1, q.alpha2) == (0.9, 0.3)
    with pytest.raises(BenchError, match="w1 must be greater than w2"):
        build_miner("margohnm", w1=0.5, w2=0.5)


def test_the_dead_parameters_of_issue_11_are_not_searched() -> None:
    """Lifted's margin at scale 1 barely turns the gradient (issue 11: cosine 1.0000 on pure noise; here
    within 1e-3), its scale does; the hard miner's margin is gone."""
    low, high = gradient("lifted_structure", {"margin": 0.1}), gradient("lifted_structure", {"margin": 2.0})
    assert float(F.cosine_similarity(low, high, dim=0)) > 1 - 1e-3
    low, high = gradient("lifted_structure", {"scale": 1.0}), gradient("lifted_structure", {"scale": 64.0})
    assert float(F.cosine_similarity(low, high, dim=0)) < 0.99
    with pytest.raises(BenchError, match="has no parameter 'margin'"):
        build_miner("hard", margin=0.2)
