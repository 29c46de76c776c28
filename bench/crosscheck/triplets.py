"""Cross-check: own triplet loss x triplet miners against PML, in float64.

Each own combination is paired with the PML settings that make it equal
(below, in `COMBOS`). Every random case draws a batch size (2..256), a
dimension (2..128), a label layout (random, PK, one class, all singletons,
duplicate embeddings), a distance, a reduction, a margin and the soft form;
both libraries then compute the loss and its gradient with respect to the
embeddings, and both miners' triplet *sets* must be equal (a mismatch makes
the value difference infinite, so the check fails).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from bench.crosscheck.base import CheckResult, rel_diff
from bench.registry import build_loss, build_miner

_LOSS = (
    "TripletMarginLoss(margin, smooth_loss=soft, distance=LpDistance(normalize_embeddings=normalize, "
    "power=1 euclidean | 2 squared_euclidean) or CosineSimilarity(), "
    "reducer=AvgNonZeroReducer | MeanReducer | SumReducer)"
)


@dataclass(frozen=True)
class Combo:
    """A triplet miner paired with its PML counterpart (``pml_build`` None: no miner, every triplet)."""

    name: str
    own_miner: str | None
    own_params: Callable[[float], dict[str, Any]]
    pml_miner: str
    pml_build: Callable[[Any, float, Any], Any] | None  # (miners module, margin, distance) -> PML miner


def _tmm(kind: str, margin_inf: bool = False):
    def build(miners, margin, distance):
        return miners.TripletMarginMiner(
            margin=float("inf") if margin_inf else margin, type_of_triplets=kind, distance=distance
        )

    return build


COMBOS = (
    Combo("triplet", None, lambda m: {}, "no miner (all triplets)", None),
    Combo(
        "triplet + batch_all",
        "batch_all",
        lambda m: {"margin": m},
        "TripletMarginMiner(margin=inf, type_of_triplets='all')",
        _tmm("all", margin_inf=True),
    ),
    Combo(
        "triplet + batch_hard",
        "batch_hard",
        lambda m: {},
        "BatchHardMiner()",
        lambda miners, margin, distance: miners.BatchHardMiner(distance=distance),
    ),
    Combo(
        "triplet + semihard",
        "semihard",
        lambda m: {"margin": m, "semantics": "all"},
        "TripletMarginMiner(margin, type_of_triplets='semihard')",
        _tmm("semihard"),
    ),
    Combo(
        "triplet + hard",
        "hard",
        lambda m: {},  # PML's margin (> 0 here) selects nothing more
        "TripletMarginMiner(margin, type_of_triplets='hard')",
        _tmm("hard"),
    ),
)

LAYOUTS = ("random", "pk", "one_class", "singletons", "duplicates", "pk")
DISTANCES = ("euclidean", "squared_euclidean", "cosine")
REDUCTIONS = ("avg_nonzero", "mean", "sum")


@dataclass
class Case:
    """One random triplet-loss setting: batch, distance, normalisation, reduction, soft or hinge, margin."""

    embeddings: torch.Tensor
    labels: torch.Tensor
    layout: str
    distance: str
    normalize: bool
    reduction: str
    soft: bool
    margin: float

    def describe(self) -> str:
        """The case's settings in one line, for a failure message."""
        return (
            f"B={len(self.labels)} dim={self.embeddings.shape[1]} {self.layout} {self.distance} "
            f"normalize={self.normalize} {self.reduction} soft={self.soft} margin={self.margin:.3g}"
        )


def make_case(index: int, rng: random.Random) -> Case:
    """One random case; the layouts cycle so that every degenerate kind occurs in a short run."""
    layout = LAYOUTS[index % len(LAYOUTS)]
    size = rng.choice([2, 3, 5, rng.randint(2, 64), rng.randint(2, 256)])
    dim = rng.randint(2, 128)
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    x = torch.randn(size, dim, generator=g, dtype=torch.float64)
    if layout == "random":
        y = torch.randint(0, rng.randint(1, size), (size,), generator=g)
    elif layout == "pk":
        k = rng.randint(2, 8)
        y = torch.arange(size) // k
    elif layout == "one_class":
        y = torch.zeros(size, dtype=torch.long)
    elif layout == "singletons":
        y = torch.arange(size)
    else:  # duplicates: some rows repeated exactly, labels from few classes
        y = torch.randint(0, max(1, size // 4), (size,), generator=g)
        src = torch.randint(0, size, (size // 2,), generator=g)
        dst = torch.randint(0, size, (size // 2,), generator=g)
        x[dst] = x[src]
    distance = rng.choice(DISTANCES)
    return Case(
        x,
        y,
        layout,
        distance,
        rng.random() < 0.7,
        rng.choice(REDUCTIONS),
        rng.random() < 0.25,
        rng.choice([0.05, 0.2, rng.uniform(0.01, 1.0)]),
    )


def _pml_parts(case: Case) -> tuple[Any, Any]:
    from pytorch_metric_learning import distances, reducers

    if case.distance == "cosine":
        dist = distances.CosineSimilarity()
    else:
        dist = distances.LpDistance(
            normalize_embeddings=case.normalize, p=2, power=2 if case.distance == "squared_euclidean" else 1
        )
    reducer = {"avg_nonzero": reducers.AvgNonZeroReducer, "mean": reducers.MeanReducer, "sum": reducers.SumReducer}[
        case.reduction
    ]()
    return dist, reducer


def _key(triplets: tuple[torch.Tensor, ...], size: int) -> torch.Tensor:
    a, p, n = (t.long() for t in triplets)
    return ((a * size + p) * size + n).sort().values


def _value_and_grad(loss_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor):
    x = x.clone().requires_grad_(True)
    value = loss_fn(x)
    value.backward()
    return value.detach(), x.grad


def run_case(combo: Combo, case: Case) -> tuple[float, float, bool]:
    """(value rel_diff, gradient rel_diff, triplet sets equal) for one combination and case."""
    from pytorch_metric_learning import losses, miners

    own_loss = build_loss(
        "triplet",
        margin=case.margin,
        distance=case.distance,
        normalize=case.normalize,
        soft=case.soft,
        reduction=case.reduction,
    )
    dist, reducer = _pml_parts(case)
    pml_loss = losses.TripletMarginLoss(margin=case.margin, smooth_loss=case.soft, distance=dist, reducer=reducer)
    x, y = case.embeddings, case.labels
    same_sets = True
    if combo.own_miner is None:
        own_t = pml_t = None
    else:
        assert combo.pml_build is not None, f"{combo.name}: an own miner needs its PML counterpart"
        own_t = build_miner(
            combo.own_miner, distance=case.distance, normalize=case.normalize, **combo.own_params(case.margin)
        )(x, y)
        pml_t = combo.pml_build(miners, case.margin, dist)(x, y)
        same_sets = torch.equal(_key(own_t, len(y)), _key(pml_t, len(y)))
    own_v, own_g = _value_and_grad(lambda e: own_loss(e, y, own_t), x)
    pml_v, pml_g = _value_and_grad(lambda e: pml_loss(e, y, pml_t), x)
    return rel_diff(own_v, pml_v), rel_diff(own_g, pml_g), same_sets


def checks(cases: int = 50, seed: int = 0) -> Iterable[CheckResult]:
    """One CheckResult per combination, each over the same ``cases`` random cases."""
    rng = random.Random(seed)
    drawn = [make_case(i, rng) for i in range(cases)]
    for combo in COMBOS:
        worst_v = worst_g = 0.0
        mismatched: list[str] = []
        for case in drawn:
            dv, dg, same = run_case(combo, case)
            worst_v, worst_g = max(worst_v, dv), max(worst_g, dg)
            if not same:
                mismatched.append(case.describe())
        note = f"triplet sets differ in {len(mismatched)} case(s), e.g. {mismatched[0]}" if mismatched else ""
        settings = _LOSS if combo.pml_build is None else f"{_LOSS} + {combo.pml_miner} (same distance)"
        yield CheckResult(combo.name, settings, len(drawn), float("inf") if mismatched else worst_v, worst_g, note)
