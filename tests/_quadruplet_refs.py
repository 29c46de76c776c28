"""Loop references and batches shared by the loss and miner tests (tests/losses/, tests/miners/)."""

from __future__ import annotations

import itertools

import torch

from bench.losses.quadruplet import QuadrupletLoss

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
