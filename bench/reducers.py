"""Reductions of per-tuple losses to one number, as objects a loss is composed with.

The three follow PML's reducers, so that a loss and its PML counterpart can
be compared number for number:

* `MeanReduction` (``mean``) - PML's ``MeanReducer``: the mean over all tuples;
* `AvgNonZeroReduction` (``avg_nonzero``) - PML's ``AvgNonZeroReducer``: the
  mean over the tuples whose loss is strictly positive (Hermans et al.'s
  batch-all average);
* `SumReduction` (``sum``) - the plain sum.

With no tuple at all (or, for ``avg_nonzero``, no positive one) every
reduction gives a zero that stays connected to the embeddings, as PML's
``zero_loss`` does, so ``backward()`` always works and gives zero gradients.

Dense losses (triplets as a (pairs, B) matrix, all quadruplets through
cumulative sums) never hold the per-tuple vector; they hand `divide` the
masked sum, the number of tuples and the number of positive ones.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.errors import BenchError


def zero_loss(embeddings: torch.Tensor) -> torch.Tensor:
    """A 0-d zero that keeps the graph, so backward() yields zero gradients rather than failing."""
    return (embeddings * 0).sum()


class Reduction:
    """Per-tuple losses to a 0-d tensor; see the module docstring."""

    name = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def kept(self, losses: torch.Tensor) -> torch.Tensor:
        """The per-tuple losses that enter the reduction."""
        return losses

    def divisor(self, count: int, num_positive: int) -> int:
        """What a dense loss divides its masked sum by, given ``count`` tuples of which ``num_positive`` have
        a positive loss; 0 means the result is the connected zero."""
        raise NotImplementedError

    def __call__(self, losses: torch.Tensor, embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """``losses`` reduced; ``embeddings`` ties the zero of an empty input to the graph when
        ``losses`` may be cut off from it (e.g. built with ``new_zeros``)."""
        losses = self.kept(losses)
        if losses.numel() == 0:
            return zero_loss(embeddings) if embeddings is not None else losses.sum()
        return self.combine(losses)

    def combine(self, losses: torch.Tensor) -> torch.Tensor:
        """The kept losses (at least one) to a 0-d tensor."""
        return losses.mean()

    def divide(self, total: torch.Tensor, count: int, num_positive: int, embeddings: torch.Tensor) -> torch.Tensor:
        """The reduction of tuples whose losses sum to ``total`` (``count`` tuples, ``num_positive`` > 0)."""
        divisor = self.divisor(count, num_positive)
        return total / divisor if divisor else zero_loss(embeddings)


class MeanReduction(Reduction):
    """PML's ``MeanReducer``: tuples that already satisfy their margin still count, pulling the mean down."""

    name = "mean"

    def divisor(self, count: int, num_positive: int) -> int:
        """Every tuple."""
        return count


class AvgNonZeroReduction(Reduction):
    """PML's ``AvgNonZeroReducer``: the mean over active tuples only, so the gradient does not fade as
    training satisfies more of them (Hermans et al.'s batch-all average)."""

    name = "avg_nonzero"

    def kept(self, losses: torch.Tensor) -> torch.Tensor:
        """Only the strictly positive losses."""
        return losses[losses > 0]

    def divisor(self, count: int, num_positive: int) -> int:
        """The positive tuples only."""
        return num_positive


class SumReduction(Reduction):
    """The plain sum: the loss scales with the number of tuples (and so with the batch size)."""

    name = "sum"

    def combine(self, losses: torch.Tensor) -> torch.Tensor:
        """The sum of the losses."""
        return losses.sum()

    def divisor(self, count: int, num_positive: int) -> int:
        """Nothing to divide by."""
        return 1


_KINDS: dict[str, type[Reduction]] = {k.name: k for k in (MeanReduction, AvgNonZeroReduction, SumReduction)}
REDUCTIONS = tuple(_KINDS)


def resolve(reduction: Any) -> Reduction:
    """A reduction object from its name, or the object itself; else a BenchError naming the choices."""
    if isinstance(reduction, Reduction):
        return reduction
    if isinstance(reduction, str) and reduction in _KINDS:
        return _KINDS[reduction]()

    raise BenchError(f"unknown reduction {reduction!r}: expected one of {', '.join(REDUCTIONS)}")
