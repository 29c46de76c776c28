"""What every miner of dmlbench shares: input checks, a no-grad entry point, ``stats``.

A miner only *chooses* indices; the loss computes the differentiable values.
Running the choice under ``torch.no_grad()`` on detached embeddings keeps
mining out of the autograd graph (it would otherwise double the backward
cost for nothing). Inputs are checked once at the boundary so that a bad
shape is a `BenchError` naming the problem, not an indexing error deep in a
mask.
"""

from __future__ import annotations

from typing import Any

import torch

from bench import distances
from bench.errors import BenchError
from bench.losses.base import check_bool, check_choice, check_inputs, check_number
from bench.losses.triplet import anchor_positive_pairs, triplet_matrix
from bench.tuples import IndexTuple

__all__ = [
    "BenchMiner",
    "DenseTriplets",
    "LossMetric",
    "check_bool",
    "check_choice",
    "check_inputs",
    "check_int",
    "check_number",
    "select_triplets",
    "triplet_margins",
    "BenchError",
]


def check_int(name: str, value: Any, low: int = 1, allow_none: bool = False) -> Any:
    """An integer >= ``low`` (or None when allowed), else a BenchError naming the parameter."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BenchError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


class BenchMiner:
    """Base of dmlbench's miners: one checked, gradient-free entry point and a ``stats`` dict.

    Subclasses implement ``mine(embeddings, labels)`` on detached embeddings
    (labels already on the embeddings' device) and may fill ``self.stats``;
    ``num_tuples`` is filled in afterwards when they do not. ``stats`` is reset
    before each call so that a stale value is never logged.
    """

    dataset_level = False

    def __init__(self, distance: Any = None, normalize: bool = True) -> None:
        """``distance``: a name of `bench.distances.DISTANCES` (resolved with ``normalize``) or a
        `bench.distances.Distance`; None for a miner that measures nothing itself."""
        self.stats: dict[str, float] = {}
        if distance is not None:
            self.distance = distances.resolve(distance, normalize)

    @property
    def normalize(self) -> bool:
        return self.distance.normalize

    def __call__(self, embeddings: torch.Tensor, labels: torch.Tensor) -> IndexTuple:
        self.stats = {}
        check_inputs(embeddings, labels)
        labels = labels.to(embeddings.device)
        with torch.no_grad():
            out = self.mine(embeddings.detach(), labels)
        if "num_tuples" not in self.stats:  # not setdefault: its default would be computed every call
            self.stats["num_tuples"] = float(len(out[0]))  # type: ignore[index]
        return out

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> IndexTuple:
        """The tuples, from checked inputs without gradient; each subclass's one job."""
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "stats" and not k.startswith("_"))
        return f"{type(self).__name__}({params})"


def triplet_margins(
    embeddings: torch.Tensor, labels: torch.Tensor, distance: distances.Distance
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every positive pair against every candidate negative, without a B^3 mask.

    Returns ``(a, p, tm, negative, mat)``: the positive pairs in lexicographic
    order, ``tm[i, n] = D(a_i, n) - D(a_i, p_i)`` (PML's ``triplet_margin``),
    the (pairs, B) mask of valid negatives, and the distance matrix. Selecting
    ``torch.where(negative & condition)`` yields triplets in the same (a, p, n)
    order as PML's ``get_all_triplets_indices``.
    """
    mat = triplet_matrix(embeddings, distance)
    a, p = anchor_positive_pairs(labels)
    tm = mat.index_select(0, a) - mat[a, p][:, None]  # index_select: a plain row copy, unlike mat[a]
    negative = labels[a][:, None] != labels[None, :]
    return a, p, tm, negative, mat


class DenseTriplets(tuple):
    """``(a, p, n)`` that also remember the (pairs, B) mask they were read from.

    It is a plain 3-tuple of LongTensors for every consumer; a triplet loss
    that finds ``pairs`` and ``mask`` on it can compute the same sum densely,
    as a (pairs, B) matrix, instead of gathering and scattering one value per
    triplet (batch-all yields ~B^2 K triplets). Any new tuple built from it
    (slicing, moving to a device) is a plain tuple again, so a stale mask can
    never be used.
    """

    pairs: tuple[torch.Tensor, torch.Tensor]
    mask: torch.Tensor

    def __new__(
        cls,
        a: torch.Tensor,
        p: torch.Tensor,
        n: torch.Tensor,
        pairs: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> DenseTriplets:
        obj = super().__new__(cls, (a, p, n))
        obj.pairs, obj.mask = pairs, mask
        return obj


def select_triplets(a: torch.Tensor, p: torch.Tensor, keep: torch.Tensor) -> DenseTriplets:
    """Triplets ``(a[i], p[i], n)`` for each ``keep[i, n]``; (a, p, n) lexicographic order."""
    n = torch.where(keep)[1]
    counts = keep.sum(dim=1)  # repeating each pair beats gathering one index per triplet
    return DenseTriplets(a.repeat_interleave(counts), p.repeat_interleave(counts), n, (a, p), keep)


class LossMetric:
    """Mixin of the quadruplet miners: mine with the bound loss's own metric, else with ``self.distance``.

    After ``bind_loss(loss)`` with a loss that has ``distance_matrix`` (the
    quadruplet loss, learned metric included) the miner measures exactly what
    the loss will; unbound it uses its own distance object.
    """

    distance: distances.Distance
    _loss: Any = None

    def bind_loss(self, loss: Any) -> None:
        """Mine with the loss's own metric when it exposes one (``distance_matrix``)."""
        self._loss = loss if hasattr(loss, "distance_matrix") else None

    def distances(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(B, B) values ``G`` the quadruplet terms use."""
        if self._loss is not None:
            return self._loss.distance_matrix(embeddings)
        return self.distance.matrix(embeddings)
