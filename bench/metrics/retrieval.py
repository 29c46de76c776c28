"""Retrieval metrics (P@1, Recall@k, R-Precision, MAP@R) with bounded memory.

The test set is both query and reference set; each query is left out of its own
neighbours. A query whose class has no other sample has no correct answer, so it
is left out of every average (it still serves as a neighbour of the others), as
PML's ``AccuracyCalculator`` does. The numbers equal PML's
``AccuracyCalculator(k="max_bin_count")`` on the same embeddings.

Why not call PML: its k-NN holds a whole (query batch x N) distance matrix and
makes several passes over it (cdist, clamp, sqrt, topk), so memory is large and
grows with N. Here queries go in chunks of rows scored against all N by one
matrix product into a reused buffer of at most ``KNN_BLOCK_ELEMENTS`` scores, so the
block memory stays fixed as N grows (plus ``N x K`` neighbours, with
``K = max(largest class size - 1, max(ks))``). The top-K of a row is found
without a full ``torch.topk`` over it: the row is cut into groups of ``g``
columns, the K groups with the smallest minima hold an exact top-K (see
``nearest_neighbours``), and only their ``K * g`` scores are ranked.

Distances: PML's default k-NN is faiss ``IndexFlatL2``, i.e. (squared)
Euclidean on the raw embeddings, so ``"euclidean"`` is the default here too.
Scores are squared distances computed exactly as ``torch.cdist`` (PML's
``LpDistance``) computes them before its clamp and sqrt, as one product
``[-2x, |x|^2, 1] . [y, 1, |y|^2]`` (bitwise the same numbers, checked on this
MKL build), and ranked without the sqrt, which is monotonic; it can only round
two close distances into a tie for PML that is ordered here by the exact score. ``"cosine"`` ranks by cosine similarity
of L2-normalised embeddings (PML's ``CosineSimilarity``, and also what PML's
``LpDistance()`` with its default ``normalize_embeddings=True`` orders by); for
embeddings already of unit norm it orders as Euclidean does.

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
BLOCK_ELEMENTS = 1 << 25  # scores in one block of query rows x N: 128 MB of float32
# The k-NN's own blocks are smaller (16 MB): its passes over a block (group minima, top-K, gather) run more
# from cache. `benchmarks/bench_knn_blocks.py` (one thread, the 2-core Xeon with AMX): Omniglot's 13,180 x 64
# 0.64 s at 2^25, 0.35 s at 2^22; SOP's 60,502 x 128 10.4 s and 9.8 s; values equal. Query/gallery ranking
# keeps BLOCK_ELEMENTS (a learned metric's g ran 2-10% slower in smaller chunks).
KNN_BLOCK_ELEMENTS = 1 << 22


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
    x: torch.Tensor,
    k: int,
    distance: str = "euclidean",
    chunk_size: int | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    """Indices ``(N, k)`` of each row's k nearest other rows, nearest first.

    A row is never its own neighbour, even when duplicates lie at distance 0.
    ``chunk_size`` rows are scored against all N at a time (default: as many as
    fit in ``KNN_BLOCK_ELEMENTS`` scores). ``group_size`` is the width of the column
    groups whose minima pre-select candidates (default: chosen from N and k; 1
    means a plain ``torch.topk`` over each row). Requires ``1 <= k <= N - 1``.
    """
    n = x.shape[0]
    if not 1 <= k <= n - 1:
        raise BenchError(f"k must be in 1..{n - 1} for {n} embeddings, got {k}")
    rows = min(n, chunk_size if chunk_size is not None else max(1, KNN_BLOCK_ELEMENTS // n))
    g = group_size if group_size is not None else _group_size(n, k)
    if g > 1 and -(-n // g) < k + 2:
        g = 1  # too few groups to hold k of them with finite scores: see below
    groups = -(-n // g)
    width = groups * g  # columns, padded to whole groups

    with torch.no_grad():
        if distance == "cosine":
            # Minus the similarity: negating the query makes the product exactly -(x . y),
            # so it ranks exactly as PML's CosineSimilarity does.
            refs = F.normalize(x, dim=1)
            query = lambda s, e: -refs[s:e]  # noqa: E731
        else:
            # torch.cdist's own formulation (what PML's LpDistance calls), less its final
            # clamp and sqrt, which are monotonic: [-2x, |x|^2, 1] . [y, 1, |y|^2].
            sq = x.pow(2).sum(-1, keepdim=True)
            one = torch.ones_like(sq)
            refs = torch.cat((x, one, sq), dim=1)
            query = lambda s, e: torch.cat((x[s:e].mul(-2), sq[s:e], one[s:e]), dim=1)  # noqa: E731
        if width > n:
            refs = torch.cat((refs, refs.new_zeros(width - n, refs.shape[1])))
        refs_t = refs.T
        buffer = torch.empty(rows * width)
        best = torch.empty((n, k), dtype=torch.int64)
        for s in range(0, n, rows):
            e = min(s + rows, n)
            r = e - s
            block = buffer[: r * width].view(r, width)
            torch.mm(query(s, e), refs_t, out=block)
            # Row i's own column s + i, at flat position i * width + s + i.
            block.view(-1)[s : s + (r - 1) * (width + 1) + 1 : width + 1] = float("inf")
            if width > n:
                block[:, n:] = float("inf")
            if g == 1:
                best[s:e] = torch.topk(block, k, dim=1, largest=False, sorted=True).indices
                continue
            # The k smallest group minima lie in k distinct groups, so a row's k-th
            # smallest score is at most the k-th smallest group minimum T; every score
            # below T is in a group whose minimum is below T, i.e. among those k groups,
            # and they hold k scores <= T. Their k * g scores thus contain an exact top-k
            # (ties at T broken arbitrarily, as by torch.topk). T is finite since at most
            # two groups (self, padding) lack a finite score and there are >= k + 2.
            grouped = block.view(r, groups, g)
            chosen = torch.topk(grouped.amin(dim=2), k, dim=1, largest=False, sorted=False).indices
            candidates = torch.gather(grouped, 1, chosen.unsqueeze(2).expand(r, k, g)).view(r, k * g)
            position = torch.topk(candidates, k, dim=1, largest=False, sorted=True).indices
            best[s:e] = torch.gather(chosen, 1, position // g) * g + position % g
    return best


def _group_size(n: int, k: int) -> int:
    """Column group width: about sqrt(N / k) balances the group-minimum top-k against the candidate top-k."""
    g = 32
    while g > 1 and n < 4 * k * g:
        g //= 2
    return g if g >= 4 else 1


def retrieval_metrics(
    embeddings: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    ks: Sequence[int] = (1, 2, 4, 8),
    distance: str = "euclidean",
    chunk_size: int | None = None,
) -> dict[str, float]:
    """P@1, R-Precision, MAP@R and Recall@k of the set retrieving itself.

    Returns ``precision_at_1``, ``r_precision``, ``map_at_r``, ``recall_at_{k}``
    for each k, and ``num_queries`` (queries whose class has another sample).
    ``R`` of a query is the number of other samples of its class. Recall@k with
    ``k >= N - 1`` looks at all other samples, so it is 1. ``chunk_size`` is the
    number of queries scored at a time, against all N (``chunk_size x N`` float32
    scores); by default as many as fit in ``KNN_BLOCK_ELEMENTS`` (16 MB), whatever N.

    Raises ``BenchError`` on malformed input, on a ``distance`` other than
    ``"euclidean"``/``"cosine"``, and when no class has two samples (then there is
    no query to score; PML returns NaN instead).
    """
    x, y = as_embeddings_and_labels(embeddings, labels)
    ks = _check_ks(ks)
    if distance not in RETRIEVAL_DISTANCES:
        raise BenchError(f"unknown distance {distance!r}: expected one of {', '.join(RETRIEVAL_DISTANCES)}")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
    ):
        raise BenchError(f"chunk_size must be a positive integer, got {chunk_size!r}")

    _, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
    r = counts[inverse] - 1  # other samples of the query's class
    queries = r > 0
    num_queries = int(queries.sum())
    if num_queries == 0:
        raise BenchError(f"no class has two samples among {len(y)} embeddings: nothing to retrieve")

    n = x.shape[0]
    k = min(n - 1, max(int(r.max()), max(ks)))
    neighbours = nearest_neighbours(x, k, distance, None if chunk_size is None else int(chunk_size))[queries]
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
