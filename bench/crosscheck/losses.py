"""Cross-check of the own pair losses against PML: values and gradients in float64.

Every check runs the same stream of random cases (seeded): batch sizes 1 to
256, dimensions 2 to 128, and the label layouts that break pair losses in
practice - random labels, P x K batches, one class, all singletons, a batch
without any valid tuple, duplicate embeddings, a large batch of mostly
singletons - each with no index tuple, with pairs mined by PML's
MultiSimilarityMiner, with triplets mined by PML's TripletMarginMiner, with
random pairs (repeats included) or with an empty tuple. Reductions and
``normalize`` cycle through their values from case to case, so that each
check covers all of them.

Triplets are handed to the own loss as they are; PML receives
``bench.tuples.triplets_to_pairs(t)``, the conversion the own losses make
(PML alone would keep one pair per triplet, repeats included). PML's
pair losses return zero when every index tensor has at most one entry (a
quirk, not a formula); such cases are not compared, and the note counts them.

Duplicate embeddings are drawn in batches of at most 25 rows: above that,
``torch.cdist`` (used by both sides) switches to its matrix-product kernel,
where a zero distance comes out as ~1e-8 and the gradient of such a pair is
rounding noise in both libraries (they then differ by ~1e-8, relative).
InfoNCE temperatures are raised where needed so that no logit gap exceeds
600: PML computes ``log(p + tiny)``, which saturates near a loss of 708.
With ``avg_nonzero`` they are raised further, to a logit range of at most 25,
so that no per-pair loss falls below 1e-11: PML's ``log(num / den)`` rounds
a loss below ~1e-16 to zero, which changes its divisor, while the own loss
(a softplus) keeps it. For the same reason PML's InfoNCE is only accurate
to ~1e-16 in absolute terms, so cases whose mean loss per positive pair is
below 1e-6 (all pairs far easier than their negatives) are not compared;
the note counts them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from bench.crosscheck.base import CheckResult, rel_diff
from bench.distances import pairwise
from bench.losses.base import BenchLoss
from bench.losses.contrastive import ContrastiveLoss
from bench.losses.infonce import InfoNCELoss
from bench.losses.lifted import LiftedStructureLoss
from bench.losses.npair import NPairLoss
from bench.tuples import all_pairs, triplets_to_pairs

REDUCTIONS = ("mean", "avg_nonzero", "sum")
LAYOUTS = ("random", "pk", "one_class", "singletons", "no_tuple", "duplicates", "large")
TUPLE_MODES = (None, "ms_miner", "triplet_miner", "random_pairs")


@dataclass(frozen=True)
class Case:
    """One random batch and the tuples each library receives for it."""

    embeddings: torch.Tensor  # float64, (B, D)
    labels: torch.Tensor
    indices_tuple: Any  # what the own loss receives
    pml_tuple: Any  # what PML receives
    reduction: str
    normalize: bool
    param_seed: int  # seeds the check's own random hyperparameters, the same for both sides


@dataclass(frozen=True)
class Spec:
    """One loss check: how to build the own loss and PML's for a case, and which cases apply."""

    name: str
    settings: str  # the PML call that makes both equal, in words
    own: Callable[[Case], BenchLoss]
    pml: Callable[[Case], torch.nn.Module]
    layouts: tuple[str, ...] = LAYOUTS
    tuple_modes: tuple[Any, ...] = TUPLE_MODES
    pml_skips_tiny_tuples: bool = True  # PML's GenericPairLoss returns 0 when all index tensors have <= 1 entry
    min_loss: float = 0.0  # below this mean loss per tuple PML's own rounding exceeds the tolerance


# ---- random cases -------------------------------------------------------------


def _log_int(rng: random.Random, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def _labels(rng: random.Random, layout: str, gen: torch.Generator) -> torch.Tensor:
    if layout == "random":
        b = _log_int(rng, 2, 64)
        return torch.randint(0, rng.randint(1, b), (b,), generator=gen)
    if layout == "pk":
        p, k = rng.randint(2, 16), rng.randint(2, 8)
        return torch.arange(p).repeat_interleave(k)[torch.randperm(p * k, generator=gen)]
    if layout == "duplicates":  # at most 25 rows: see the module docstring
        p, k = rng.randint(2, 8), rng.randint(2, 3)
        return torch.arange(p).repeat_interleave(k)[torch.randperm(p * k, generator=gen)]
    if layout == "pk2":
        p = _log_int(rng, 1, 128)
        return torch.arange(p).repeat_interleave(2)[torch.randperm(2 * p, generator=gen)]
    if layout == "one_class":
        return torch.full((_log_int(rng, 2, 32),), rng.randint(0, 9))
    if layout == "singletons":
        return torch.randperm(_log_int(rng, 2, 64), generator=gen)
    if layout == "no_tuple":
        return torch.tensor([rng.randint(0, 9)])
    if layout == "large":  # B = 256: 16 classes of two, the rest singletons (PML's pos x neg matrix stays small)
        return torch.cat([torch.arange(16).repeat_interleave(2), torch.arange(16, 240)])[
            torch.randperm(256, generator=gen)
        ]
    raise AssertionError(layout)


def _embeddings(rng: random.Random, labels: torch.Tensor, layout: str, gen: torch.Generator) -> torch.Tensor:
    b = len(labels)
    dim = 128 if layout == "large" else _log_int(rng, 2, 128)
    x = torch.randn(b, dim, generator=gen, dtype=torch.float64) * rng.choice([0.1, 1.0, 3.0])
    if layout == "duplicates":  # copy rows onto others, within and across classes
        for _ in range(max(1, b // 3)):
            i, j = rng.randrange(b), rng.randrange(b)
            x[j] = x[i]
    return x


def _tuple(mode: Any, x: torch.Tensor, labels: torch.Tensor, rng: random.Random, gen: torch.Generator):
    from pytorch_metric_learning import miners

    if mode is None:
        return None, None
    if mode == "ms_miner":
        t = miners.MultiSimilarityMiner(epsilon=rng.uniform(0.05, 0.5))(x, labels)
        return t, t
    if mode == "triplet_miner":
        kind = rng.choice(["all", "hard", "semihard", "easy"])
        t = miners.TripletMarginMiner(margin=rng.uniform(0.05, 0.5), type_of_triplets=kind)(x, labels)
        return t, triplets_to_pairs(t)
    if mode == "random_pairs":
        a1, p, a2, n = all_pairs(labels)
        pos = torch.randint(0, max(len(a1), 1), (rng.randint(0, 2 * len(a1)),), generator=gen)
        neg = torch.randint(0, max(len(a2), 1), (rng.randint(0, 2 * len(a2)),), generator=gen)
        t = (a1[pos], p[pos], a2[neg], n[neg]) if len(a1) and len(a2) else (a1, p, a2, n)
        return t, t
    raise AssertionError(mode)


def make_case(seed: int, index: int, layouts: tuple[str, ...], tuple_modes: tuple[Any, ...]) -> Case:
    """Case ``index`` of the stream ``seed``: the same for every check that shares the layouts."""
    rng = random.Random(seed * 1_000_003 + index)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    layout = layouts[index % len(layouts)]
    labels = _labels(rng, layout, gen)
    x = _embeddings(rng, labels, layout, gen)
    mode = tuple_modes[(index // len(layouts)) % len(tuple_modes)]
    if layout == "no_tuple" and index % 2:  # the other way to have nothing: an empty tuple
        labels = torch.randint(0, 3, (rng.randint(2, 16),), generator=gen)
        x = torch.randn(len(labels), rng.randint(2, 16), generator=gen, dtype=torch.float64)
        e = torch.empty(0, dtype=torch.long)
        own = pml = (e, e, e, e)
    else:
        own, pml = _tuple(mode, x, labels, rng, gen)
    return Case(x, labels, own, pml, REDUCTIONS[index % 3], bool((index // 3) % 2 == 0), rng.randrange(2**31))


# ---- comparing ----------------------------------------------------------------


def _value_and_grad(loss: torch.nn.Module, case: Case, indices_tuple: Any) -> tuple[torch.Tensor, torch.Tensor]:
    x = case.embeddings.clone().requires_grad_(True)
    value = loss(x, case.labels, indices_tuple)
    value.backward()
    grad = x.grad if x.grad is not None else torch.zeros_like(x)
    return value.detach(), grad


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return 0.0 if torch.equal(a, b) else math.inf
    return rel_diff(a, b)


def _pml_quirk(t: Any) -> bool:
    """PML's pair losses return 0 for a tuple whose index tensors all have at most one entry."""
    return t is not None and all(len(i) <= 1 for i in t) and any(len(i) for i in t)


def run(spec: Spec, cases: int, seed: int) -> CheckResult:
    """Compare one own loss with its PML counterpart over ``cases`` random cases."""
    worst_value = worst_grad = 0.0
    compared = skipped = imprecise = 0
    sizes: list[int] = []
    for i in range(cases):
        case = make_case(seed, i, spec.layouts, spec.tuple_modes)
        if spec.pml_skips_tiny_tuples and _pml_quirk(case.pml_tuple):
            skipped += 1
            continue
        own = spec.own(case)
        own_v, own_g = _value_and_grad(own, case, case.indices_tuple)
        per_tuple = (
            float(own_v) / max(own.stats.get("num_tuples", 1.0), 1.0) if case.reduction == "sum" else float(own_v)
        )
        if 0.0 < per_tuple < spec.min_loss:
            imprecise += 1
            continue
        pml_v, pml_g = _value_and_grad(spec.pml(case), case, case.pml_tuple)
        worst_value = max(worst_value, _rel(own_v, pml_v))
        worst_grad = max(worst_grad, _rel(own_g, pml_g))
        compared += 1
        sizes.append(len(case.labels))
    note = f"B {min(sizes, default=0)}..{max(sizes, default=0)}"
    if skipped:
        note += f"; {skipped} case(s) not compared: every index tensor has <= 1 entry and PML returns 0"
    if imprecise:
        note += f"; {imprecise} case(s) not compared: loss per tuple below {spec.min_loss:g}, under PML's rounding"
    return CheckResult(spec.name, spec.settings, compared, worst_value, worst_grad, note)


# ---- the checks ---------------------------------------------------------------


def _reducer(name: str):
    from pytorch_metric_learning import reducers

    return {"mean": reducers.MeanReducer, "avg_nonzero": reducers.AvgNonZeroReducer, "sum": reducers.SumReducer}[name]()


def _pml_distance(kind: str, normalize: bool):
    from pytorch_metric_learning import distances

    if kind == "cosine":
        return distances.CosineSimilarity()
    if kind == "dot":
        return distances.DotProductSimilarity(normalize_embeddings=normalize)
    return distances.LpDistance(normalize_embeddings=normalize, power=2 if kind == "squared_euclidean" else 1)


def _margin(kind: str, m: float) -> float:
    """Our margins act on the distance 1 - cos; PML's CosineSimilarity margins act on cos."""
    return 1.0 - m if kind == "cosine" else m


_R = "reducer={Mean,AvgNonZero,Sum}Reducer() for reduction={mean,avg_nonzero,sum}"
_DIST = {
    "euclidean": "LpDistance(normalize_embeddings=normalize)",
    "squared_euclidean": "LpDistance(power=2, normalize_embeddings=normalize)",
    "cosine": "CosineSimilarity()",
    "dot": "DotProductSimilarity(normalize_embeddings=normalize)",
}


def _two_margins(
    name: str,
    kind: str,
    own: Callable[..., BenchLoss],
    pml: Callable[..., torch.nn.Module],
    margins: Callable[[random.Random], tuple[float, float]],
    settings: tuple[str, str],
) -> Spec:
    """A loss with two margins on a distance: ours as drawn, PML's through `_margin` (``settings``: the
    PML margin arguments in words, for cosine and for the Lp kinds)."""

    def drawn(c: Case) -> tuple[float, float]:
        return margins(random.Random(c.param_seed))

    return Spec(
        f"{name} ({kind})",
        f"{pml.__name__}({settings[kind != 'cosine']}, distance={_DIST[kind]}, {_R})",
        lambda c: own(*drawn(c), distance=kind, normalize=c.normalize, reduction=c.reduction),
        lambda c: pml(
            *(_margin(kind, v) for v in drawn(c)),
            distance=_pml_distance(kind, c.normalize),
            reducer=_reducer(c.reduction),
        ),
    )


def _contrastive(kind: str) -> Spec:
    from pytorch_metric_learning import losses

    return _two_margins(
        "contrastive",
        kind,
        ContrastiveLoss,
        losses.ContrastiveLoss,
        lambda r: (r.uniform(0.0, 0.5), r.uniform(0.3, 2.0)),
        ("pos_margin=1-pos_margin, neg_margin=1-neg_margin", "pos_margin, neg_margin"),
    )


def _lifted(kind: str) -> Spec:
    from pytorch_metric_learning import losses

    return _two_margins(
        "lifted_structure",
        kind,
        LiftedStructureLoss,
        losses.LiftedStructureLoss,
        lambda r: (r.uniform(0.1, 2.0), r.choice([0.0, r.uniform(0.0, 0.5)])),
        ("neg_margin=1-margin, pos_margin=1-pos_margin", "neg_margin=margin, pos_margin"),
    )


def _npair(kind: str) -> Spec:
    from pytorch_metric_learning import losses

    return Spec(
        f"npair ({kind})",
        f"NPairsLoss(distance={_DIST[kind]}, {_R})",
        lambda c: NPairLoss(distance=kind, normalize=c.normalize, reduction=c.reduction),
        lambda c: losses.NPairsLoss(distance=_pml_distance(kind, c.normalize), reducer=_reducer(c.reduction)),
        pml_skips_tiny_tuples=False,
    )


def _npair_l2() -> Spec:
    from pytorch_metric_learning import losses, regularizers

    def reg(c: Case) -> float:
        return random.Random(c.param_seed).uniform(1e-4, 1e-1)

    return Spec(
        "npair + l2_reg (P x 2 batches)",
        "NPairsLoss(embedding_regularizer=LpRegularizer(power=2), embedding_reg_weight=2*l2_reg, "
        f"distance={_DIST['dot']}, {_R}); equal when the batch is exactly the N pairs",
        lambda c: NPairLoss(l2_reg=reg(c), normalize=c.normalize, reduction=c.reduction),
        lambda c: losses.NPairsLoss(
            embedding_regularizer=regularizers.LpRegularizer(power=2),
            embedding_reg_weight=2 * reg(c),
            distance=_pml_distance("dot", c.normalize),
            reducer=_reducer(c.reduction),
        ),
        layouts=("pk2",),
        tuple_modes=(None,),
        pml_skips_tiny_tuples=False,
    )


def _infonce(kind: str) -> Spec:
    from pytorch_metric_learning import losses

    def temperature(c: Case) -> float:
        tau = math.exp(random.Random(c.param_seed).uniform(math.log(0.01), math.log(0.5)))
        x = torch.nn.functional.normalize(c.embeddings, dim=1) if c.normalize else c.embeddings
        dist = pairwise(x, kind=kind)
        floor = float(dist.max() - dist.min()) / 25 if c.reduction == "avg_nonzero" else float(dist.max()) / 600
        return max(tau, floor)

    return Spec(
        f"infonce ({kind})",
        f"NTXentLoss(temperature, distance={_DIST[kind]}, {_R}); temperature >= max D / 600 "
        "(avg_nonzero: >= (max D - min D) / 25)",
        lambda c: InfoNCELoss(temperature(c), distance=kind, normalize=c.normalize, reduction=c.reduction),
        lambda c: losses.NTXentLoss(
            temperature(c), distance=_pml_distance(kind, c.normalize), reducer=_reducer(c.reduction)
        ),
        min_loss=1e-6,
    )


def specs() -> list[Spec]:
    """Every loss check: each own loss under each distance it shares with PML."""
    kinds = ("euclidean", "squared_euclidean", "cosine")
    return (
        [_contrastive(k) for k in kinds]
        + [_lifted(k) for k in kinds]
        + [_npair(k) for k in ("dot",) + kinds]
        + [_npair_l2()]
        + [_infonce(k) for k in kinds]
    )


def checks(cases: int = 50, seed: int = 0) -> Iterable[CheckResult]:
    """One result per own loss x distance, each over ``cases`` random cases (see the module docstring)."""
    for spec in specs():
        yield run(spec, cases, seed)
