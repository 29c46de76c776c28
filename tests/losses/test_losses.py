"""Pair losses: equality with PML (the cross-check), loop references where PML differs, input errors."""

from __future__ import annotations

import mpmath
import pytest
import torch
import torch.nn.functional as F

from bench.crosscheck import TOLERANCE, rel_diff
from bench.crosscheck.losses import checks, run, specs
from bench.errors import BenchError
from bench.losses.contrastive import ContrastiveLoss
from bench.losses.infonce import InfoNCELoss
from bench.losses.lifted import LiftedStructureLoss
from bench.losses.npair import NPairLoss
from bench.registry import ENTRIES, build_loss, build_miner
from bench.tuples import Quadruplets, all_pairs

OWN = ("contrastive", "lifted_structure", "npair", "infonce")
PML_BACKED = [e.name for e in ENTRIES if e.kind == "loss" and e.pml_backed]
PROXY = {"num_classes": 4, "embedding_size": 6}


def batch(b: int = 10, dim: int = 5, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(b) % classes
    return torch.randn(b, dim, generator=g, dtype=torch.float64), labels[torch.randperm(b, generator=g)]


def quadruplet(labels: torch.Tensor) -> Quadruplets:
    """One quadruplet (i, j, l, k): y_i = y_j, and l, k of two other, different classes."""
    i, j = torch.where(labels == labels[0])[0][:2].tolist()
    others = torch.where(labels != labels[0])[0]
    l = int(others[0])
    k = int(others[labels[others] != labels[l]][0])
    return Quadruplets(*(torch.tensor([v]) for v in (i, j, l, k)))


def value_and_grad(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    v = fn(x)
    v.backward()
    return v.detach(), x.grad


def assert_same(fn_a, fn_b, x: torch.Tensor, tol: float = 1e-12) -> None:
    va, ga = value_and_grad(fn_a, x)
    vb, gb = value_and_grad(fn_b, x)
    assert rel_diff(va, vb) <= tol, (float(va), float(vb))
    assert rel_diff(ga, gb) <= tol


# ---- the cross-check against PML ------------------------------------------------


@pytest.mark.parametrize("spec", specs(), ids=lambda s: s.name)
def test_equal_to_pml(spec):
    result = run(spec, cases=21, seed=1)
    assert result.cases >= 18, result.note  # nearly every case compared, not skipped
    assert result.max_rel_value <= TOLERANCE and result.max_rel_grad <= TOLERANCE, result


def test_checks_cover_every_own_loss_and_carry_pml_settings():
    results = list(checks(cases=2, seed=3))
    assert {r.name.split(" ")[0] for r in results} == set(OWN)
    assert all(r.passed and r.pml_settings for r in results)


# ---- loop references for the forms PML does not have ---------------------------------


def hadsell_reference(x, labels, pairs, pos_margin, neg_margin, w, squared):
    terms = []
    a1, p, a2, n = pairs
    for i, j, positive in [(i, j, True) for i, j in zip(a1.tolist(), p.tolist())] + [
        (i, j, False) for i, j in zip(a2.tolist(), n.tolist())
    ]:
        d = torch.linalg.vector_norm(x[i] / x[i].norm() - x[j] / x[j].norm())
        if squared:
            t = w * torch.relu(d**2 - pos_margin) if positive else (1 - w) * torch.relu(neg_margin - d**2)
        else:
            t = w * torch.relu(d - pos_margin) ** 2 if positive else (1 - w) * torch.relu(neg_margin - d) ** 2
        terms.append(t)
    return torch.stack(terms).mean()


@pytest.mark.parametrize("form", ["hadsell", "hadsell_squared"])
@pytest.mark.parametrize("use_tuple", [False, True])
def test_hadsell_forms_equal_a_loop(form, use_tuple):
    x, y = batch(9, 4, 3, seed=5)
    pairs = all_pairs(y)
    if use_tuple:  # a few pairs, one of them twice
        pairs = tuple(t[[0, 3, 3, 7]] for t in pairs[:2]) + tuple(t[[1, 2, 20, 20, 40]] for t in pairs[2:])
    loss = ContrastiveLoss(0.1, 0.9, form=form, pos_weight=0.3)
    assert loss.reduction == "mean"
    assert_same(
        lambda e: loss(e, y, pairs if use_tuple else None),
        lambda e: hadsell_reference(e, y, pairs, 0.1, 0.9, 0.3, form == "hadsell_squared"),
        x,
    )


def lifted_reference(x, labels, margin, hard, scale=1.0):
    """Song et al. 2016, eq. 2 and eq. 3 (hard), over unordered positive pairs, on normalised embeddings;
    ``scale`` s: the soft maximum ``log sum exp(s * slack) / s``."""
    x = x / x.norm(dim=1, keepdim=True)
    b = len(x)
    dist = lambda i, j: torch.linalg.vector_norm(x[i] - x[j])  # noqa: E731
    terms = []
    for i in range(b):
        for j in range(i + 1, b):
            if labels[i] != labels[j]:
                continue
            slack = [margin - dist(i, k) for k in range(b) if labels[k] != labels[i]]
            slack += [margin - dist(j, k) for k in range(b) if labels[k] != labels[j]]
            neg = torch.stack(slack).max() if hard else torch.logsumexp(scale * torch.stack(slack), 0) / scale
            terms.append(torch.relu(neg + dist(i, j)) ** 2)
    return torch.stack(terms).sum() / (2 * len(terms))


@pytest.mark.parametrize("form", ["smooth", "hard"])
def test_lifted_structure_equals_the_paper(form):
    x, y = batch(10, 3, 3, seed=2)
    assert_same(
        lambda e: LiftedStructureLoss(margin=1.2, form=form)(e, y),
        lambda e: lifted_reference(e, y, 1.2, form == "hard"),
        x,
    )


@pytest.mark.parametrize("scale", [0.5, 8.0, 40.0])
def test_lifted_structure_scale_equals_the_loop(scale):
    x, y = batch(12, 4, 3, seed=5)
    assert_same(
        lambda e: LiftedStructureLoss(margin=0.7, scale=scale)(e, y),
        lambda e: lifted_reference(e, y, 0.7, False, scale),
        x,
    )


@pytest.mark.parametrize("temperature", [1.0, 0.05, 0.3])
def test_npair_with_l2_penalty_equals_a_loop_on_any_layout(temperature):
    x, y = batch(11, 4, 4, seed=7)
    y[3] = 9  # a singleton class: no pair
    reg = 0.05

    def reference(e):
        chosen = []
        for c in sorted(set(y.tolist())):
            members = [i for i in range(len(y)) if y[i] == c]
            if len(members) >= 2:
                chosen.append(members[:2])
        terms, penalty = [], []
        for a, p in chosen:
            gaps = [(e[a] @ e[q] - e[a] @ e[p]) / temperature for _, q in chosen if q != p]
            terms.append(torch.log(1 + torch.exp(torch.stack(gaps)).sum()))
            penalty.append(e[a] @ e[a] + e[p] @ e[p])
        return torch.stack(terms).mean() + reg * torch.stack(penalty).mean()

    assert_same(lambda e: NPairLoss(l2_reg=reg, normalize=False, temperature=temperature)(e, y), reference, x)


def test_infonce_is_accurate_where_the_loss_is_tiny():
    """Well-separated classes at a low temperature: per-pair losses ~1e-20, checked at 50 digits."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(4).repeat_interleave(3)
    x = torch.eye(4, dtype=torch.float64)[y] + 0.05 * torch.randn(12, 4, generator=g, dtype=torch.float64)
    tau = 0.02
    loss = InfoNCELoss(temperature=tau)
    own = float(loss(x, y))
    mpmath.mp.dps = 50
    xn = F.normalize(x, dim=1)
    sim = (xn @ xn.T).tolist()
    terms = []
    for a in range(12):
        for p in range(12):
            if a != p and y[a] == y[p]:
                s = sum(
                    mpmath.exp((mpmath.mpf(sim[a][n]) - mpmath.mpf(sim[a][p])) / tau) for n in range(12) if y[n] != y[a]
                )
                terms.append(mpmath.log1p(s))
    reference = sum(terms) / len(terms)
    assert 0 < reference < 1e-12
    assert abs(own - float(reference)) <= 1e-12 * float(reference)


# ---- behaviour ------------------------------------------------------------------


@pytest.mark.parametrize("name", OWN)
def test_no_valid_pair_gives_a_zero_with_zero_gradients(name):
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    empty = (torch.tensor([], dtype=torch.long),) * 4
    cases = [(5, torch.tensor([0, 0, 1, 1, 2]), empty), (1, torch.tensor([7]), None)]
    if name != "contrastive":  # contrastive still pushes negatives apart, and pulls positives together
        cases += [(5, torch.arange(5), None), (5, torch.zeros(5, dtype=torch.long), None)]
    loss = build_loss(name)
    for rows, labels, tuple_ in cases:
        value = loss(x[:rows], labels, tuple_)
        value.backward()
        assert value.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))
        x.grad = None


@pytest.mark.parametrize("name", OWN)
def test_quadruplets_are_used_as_their_pairs(name):
    x, y = batch(8, 4, 4, seed=1)
    i, j, l, k = quadruplet(y)[:4]
    loss = build_loss(name)
    pairs = (i, j, torch.cat([i, l]), torch.cat([k, k]))
    assert_same(lambda e: loss(e, y, Quadruplets(i, j, l, k)), lambda e: loss(e, y, pairs), x)


def test_stats_count_pairs_and_positive_share():
    x, y = batch(10, 4, 3)
    loss = ContrastiveLoss(neg_margin=100.0)  # every negative pair violates the margin
    loss(x, y)
    negatives = float((y[:, None] != y[None, :]).sum())
    assert loss.stats["num_tuples"] == 10 * 9 and loss.stats["num_neg_pairs"] == negatives
    assert loss.stats["fraction_positive"] >= negatives / 90


def test_triplets_are_used_as_their_distinct_pairs():
    x, y = batch(9, 4, 3, seed=4)
    j = int(torch.where(y == y[0])[0][1])
    n0, n1 = torch.where(y != y[0])[0][:2].tolist()
    triplets = tuple(torch.tensor(v) for v in ([0, 0, 0, 0], [j, j, j, j], [n0, n1, n0, n1]))  # each one twice
    pairs = tuple(torch.tensor(v) for v in ([0], [j], [0, 0], [n0, n1]))
    for name in OWN:
        loss = build_loss(name)
        assert_same(lambda e: loss(e, y, triplets), lambda e: loss(e, y, pairs), x)


@pytest.mark.parametrize("name", PML_BACKED)
def test_pml_backed_losses_train_their_parameters_and_take_quadruplets(name):
    x, y = batch(12, 6, 4)
    loss = build_loss(name, context=PROXY)
    needs_proxies = name in (
        "pml:proxy_anchor",
        "pml:arcface",
        "pml:cosface",
        "pml:proxy_nca",
        "pml:normalized_softmax",
        "pml:soft_triple",
    )
    assert (len(list(loss.parameters())) > 0) == needs_proxies
    for t in (None, quadruplet(y)):
        e = x.clone().requires_grad_(True)
        value = loss(e, y, t)
        value.backward()
        assert torch.isfinite(value) and torch.isfinite(e.grad).all()


def test_pml_backed_miner_returns_pml_pairs_and_stats():
    from pytorch_metric_learning.miners import MultiSimilarityMiner

    x, y = batch(16, 5, 4)
    miner = build_miner("pml:multi_similarity", epsilon=0.3)
    ours, theirs = miner(x, y), MultiSimilarityMiner(epsilon=0.3)(x, y)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert miner.stats["num_tuples"] == len(ours[0]) + len(ours[2]) > 0


@pytest.mark.parametrize("name", OWN + tuple(PML_BACKED))
def test_search_space_names_real_parameters(name):
    entry = next(e for e in ENTRIES if e.kind == "loss" and e.name == name)
    middle = {"float": lambda s: (s["low"] + s["high"]) / 2, "int": lambda s: (s["low"] + s["high"]) // 2}
    params = {
        k: middle[s["type"]](s) if s["type"] in middle else s["choices"][0] for k, s in entry.search_space.items()
    }
    loss = build_loss(name, context=PROXY, **params)
    x, y = batch(8, 6, 4)
    assert torch.isfinite(loss(x, y))


# ---- errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, params, message",
    [
        ("contrastive", {"margin": 1.0}, "no parameter 'margin'"),
        ("contrastive", {"distance": "manhattan"}, "unknown distance 'manhattan'"),
        ("contrastive", {"form": "caffe"}, "unknown form"),
        ("lifted_structure", {"reduction": "median"}, "unknown reduction 'median'"),
        ("lifted_structure", {"margin": float("nan")}, "margin must be a finite number"),
        ("npair", {"l2_reg": -1.0}, "l2_reg must be >= 0"),
        ("npair", {"normalize": "yes"}, "normalize must be true or false"),
        ("infonce", {"temperature": 0.0}, "temperature must be > 0"),
        ("pml:arcface", {"scale": -1.0}, "scale must be > 0"),
        ("nope", {}, "unknown loss 'nope'"),
    ],
)
def test_bad_parameters_are_bench_errors(name, params, message):
    with pytest.raises(BenchError, match=message):
        build_loss(name, context=PROXY, **params)


@pytest.mark.parametrize(
    "embeddings, labels, tuple_, message",
    [
        (torch.randn(4), torch.zeros(4, dtype=torch.long), None, "embeddings must be a 2-D float tensor"),
        (torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, dtype=torch.long), None, "embeddings must be a 2-D float"),
        (torch.randn(4, 3), torch.zeros(4, 1, dtype=torch.long), None, "labels must be a 1-D integer tensor"),
        (torch.randn(4, 3), torch.zeros(4), None, "labels must be a 1-D integer tensor"),
        (torch.randn(4, 3), torch.zeros(5, dtype=torch.long), None, "labels has 5 entries but embeddings has 4"),
        (torch.randn(4, 3), torch.zeros(4, dtype=torch.long), (torch.tensor([0]),) * 2, "indices_tuple must be"),
        (torch.randn(4, 3), torch.zeros(4, dtype=torch.long), (torch.tensor([0, 9]),) * 3, "outside the batch of 4"),
        (
            torch.randn(4, 3),
            torch.zeros(4, dtype=torch.long),
            (torch.tensor([0]), torch.tensor([1, 2]), torch.tensor([0])),
            "mismatched lengths",
        ),
        (torch.randn(4, 3), torch.zeros(4, dtype=torch.long), (torch.tensor([0.0]),) * 3, "1-D integer tensors"),
    ],
)
@pytest.mark.parametrize("name", OWN + ("pml:multi_similarity",))
def test_bad_inputs_are_bench_errors(name, embeddings, labels, tuple_, message):
    with pytest.raises(BenchError, match=message):
        build_loss(name)(embeddings, labels, tuple_)


def test_proxy_losses_refuse_labels_without_a_proxy():
    x, _ = batch(6, 6)
    with pytest.raises(BenchError, match="proxies for labels 0..3"):
        build_loss("pml:proxy_anchor", context=PROXY)(x, torch.tensor([0, 1, 2, 3, 4, 0]))
    with pytest.raises(BenchError, match="needs num_classes"):
        build_loss("pml:cosface")


def test_every_error_is_one_line():
    with pytest.raises(BenchError) as e:
        build_loss("infonce", temperatur=0.1)
    assert "\n" not in str(e.value) and "temperatur" in str(e.value)
