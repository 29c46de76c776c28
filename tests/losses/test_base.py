"""What every own loss shares (`bench.losses.base`): tuples read as pairs, zero losses, parameter and input errors."""

from __future__ import annotations

import pytest
import torch
from _pair_loss_refs import OWN, PML_BACKED, PROXY, assert_same, batch, quadruplet

from bench.errors import BenchError
from bench.registry import ENTRIES, build_loss
from bench.tuples import Quadruplets


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


def test_triplets_are_used_as_their_distinct_pairs():
    x, y = batch(9, 4, 3, seed=4)
    j = int(torch.where(y == y[0])[0][1])
    n0, n1 = torch.where(y != y[0])[0][:2].tolist()
    triplets = tuple(torch.tensor(v) for v in ([0, 0, 0, 0], [j, j, j, j], [n0, n1, n0, n1]))  # each one twice
    pairs = tuple(torch.tensor(v) for v in ([0], [j], [0, 0], [n0, n1]))
    for name in OWN:
        loss = build_loss(name)
        assert_same(lambda e: loss(e, y, triplets), lambda e: loss(e, y, pairs), x)


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


def test_every_error_is_one_line():
    with pytest.raises(BenchError) as e:
        build_loss("infonce", temperatur=0.1)
    assert "\n" not in str(e.value) and "temperatur" in str(e.value)
