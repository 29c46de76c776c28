"""What every loss of dmlbench shares: input checks and the composition with a distance and a reduction.

Parameters are checked once, when a loss is built, and the inputs once per
call, so that a wrong name or a wrong shape is a `BenchError` naming the
problem instead of a broadcasting error deep inside a formula.

Composition as in PML: a loss holds a distance object (`bench.distances`,
``self.distance``, which carries ``normalize``) and a reduction object
(`bench.reducers`, ``self.reducer``), both resolved once from the names a
protocol gives; the loss module itself is only the formula.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bench import distances, reducers
from bench.errors import BenchError
from bench.reducers import zero_loss
from bench.tuples import Quadruplets, all_pairs, diff_class, is_triplets, same_class, triplets_to_pairs

__all__ = ["BenchLoss", "check_bool", "check_choice", "check_number", "zero_loss"]


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``, else a BenchError naming the parameter."""
    if value not in choices:
        raise BenchError(f"unknown {name} {value!r}: expected one of {', '.join(map(str, choices))}")
    return value


def check_number(
    name: str, value: Any, *, low: float | None = None, high: float | None = None, strict: bool = False
) -> float:
    """A finite real number within [low, high] (or (low, high) with ``strict``), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BenchError(f"{name} must be a finite number, got {value!r}")
    if low is not None and (value <= low if strict else value < low):
        raise BenchError(f"{name} must be {'>' if strict else '>='} {low}, got {value!r}")
    if high is not None and (value >= high if strict else value > high):
        raise BenchError(f"{name} must be {'<' if strict else '<='} {high}, got {value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool, else a BenchError naming the parameter."""
    if not isinstance(value, bool):
        raise BenchError(f"{name} must be true or false, got {value!r}")
    return value


def _is_index_vector(t: Any) -> bool:
    return torch.is_tensor(t) and t.ndim == 1 and not t.is_floating_point() and not t.is_complex()


def check_indices_tuple(indices_tuple: Any, batch_size: int) -> None:
    """Refuse anything but the three tuple shapes of bench.tuples, with indices inside the batch."""
    if indices_tuple is None:
        return
    quadruplets = isinstance(indices_tuple, Quadruplets)
    if quadruplets:
        indices_tuple = tuple(indices_tuple[:4])  # its optional margins are the quadruplet loss's concern
    if not isinstance(indices_tuple, (tuple, list)) or len(indices_tuple) not in (3, 4):
        raise BenchError(
            "indices_tuple must be triplets (a, p, n), pairs (a1, p, a2, n) or Quadruplets(i, j, l, k), "
            f"got {type(indices_tuple).__name__}"
            + (f" of length {len(indices_tuple)}" if isinstance(indices_tuple, (tuple, list)) else "")
        )
    if not all(_is_index_vector(t) for t in indices_tuple):
        raise BenchError("indices_tuple must hold 1-D integer tensors")
    lengths = [len(t) for t in indices_tuple]
    if len(lengths) == 4 and not quadruplets:
        groups = [lengths[:2], lengths[2:]]  # pairs: (a1, p) and (a2, n) may differ in length
    else:
        groups = [lengths]
    if any(len(set(g)) != 1 for g in groups):
        raise BenchError(f"indices_tuple has tensors of mismatched lengths {lengths}")
    for t in indices_tuple:
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= batch_size):
            raise BenchError(f"indices_tuple holds an index outside the batch of {batch_size}")


def _describe(t: Any) -> str:
    return f"{str(t.dtype).replace('torch.', '')} {tuple(t.shape)}" if torch.is_tensor(t) else type(t).__name__


def check_inputs(embeddings: Any, labels: Any) -> None:
    """Embeddings (B, D) floating point, labels (B,) integer class ids."""
    if not torch.is_tensor(embeddings) or embeddings.ndim != 2 or not embeddings.is_floating_point():
        shape = _describe(embeddings)
        raise BenchError(f"embeddings must be a 2-D float tensor (batch, dim), got {shape}")
    if not torch.is_tensor(labels) or labels.ndim != 1 or labels.is_floating_point() or labels.is_complex():
        shape = _describe(labels)
        raise BenchError(f"labels must be a 1-D integer tensor (batch,), got {shape}")
    if len(labels) != len(embeddings):
        raise BenchError(f"labels has {len(labels)} entries but embeddings has {len(embeddings)} rows")


class BenchLoss(nn.Module):
    """Base of dmlbench's losses: a distance, a reduction, one checked entry point, ``stats``.

    ``distance`` is a name of ``allowed`` (resolved with ``normalize``) or a
    `bench.distances.Distance`, None for a loss that measures nothing itself
    (the PML-backed ones); ``reduction`` a name or a
    `bench.reducers.Reduction`. ``loss.reduction`` reads and sets the
    reduction by name. Subclasses implement ``compute(embeddings, labels,
    indices_tuple)``; the inputs it receives are already validated (labels on
    the embeddings' device). ``stats`` is reset before each call so that a
    stale value is never logged.
    """

    def __init__(
        self,
        distance: Any = "euclidean",
        normalize: bool = True,
        reduction: Any = "mean",
        allowed: tuple[str, ...] = distances.DISTANCES,
    ) -> None:
        super().__init__()
        self.stats: dict[str, float] = {}
        if distance is not None:
            self.distance = distances.resolve(distance, normalize, allowed)
            self.reducer = reducers.resolve(reduction)

    @property
    def normalize(self) -> bool:
        return self.distance.normalize

    @property
    def reduction(self) -> str:
        return self.reducer.name

    @reduction.setter
    def reduction(self, value: Any) -> None:
        self.reducer = reducers.resolve(value)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any = None) -> torch.Tensor:
        """The loss of a batch, PML's calling convention: ``embeddings`` (B, D), ``labels`` (B,), and a
        miner's ``indices_tuple`` (`bench.tuples`) or None for every tuple the batch holds."""
        self.stats = {}
        check_inputs(embeddings, labels)
        check_indices_tuple(indices_tuple, len(embeddings))
        labels = labels.to(embeddings.device)
        return self.compute(embeddings, labels, indices_tuple)

    def compute(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        """The formula alone, on inputs `forward` has checked; each subclass's one job."""
        raise NotImplementedError

    def nothing(self, embeddings: torch.Tensor) -> torch.Tensor:
        """The loss of a call without any tuple: zero, connected to the graph, and zero ``stats``."""
        self.record(embeddings.new_zeros(0))
        return zero_loss(embeddings)

    def record(self, losses: torch.Tensor) -> None:
        """Store ``num_tuples`` and ``fraction_positive`` of per-tuple losses in ``stats``."""
        with torch.no_grad():
            n = losses.numel()
            self.stats["num_tuples"] = float(n)
            self.stats["fraction_positive"] = float(torch.count_nonzero(losses > 0)) / n if n else 0.0


def as_pairs(indices_tuple: Any, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Positive and negative pairs ``(a1, p, a2, n)`` from any index tuple (see bench.tuples).

    None gives every ordered pair of the batch; triplets give the distinct
    pairs they contain (``bench.tuples.triplets_to_pairs``; PML instead keeps
    one pair per triplet, duplicates included); ``Quadruplets(i, j, l, k)``
    give the distinct pairs the quadruplet loss compares: positives
    ``(i, j)``, negatives ``(i, k)`` and ``(l, k)``.
    """
    if indices_tuple is None:
        return all_pairs(labels)
    if isinstance(indices_tuple, Quadruplets):
        i, j, l, k = indices_tuple[:4]
        pos = torch.stack([i, j], 1)
        neg = torch.stack([torch.cat([i, l]), torch.cat([k, k])], 1)
        if len(i):
            pos, neg = torch.unique(pos, dim=0), torch.unique(neg, dim=0)
        return pos[:, 0], pos[:, 1], neg[:, 0], neg[:, 1]
    if is_triplets(indices_tuple):
        return triplets_to_pairs(tuple(indices_tuple))
    return tuple(indices_tuple)


def flat_gather(mat: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``mat[rows, cols]`` through ``index_select`` on a flat view: a plain gather, much faster backward than
    2-D indexing, and reproducible. Advanced indexing's backward (``index_put_`` with ``accumulate``)
    sums the gradients of repeated pairs in an order that depends on thread timing on the CPU; the
    backward of ``index_select`` (``index_add_``) sums them in index order. Every quadruplet miner
    returns tuples sharing pairs: with 2-D indexing the quadruplet+margohnm cell of omniglot-smoke gave
    a different model on each run at 2 threads (and matched itself under
    ``torch.use_deterministic_algorithms``)."""
    return mat.reshape(-1).index_select(0, rows * mat.shape[1] + cols)


def take_rows(mat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``mat[index]`` (any shape of ``index``) with the reproducible backward of `flat_gather`."""
    return mat.index_select(0, index.reshape(-1)).reshape(*index.shape, *mat.shape[1:])


def count_matrix(rows: torch.Tensor, cols: torch.Tensor, size: int, like: torch.Tensor) -> torch.Tensor:
    """(size, size) matrix counting how often each pair ``(rows[i], cols[i])`` occurs.

    Pair losses keep a set of negative pairs as this O(B^2) matrix rather
    than as a positive x negative mask, and a pair given twice weighs twice
    (the multiplicity enters a log-sum-exp as ``log count``).
    """
    counts = torch.zeros(size * size, dtype=like.dtype, device=like.device)
    counts.index_add_(0, rows * size + cols, torch.ones(len(rows), dtype=like.dtype, device=like.device))
    return counts.view(size, size)


def positives_and_negatives(
    indices_tuple: Any, labels: torch.Tensor, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positive pairs ``(a1, p)`` and the negative pairs as a (B, B) matrix, for row-wise pair losses.

    Without a tuple the negatives are the boolean "different class" mask
    (no index list of all B^2 negative pairs is built); with one they are
    ``count_matrix`` of its negative pairs, in ``like``'s dtype.
    """
    if indices_tuple is None:
        a1, p = torch.where(same_class(labels))
        return a1, p, diff_class(labels)
    a1, p, a2, n = as_pairs(indices_tuple, labels)
    return a1, p, count_matrix(a2, n, len(labels), like)


def masked_row_logsumexp(values: torch.Tensor, negatives: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row ``log sum_k m[i,k] * exp(values[i,k])`` and whether the row has any term.

    ``negatives`` is a boolean mask or a matrix of counts (a pair given twice
    weighs twice). Rows without a term get the most negative finite number
    instead of -inf, so that the backward pass stays finite (an all -inf row
    would give NaN gradients even where the caller discards the row).
    """
    lowest = torch.finfo(values.dtype).min
    if negatives.dtype == torch.bool:
        has, terms = negatives, values
    else:
        has = negatives > 0
        terms = values + torch.log(negatives.clamp_min(1))
    masked = torch.where(has, terms, torch.full_like(values, lowest))
    return torch.logsumexp(masked, dim=1), has.any(dim=1)
