"""Distances between embeddings: the one home of what "euclidean", "cosine"... mean.

Losses and miners receive a distance *object* (as PML's losses receive
``LpDistance`` or ``CosineSimilarity``), resolved once from the protocol's
name by `resolve`. One meaning per name:

* ``euclidean`` - ``D = ||a - b||``;
* ``squared_euclidean`` - ``D = ||a - b||^2`` (FaceNet's and Chen et al.'s form);
* ``cosine`` - ``D = 1 - cos(a, b)``, so that every margin formula reads the
  same way for all kinds: ``D(a,p) - D(a,n) + m`` equals PML's
  ``s(a,n) - s(a,p) + m`` over ``CosineSimilarity``;
* ``dot`` - a similarity only (Sohn's N-pair ``f^T f^+``); its "distance" is
  ``-f^T f^+``, which no margin formula should use.

Each object also gives a *similarity* ``S``, related to ``D`` by a constant:
``S = -D`` for the Lp kinds, ``S = cos = 1 - D`` for cosine. A loss that
needs a similarity (InfoNCE, N-pair) takes it from here. A formula in which
only differences ``D(a,p) - D(a,n)`` enter (triplet losses and miners) uses
``shifted``: ``D`` itself for the Lp kinds, ``-S = -cos`` for cosine, which
is exactly PML's similarity margin, without rounding ``1 - cos``, so own
and PML miners choose the very same triplets at ties and thresholds.

``normalize`` (the protocol's ``model.normalize``) belongs to the object:
embeddings are L2-normalised before any Lp distance, as PML's
``normalize_embeddings``; cosine always normalises. Euclidean distances go
through ``torch.cdist``, the kernel PML uses, so rounding in degenerate
batches (duplicate embeddings) matches theirs and the backward pass gives a
zero gradient at zero distance instead of NaN.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bench.errors import BenchError

DISTANCES = ("euclidean", "squared_euclidean", "cosine")
SIMILARITIES = ("dot",) + DISTANCES  # what a similarity-only loss (N-pair) may also take


class Distance:
    """A pairwise distance on (optionally L2-normalised) embeddings; see the module docstring."""

    name = ""

    def __init__(self, normalize: bool = True) -> None:
        if not isinstance(normalize, bool):
            raise BenchError(f"normalize must be true or false, got {normalize!r}")
        self.normalize = normalize

    def __repr__(self) -> str:
        return f"{type(self).__name__}(normalize={self.normalize})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.normalize == self.normalize

    def __hash__(self) -> int:
        return hash((type(self), self.normalize))

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The embeddings the distance is taken on (normalised when asked)."""
        return F.normalize(x, p=2, dim=-1) if self.normalize else x

    def matrix(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """``D[i, j] = d(x_i, y_j)``, shape (len(x), len(y)); ``y`` defaults to ``x``."""
        x = self.prepare(x)
        return self._matrix(x, x if y is None else self.prepare(y))

    def paired(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Row-wise ``d(x_i, y_i)``, for tuples gathered from a batch."""
        return self._paired(self.prepare(x), self.prepare(y))

    def similarity(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """``S[i, j]``: ``-D`` up to a constant (see the module docstring), larger = closer."""
        return -self.matrix(x, y)

    def shifted(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """``D`` up to an additive constant, computed as exactly as possible (see the module docstring)."""
        return self.matrix(x, y)

    def _matrix(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _paired(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Euclidean(Distance):
    """``||a - b||``."""

    name = "euclidean"

    def _matrix(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cdist(x, y)

    def _paired(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x - y, dim=-1)


class SquaredEuclidean(Euclidean):
    """``||a - b||^2``, the square of `Euclidean` (same kernel, so same rounding)."""

    name = "squared_euclidean"

    def _matrix(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super()._matrix(x, y) ** 2

    def _paired(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super()._paired(x, y) ** 2


class Cosine(Distance):
    """``1 - cos(a, b)``; the similarity is ``cos`` itself. Always on normalised rows."""

    name = "cosine"

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised rows whatever ``normalize`` says: a cosine of raw rows is still a cosine."""
        return F.normalize(x, p=2, dim=-1)

    def similarity(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """``cos`` itself, not ``-(1 - cos)``: the exact value PML's ``CosineSimilarity`` gives."""
        x = self.prepare(x)
        return x @ (x if y is None else self.prepare(y)).T

    def shifted(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """``-cos``: ``D`` less its constant 1, without the rounding of ``1 - cos`` near 1."""
        return -self.similarity(x, y)

    def _matrix(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 1.0 - x @ y.T

    def _paired(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 1.0 - (x * y).sum(-1)


class Dot(Distance):
    """The dot product as a similarity (the cosine when ``normalize``); its distance is ``-x.y``."""

    name = "dot"

    def similarity(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """``x . y`` itself (not ``-D`` through a negation), as PML's ``DotProductSimilarity``."""
        x = self.prepare(x)
        return x @ (x if y is None else self.prepare(y)).T

    def _matrix(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -(x @ y.T)

    def _paired(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -(x * y).sum(-1)


_KINDS: dict[str, type[Distance]] = {k.name: k for k in (Euclidean, SquaredEuclidean, Cosine, Dot)}


def resolve(distance: Any, normalize: bool = True, allowed: tuple[str, ...] = DISTANCES) -> Distance:
    """A distance object from a name of ``allowed`` (with ``normalize``), or the object itself.

    A given object keeps its own ``normalize``. Anything else is a BenchError
    naming the expected names.
    """
    if isinstance(distance, Distance) and distance.name in allowed:
        return distance
    if isinstance(distance, str) and distance in allowed:
        return _KINDS[distance](normalize)

    raise BenchError(f"unknown distance {distance!r}: expected one of {', '.join(allowed)}")


def pairwise(x: torch.Tensor, y: torch.Tensor | None = None, kind: str = "euclidean") -> torch.Tensor:
    """Distance matrix of the named kind on the embeddings as given (no normalisation)."""
    return resolve(kind, normalize=False).matrix(x, y)
