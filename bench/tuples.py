"""The index-tuple contract between miners and losses.

A miner returns indices into the batch; a loss consumes them. Three shapes:

* ``(a, p, n)`` - triplets: ``a != p``, ``y[a] == y[p]``, ``y[a] != y[n]``;
* ``(a1, p, a2, n)`` - pairs: positive pairs ``(a1[i], p[i])`` and negative
  pairs ``(a2[j], n[j])``, the layout PML uses, so tuples from either
  library can be passed to the other;
* ``Quadruplets(i, j, l, k)`` - Chen et al.'s quadruplets: ``y_i == y_j``,
  ``y_l != y_k`` and both ``l`` and ``k`` of classes other than ``y_i``.
  A plain 4-tuple means pairs, so quadruplets carry their own type;
* ``ViolatingQuadruplets`` - every quadruplet of the batch whose loss is
  positive at given margins, not enumerated: what uncapped MargOHNM selects,
  handed only to a loss that sums them in closed form.

Losses convert what they receive into what they need with the helpers below
(a triplet loss given pairs uses every triplet the pairs can form, as PML
does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


class Quadruplets(NamedTuple):
    """Chen et al.'s quadruplets; optional margins replace the loss's own (MargOHNM's adaptive ones).

    ``alpha1`` / ``alpha2``: a number, a 0-d tensor or one value per tuple.
    Only the first four fields are indices (``len()`` is 6).
    """

    i: torch.Tensor
    j: torch.Tensor
    l: torch.Tensor  # noqa: E741 - the paper's name
    k: torch.Tensor
    alpha1: torch.Tensor | float | None = None
    alpha2: torch.Tensor | float | None = None


@dataclass(frozen=True)
class ViolatingQuadruplets:
    """Every quadruplet of a batch whose loss at ``alpha1`` / ``alpha2`` is positive, left unenumerated.

    Uncapped MargOHNM selects exactly these. Listing them takes O(B^4)
    indices (5.7 M for a 32 x 4 batch, several Conv-4 steps' time; see
    benchmarks/README.md), while the quadruplet loss sums them in closed form
    in O(B^2 K): a quadruplet that does not violate adds 0, so the sum over
    the violating ones is the sum over all, and their number is the count of
    positive ones. A miner returns this only to a loss that declares
    ``sums_violating = True`` (`bench.losses.quadruplet.QuadrupletLoss`);
    anything else gets the explicit `Quadruplets`. Not a tuple, so that
    nothing reads it as indices.
    """

    batch_size: int
    alpha1: float
    alpha2: float
    count: int  # how many quadruplets violate, as the miner measured them


IndexTuple = tuple[torch.Tensor, ...] | Quadruplets | ViolatingQuadruplets
"""What a miner returns and a loss consumes: triplets, pairs, `Quadruplets` (their own type), or
`ViolatingQuadruplets` for a loss that sums them."""


def same_class(labels: torch.Tensor) -> torch.Tensor:
    """(B, B) bool: same label, the diagonal excluded."""
    same = labels[:, None] == labels[None, :]
    same.fill_diagonal_(False)
    return same


def diff_class(labels: torch.Tensor) -> torch.Tensor:
    """(B, B) bool: different labels (the diagonal is never one)."""
    return labels[:, None] != labels[None, :]


def all_pairs(labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every positive pair (ordered, no self-pairs) and every negative pair."""
    a1, p = torch.where(same_class(labels))
    a2, n = torch.where(diff_class(labels))
    return a1, p, a2, n


def all_triplets(labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every valid triplet ``(a, p, n)``; O(B^3) indices, for small batches and references."""
    valid = same_class(labels)[:, :, None] & diff_class(labels)[:, None, :]
    return torch.where(valid)


def is_triplets(t: Any) -> bool:
    """Whether an index tuple is ``(a, p, n)``."""
    return t is not None and not isinstance(t, Quadruplets) and len(t) == 3


def is_pairs(t: Any) -> bool:
    """Whether an index tuple is ``(a1, p, a2, n)``: a plain 4-tuple, Quadruplets being their own type."""
    return t is not None and not isinstance(t, Quadruplets) and len(t) == 4


def pairs_to_triplets(pairs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Every triplet whose (a,p) is a given positive pair and (a,n) a given negative pair."""
    a1, p, a2, n = pairs
    match = a1[:, None] == a2[None, :]
    pi, ni = torch.where(match)
    return a1[pi], p[pi], n[ni]


def triplets_to_pairs(triplets: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The distinct positive and negative pairs that the triplets contain."""
    a, p, n = triplets
    pos = torch.unique(torch.stack([a, p], 1), dim=0) if len(a) else torch.stack([a, p], 1)
    neg = torch.unique(torch.stack([a, n], 1), dim=0) if len(a) else torch.stack([a, n], 1)
    return pos[:, 0], pos[:, 1], neg[:, 0], neg[:, 1]
