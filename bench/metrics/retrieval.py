"""Retrieval metrics (P@1, Recall@k, R-Precision, MAP@R) with bounded memory.

The test set is both query and reference set; each query is left out of its own
neighbours. A query whose class has no other sample has no correct answer, so it
is left out of every average (it still serves as a neighbour of the others), as
PML's ``AccuracyCalculator`` does. The numbers equal PML's
``AccuracyCalculator(k="max_bin_count")`` on the same embeddings.

Why not call PML: its k-NN needs the full neighbour matrix in one go (faiss, or
a torch distance matrix of query-chunk x N), so memory grows with N. Here the
distance matrix is visited in square ``chunk_size x chunk_size`` blocks of its
upper triangle only: every block serves its rows *and*, transposed, its
columns (the matrix is symmetric), which halves the arithmetic, and a running
top-K per query is kept. Memory is one block plus ``N x K`` neighbours, with
``K = max(largest class size - 1, max(ks))``, whatever N.

Distances: PML's default k-NN is faiss ``IndexFlatL2``, i.e. (squared)
Euclidean on the raw embeddings, so ``"euclidean"`` is the default here too,
computed with ``torch.cdist`` as PML's ``LpDistance`` does. ``"cosine"`` ranks by
cosine similarity of L2-normalised embeddings (PML's ``CosineSimilarity``, and
also what PML's ``LpDistance()`` with its default ``normalize_embeddings=True``
orders by); for embeddings already of unit norm it orders as Euclidean does.

Ties: neighbours at exactly the same distance are ordered as ``torch.topk``
returns them, which is unspecified, as in PML (``torch.topk`` in its
``CustomKNN``, faiss otherwise). Ties among neighbours of the same class change
nothing; ties across classes (e.g. duplicate embeddings with different labels)
make every one of these metrics ambiguous, here and in PML alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bench.errors import BenchError

RETRIEVAL_DISTANCES = ("euclidean", "cosine")
DEFAULT_CHUNK_SIZE = 4096


def as_embeddings_and_labels(embeddings: object, labels: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate once, at the boundary: (N, D) finite float32 and (N,) int64 on the CPU.

    Embeddings become float32, as PML's ``AccuracyCalculator`` makes them, so that
    both rank neighbours with the same rounding.
    """
    x = _as_tensor(embeddings, "embeddings")
    y = _as_tensor(labels, "labels")
    if x.ndim != 2:
        raise BenchError(f"embeddings must have shape (N, D), got {tuple(x.shape)}")
    if y.ndim != 1:
        raise BenchError(f"labels must have shape (N,), got {tuple(y.shape)}")
    if x.shape[0] != y.shape[0]:
        raise BenchError(f"embeddings and labels differ in length: {x.shape[0]} vs {y.shape[0]}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise BenchError(f"embeddings are empty: shape {tuple(x.shape)}")
    if not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64, torch.uint8)):
        raise BenchError(f"embeddings must be numeric, got {x.dtype}")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise BenchError(f"labels must be integers, got {y.dtype}")
    x = x.detach().to("cpu", torch.float32).contiguous()
    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).any(dim=1).sum())
        raise BenchError(f"embeddings contain NaN or inf in {bad} of {x.shape[0]} rows")
    return x, y.detach().to("cpu", torch.int64)


def _as_tensor(value: object, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise BenchError(f"{name} must be a tensor or an array: {error}") from None
    if array.dtype == object or array.dtype.kind in "USV":
        raise BenchError(f"{name} must be numeric, got dtype {array.dtype}")
    return torch.from_numpy(np.ascontiguousarray(array))


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    try:
        values = tuple(ks)
    except TypeError:
        raise BenchError(f"ks must be a sequence of positive integers, got {ks!r}") from None
    if not values or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in values):
        raise BenchError(f"ks must be a non-empty sequence of positive integers, got {ks!r}")
    return tuple(int(k) for k in values)


def nearest_neighbours(
    x: torch.Tensor, k: int, distance: str = "euclidean", chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """Indices ``(N, k)`` of each row's k nearest other rows, nearest first.

    A row is never its own neighbour, even when duplicates lie at distance 0. Only
    blocks on or above the diagonal are computed; see the module docstring for why.
    Requires ``1 <= k <= N - 1``.
    """
    n = x.shape[0]
    if distance == "cosine":
        x = F.normalize(x, dim=1)
    # Everything is ranked as a score to minimise: the distance, or minus the similarity
    # (negation is exact, unlike 1 - s, so cosine ranks exactly as PML's similarity does).
    best_score = torch.full((n, k), float("inf"))
    best_index = torch.zeros((n, k), dtype=torch.int64)

    def merge(rows: slice, score: torch.Tensor, index: torch.Tensor) -> None:
        all_score = torch.cat((best_score[rows], score), dim=1)
        all_index = torch.cat((best_index[rows], index), dim=1)
        top_score, position = torch.topk(all_score, k, dim=1, largest=False, sorted=True)
        best_score[rows] = top_score
        best_index[rows] = torch.gather(all_index, 1, position)

    def offer(rows: slice, block: torch.Tensor, offset: int, transposed: bool) -> None:
        """Merge ``block`` (or its transpose) as candidate neighbours ``offset + j`` of queries ``rows``.

        Only entries closer than a query's current k-th best can enter its list. After
        the first block of a query they are a few per row, so they are picked with one
        comparison and gathered sparsely: a topk over the whole block costs as much as
        the distances themselves, and a transposed topk twice that.
        """
        block_rows = block.T if transposed else block
        kk = min(k, block_rows.shape[1])
        threshold = best_score[rows, -1]
        if torch.isinf(threshold).any():
            score, index = torch.topk(block_rows.contiguous(), kk, dim=1, largest=False, sorted=False)
            merge(rows, score, index + offset)
            return
        mask = block < (threshold[None, :] if transposed else threshold[:, None])
        row, col = mask.nonzero(as_tuple=True)
        if transposed:
            order = torch.argsort(col, stable=True)
            row, col = col[order], row[order]
        if len(row) == 0:
            return
        n_rows = rows.stop - rows.start
        counts = torch.bincount(row, minlength=n_rows)
        width = int(counts.max())
        slot = torch.arange(len(row)) - (torch.cumsum(counts, 0) - counts)[row]
        score = torch.full((n_rows, width), float("inf"))
        index = torch.zeros((n_rows, width), dtype=torch.int64)
        score[row, slot] = block_rows[row, col]
        index[row, slot] = col + offset
        merge(rows, score, index)

    with torch.no_grad():
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            for t in range(s, n, chunk_size):
                u = min(t + chunk_size, n)
                if distance == "cosine":
                    block = -(x[s:e] @ x[t:u].T)
                else:
                    block = torch.cdist(x[s:e], x[t:u])
                if s == t:
                    block.fill_diagonal_(float("inf"))
                offer(slice(s, e), block, t, transposed=False)
                if t != s:
                    offer(slice(t, u), block, s, transposed=True)
    return best_index


def retrieval_metrics(
    embeddings: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    ks: Sequence[int] = (1, 2, 4, 8),
    distance: str = "euclidean",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> dict[str, float]:
    """P@1, R-Precision, MAP@R and Recall@k of the set retrieving itself.

    Returns ``precision_at_1``, ``r_precision``, ``map_at_r``, ``recall_at_{k}``
    for each k, and ``num_queries`` (queries whose class has another sample).
    ``R`` of a query is the number of other samples of its class. Recall@k with
    ``k >= N - 1`` looks at all other samples, so it is 1.

    Raises ``BenchError`` on malformed input, on a ``distance`` other than
    ``"euclidean"``/``"cosine"``, and when no class has two samples (then there is
    no query to score; PML returns NaN instead).
    """
    x, y = as_embeddings_and_labels(embeddings, labels)
    ks = _check_ks(ks)
    if distance not in RETRIEVAL_DISTANCES:
        raise BenchError(f"unknown distance {distance!r}: expected one of {', '.join(RETRIEVAL_DISTANCES)}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise BenchError(f"chunk_size must be a positive integer, got {chunk_size!r}")

    _, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
    r = counts[inverse] - 1  # other samples of the query's class
    queries = r > 0
    num_queries = int(queries.sum())
    if num_queries == 0:
        raise BenchError(f"no class has two samples among {len(y)} embeddings: nothing to retrieve")

    n = x.shape[0]
    k = min(n - 1, max(int(r.max()), max(ks)))
    neighbours = nearest_neighbours(x, k, distance, int(chunk_size))[queries]
    y_q, r_q = y[queries], r[queries]
    hits = y[neighbours] == y_q[:, None]  # (Q, K), ordered nearest first

    rank = torch.arange(1, k + 1)
    within_r = rank[None, :] <= r_q[:, None]
    relevant = hits & within_r
    r_float = r_q.to(torch.float64)
    precision_at_rank = torch.cumsum(relevant, dim=1).to(torch.float64) / rank
    result: dict[str, float] = {
        "precision_at_1": hits[:, 0].to(torch.float64).mean().item(),
        "r_precision": (relevant.sum(dim=1) / r_float).mean().item(),
        "map_at_r": ((precision_at_rank * relevant).sum(dim=1) / r_float).mean().item(),
    }
    for kk in ks:
        result[f"recall_at_{kk}"] = hits[:, : min(kk, k)].any(dim=1).to(torch.float64).mean().item()
    result["num_queries"] = float(num_queries)
    return result
