"""Frozen copy of bench.metrics.query_gallery before the top-K rewrite (issue 25): the reference the fast path must equal.

A query set is ranked against a separate gallery. Which gallery items a
query may see, and which of them count as correct, is the whole difference
between the benchmarks, so it is stated once here:

* every mode: a gallery item that *is* the query (same sample id, e.g. when
  query and gallery are one set) is removed from that query's gallery;
* re-ID (Market-1501's rules): gallery items of the query's identity taken
  by the query's camera are removed (they are too easy), and so are junk
  items (identity ``junk_label``, -1); distractors (``distractor_label``,
  0) stay as negatives, never as matches, even for one another.

A query with no correct item left in its gallery cannot be scored: it is
left out of every average and counted (``skipped_queries``), as PML's
``AccuracyCalculator`` leaves out a query whose label is not in the
reference set, and as Market-1501's evaluation code skips such a query.

Ranking: by distance (the protocol geometry's embeddings; squared Euclidean
computed as in `bench.metrics.retrieval`, or cosine), ties broken by gallery
position, the order a stable sort gives. Every number below is a function of
that order, so equal distances give the same result in every code path (and
in the loop references of the tests).

Memory: queries go in chunks scored against the whole gallery, sized so
that a chunk's scores and masks together stay near ``BLOCK_ELEMENTS`` x 4
bytes (128 MB; see ``RANK_COST``), whatever the sizes: SOP's 60,502 x 60,502
is about 1,100 chunks of 55 queries. The first correct item's rank (P@1, Recall@K, CMC)
is counted without sorting; MAP@R and R-Precision rank only the first R
items of a row (a top-k plus the stable tie-break at its boundary); re-ID
mAP, which needs every correct item's rank, sorts each row of a chunk
(Market-1501's 19,732 gallery images: a few seconds per 1,000 queries).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bench.errors import BenchError
from bench.metrics.retrieval import BLOCK_ELEMENTS, RETRIEVAL_DISTANCES, _as_tensor, _check_ks, as_embeddings_and_labels

PairScore = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (query rows, gallery) -> scores, smaller nearer
RANKING_METRICS = ("precision_at_1", "r_precision", "map_at_r", "recall_at_k")
# A chunk's working set in float32 blocks (4 bytes an element), measured: the exclusion masks and the
# counted ranks make about a dozen bool masks and two float copies of the scores (~38 bytes an element);
# a sorted chunk holds scores, sorted scores and int64 positions (~30). So a chunk stays near
# BLOCK_ELEMENTS x 4 bytes (128 MB), whatever the gallery's size.
RANK_COST, SORT_COST = 10, 8


def query_gallery_metrics(
    query: torch.Tensor | np.ndarray,
    query_labels: torch.Tensor | np.ndarray,
    gallery: torch.Tensor | np.ndarray,
    gallery_labels: torch.Tensor | np.ndarray,
    *,
    ks: Sequence[int] = (1, 2, 4, 8),
    query_ids: torch.Tensor | np.ndarray | None = None,
    gallery_ids: torch.Tensor | np.ndarray | None = None,
    distance: str = "euclidean",
    chunk_size: int | None = None,
    metrics: Sequence[str] = RANKING_METRICS,
    pair_score: PairScore | None = None,
    pair_cost: int = 0,
) -> dict[str, float]:
    """P@1, R-Precision, MAP@R and Recall@k of each query against the gallery (less the query itself).

    ``R`` of a query is the number of gallery items of its class (the query
    excluded). Recall@k: at least one of the k nearest gallery items has the
    query's class (the DML convention; P@1 is Recall@1). Sample ids (any
    integers) say which gallery item is which query; without them the two
    sets share no sample. ``metrics`` limits the work to what is asked.
    Returns also ``num_queries`` and ``skipped_queries``.
    """
    scorer = _Scorer(
        query,
        query_labels,
        gallery,
        gallery_labels,
        query_ids,
        gallery_ids,
        None,
        None,
        distance,
        chunk_size,
        None,
        None,
        pair_score,
        pair_cost,
    )
    ks = _check_ks(ks)
    unknown = sorted(set(metrics) - set(RANKING_METRICS))
    if unknown:
        raise BenchError(f"unknown query/gallery metric {unknown[0]!r}: expected one of {', '.join(RANKING_METRICS)}")
    need_rank = "precision_at_1" in metrics or "recall_at_k" in metrics
    need_r = "r_precision" in metrics or "map_at_r" in metrics
    n = len(scorer.qy)
    first = torch.zeros(n, dtype=torch.int64)
    r_prec, map_r = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for s, e, block, positive in scorer.blocks(scorer.rows(RANK_COST)):
        if need_rank:
            first[s:e] = first_hit_rank(block, positive)
        if need_r:
            r_prec[s:e], map_r[s:e] = _r_metrics(block, positive)
    result: dict[str, float] = {}
    if need_rank:
        rank = scorer.nonempty(first)
        if "precision_at_1" in metrics:
            result["precision_at_1"] = (rank == 1).to(torch.float64).mean().item()
        if "recall_at_k" in metrics:
            for k in ks:
                result[f"recall_at_{k}"] = (rank <= k).to(torch.float64).mean().item()
    if need_r:
        result["r_precision"] = scorer.nonempty(r_prec).mean().item()
        result["map_at_r"] = scorer.nonempty(map_r).mean().item()
    return {**result, **scorer.counts()}


def reid_metrics(
    query: torch.Tensor | np.ndarray,
    query_labels: torch.Tensor | np.ndarray,
    query_cameras: torch.Tensor | np.ndarray,
    gallery: torch.Tensor | np.ndarray,
    gallery_labels: torch.Tensor | np.ndarray,
    gallery_cameras: torch.Tensor | np.ndarray,
    *,
    ks: Sequence[int] = (1, 5, 10),
    query_ids: torch.Tensor | np.ndarray | None = None,
    gallery_ids: torch.Tensor | np.ndarray | None = None,
    distance: str = "euclidean",
    chunk_size: int | None = None,
    junk_label: int | None = -1,
    distractor_label: int | None = 0,
    pair_score: PairScore | None = None,
    pair_cost: int = 0,
) -> dict[str, float]:
    """mAP and CMC rank-k under the Market-1501 rules (see the module docstring).

    AP of a query: the mean, over its correct gallery items, of the
    precision at each one's rank in its ranked valid gallery. CMC rank-k: the
    fraction of queries whose first correct item is within the k first.
    Returns ``reid_map``, ``cmc_at_{k}``, ``num_queries``, ``skipped_queries``.
    """
    scorer = _Scorer(
        query,
        query_labels,
        gallery,
        gallery_labels,
        query_ids,
        gallery_ids,
        query_cameras,
        gallery_cameras,
        distance,
        chunk_size,
        junk_label,
        distractor_label,
        pair_score,
        pair_cost,
    )
    ks = _check_ks(ks)
    n = len(scorer.qy)
    first, ap = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.float64)
    for s, e, block, positive in scorer.blocks(scorer.rows(SORT_COST)):
        first[s:e], ap[s:e] = sorted_ranks(block, positive)
    rank = scorer.nonempty(first)
    result = {"reid_map": scorer.nonempty(ap).mean().item()}
    for k in ks:
        result[f"cmc_at_{k}"] = (rank <= k).to(torch.float64).mean().item()
    return {**result, **scorer.counts()}


# --------------------------------------------------------------------------- ranking a block


def first_hit_rank(scores: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """1-based rank of each row's first correct item among its finite scores, ties by position.

    Counted, not sorted: the first correct item is the one with the
    smallest (score, position); every finite-scored item before it in that
    order is a wrong one. A row without a positive gets a meaningless rank; excluded items
    hold +inf.
    """
    best = torch.where(positive, scores, torch.full_like(scores, float("inf"))).amin(dim=1, keepdim=True)
    at = torch.argmax((positive & (scores == best)).to(torch.uint8), dim=1, keepdim=True)  # first of ties
    column = torch.arange(scores.shape[1]).unsqueeze(0)
    before = (scores < best) | ((scores == best) & (column < at))
    return 1 + (before & ~positive & torch.isfinite(scores)).sum(dim=1)


def sorted_ranks(scores: torch.Tensor, positive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's first correct rank and AP over its whole ranked valid gallery (stable sort: ties by position).

    Excluded items sort last (+inf) and are never correct, so a position in
    the sorted row is a rank in the valid gallery. Only the correct items'
    positions are kept (``nonzero``, row-major): the j-th of a row, at
    0-based position t, adds precision j / (t + 1) to its AP.
    """
    order = torch.sort(scores, dim=1, stable=True).indices
    row, at = torch.gather(positive, 1, order).nonzero(as_tuple=True)
    del order
    per_row = torch.bincount(row, minlength=len(scores))
    start = torch.cumsum(per_row, dim=0) - per_row  # index of each row's first hit in (row, at)
    j = torch.arange(1, len(row) + 1) - start[row]  # 1-based count of hits so far in the row
    ap = torch.zeros(len(scores), dtype=torch.float64).index_add_(0, row, j.to(torch.float64) / (at + 1))
    first = torch.zeros(len(scores), dtype=torch.int64)  # 0 (and AP NaN) for a row without a correct item
    some = per_row > 0
    first[some] = at[start[some]] + 1
    return first, ap / per_row


def _r_metrics(scores: torch.Tensor, positive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """R-Precision and MAP@R of each row (R = its number of positives), from its first R ranked items."""
    r = positive.sum(dim=1)
    if len(r) == 0 or int(r.max()) == 0:  # NaN for a row without a correct item
        nan = torch.full((len(r),), float("nan"), dtype=torch.float64)
        return nan, nan
    hits = torch.gather(positive, 1, ranked_prefix(scores, int(r.max())))
    rank = torch.arange(1, hits.shape[1] + 1)
    relevant = hits & (rank.unsqueeze(0) <= r.unsqueeze(1))
    precision = torch.cumsum(relevant, dim=1).to(torch.float64) / rank
    r_float = r.to(torch.float64)
    return relevant.sum(dim=1) / r_float, (precision * relevant).sum(dim=1) / r_float


def ranked_prefix(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Positions ``(rows, k)`` of each row's k first items in (score, position) order, without a full sort.

    ``torch.topk`` finds the k smallest scores but chooses arbitrarily
    among items tied with the k-th; here every item below the k-th score is
    kept and the tied ones are taken by position, then the k are ordered by
    a stable sort of the position-ordered selection.
    """
    k = min(k, scores.shape[1])
    threshold = torch.topk(scores, k, dim=1, largest=False).values.amax(dim=1, keepdim=True)
    below = scores < threshold
    tied = scores == threshold
    room = k - below.sum(dim=1, keepdim=True)
    keep = below | tied
    over = (tied.sum(dim=1, keepdim=True) > room).squeeze(1).nonzero().squeeze(1)  # more ties than room: rare
    if len(over):
        t = tied[over]
        keep[over] = below[over] | (t & (torch.cumsum(t, dim=1) <= room[over]))
    chosen = keep.nonzero()[:, 1].view(len(scores), k)  # row-major: positions in increasing order
    order = torch.sort(torch.gather(scores, 1, chosen), dim=1, stable=True).indices
    return torch.gather(chosen, 1, order)


# --------------------------------------------------------------------------- inputs and blocks


class _Scorer:
    """Validated inputs and the chunked score blocks with the exclusion rules applied.

    Scores are the ``distance``'s, or, given ``pair_score``, that function of
    (a chunk of query rows, the whole gallery), smaller nearer: a learned
    metric's ``g`` (`bench.losses.learned_metric.PairScorer`). Its working
    memory is ``pair_cost`` values per scored pair, counted with the ranking's
    own when chunks are sized, so a chunk of queries x gallery stays within
    ``BLOCK_ELEMENTS`` x 4 bytes however large the sets (no N x N matrix).
    """

    def __init__(
        self,
        query: object,
        query_labels: object,
        gallery: object,
        gallery_labels: object,
        query_ids: object,
        gallery_ids: object,
        query_cameras: object,
        gallery_cameras: object,
        distance: str,
        chunk_size: int | None,
        junk_label: int | None,
        distractor_label: int | None,
        pair_score: PairScore | None = None,
        pair_cost: int = 0,
    ) -> None:
        self.pair_score, self.pair_cost = pair_score, int(pair_cost)
        self.q, self.qy = as_embeddings_and_labels(query, query_labels)
        self.g, self.gy = as_embeddings_and_labels(gallery, gallery_labels)
        if self.q.shape[1] != self.g.shape[1]:
            raise BenchError(f"query and gallery embeddings differ in size: {self.q.shape[1]} vs {self.g.shape[1]}")
        if distance not in RETRIEVAL_DISTANCES:
            raise BenchError(f"unknown distance {distance!r}: expected one of {', '.join(RETRIEVAL_DISTANCES)}")
        if chunk_size is not None and (
            isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
        ):
            raise BenchError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if self.pair_cost < 0:
            raise BenchError(f"pair_cost must be >= 0, got {pair_cost!r}")
        if (query_ids is None) != (gallery_ids is None):
            raise BenchError("sample ids must be given for both query and gallery, or for neither")
        self.qid = _per_sample(query_ids, len(self.qy), "query_ids")
        self.gid = _per_sample(gallery_ids, len(self.gy), "gallery_ids")
        self.qcam = _per_sample(query_cameras, len(self.qy), "query_cameras")
        self.gcam = _per_sample(gallery_cameras, len(self.gy), "gallery_cameras")
        self.distance, self.chunk_size = distance, chunk_size
        self.junk, self.distractor = junk_label, distractor_label
        self.has = torch.zeros(len(self.qy), dtype=torch.bool)  # queries with a correct item in the gallery

    def rows(self, cost: int) -> int:
        """Queries per chunk: the caller's, or as many as keep ``cost`` x the block within BLOCK_ELEMENTS."""
        if self.chunk_size is not None:
            return int(self.chunk_size)
        return max(1, BLOCK_ELEMENTS // ((cost + self.pair_cost) * len(self.gy)))

    def blocks(self, rows: int) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """(start, end, scores, positive) per chunk of queries: excluded gallery items score +inf and are not
        positive. Callers write each chunk's results into arrays made beforehand and keep every row (a row
        without a correct item is dropped at the end, by `nonempty`): blocks of one size chunk after chunk,
        and no small allocation that outlives a chunk, let the allocator reuse its memory; results
        appended chunk by chunk pinned the heap between freed blocks (RSS grew from 0.2 to 1 GB over
        SOP's 60,502 queries)."""
        q_op, g_op = _operands(self.q, self.g, self.distance)
        g_t = g_op.T  # a transposed view: BLAS reads it as is, no copy of the gallery
        gy = self.gy.unsqueeze(0)
        never = torch.zeros(len(self.gy), dtype=torch.bool)
        if self.junk is not None:
            never |= self.gy == self.junk
        not_match = never.clone()
        if self.distractor is not None:
            not_match |= self.gy == self.distractor
        for s in range(0, len(self.qy), rows):
            e = min(s + rows, len(self.qy))
            with torch.no_grad():
                scores = self._learned(s, e) if self.pair_score is not None else q_op[s:e] @ g_t
            same = self.qy[s:e].unsqueeze(1) == gy
            excluded = never.unsqueeze(0).expand_as(same).clone()
            if self.qid is not None and self.gid is not None:
                excluded |= self.qid[s:e].unsqueeze(1) == self.gid.unsqueeze(0)
            if self.qcam is not None and self.gcam is not None:
                excluded |= same & (self.qcam[s:e].unsqueeze(1) == self.gcam.unsqueeze(0))
            scores[excluded] = float("inf")
            positive = same & ~excluded & ~not_match.unsqueeze(0)
            self.has[s:e] = positive.any(dim=1)
            yield s, e, scores, positive

    def _learned(self, s: int, e: int) -> torch.Tensor:
        """``pair_score`` of queries s..e against the gallery, checked: (e - s, gallery) finite float32."""
        assert self.pair_score is not None
        scores = self.pair_score(self.q[s:e], self.g)
        if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (e - s, len(self.gy)):
            shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise BenchError(f"pair_score returned {shape}, expected ({e - s}, {len(self.gy)})")
        scores = scores.detach().to("cpu", torch.float32)
        if not bool(torch.isfinite(scores).all()):
            raise BenchError("pair_score returned NaN or inf")
        return scores

    def nonempty(self, values: torch.Tensor) -> torch.Tensor:
        """The per-query values of the queries with a correct gallery item; none at all is an error."""
        if not self.has.any():
            raise BenchError(
                f"none of the {len(self.qy)} queries has a correct item in the gallery of "
                f"{len(self.gy)}: nothing to retrieve (are query and gallery of the same classes?)"
            )
        return values[self.has]

    def counts(self) -> dict[str, float]:
        scored = int(self.has.sum())
        return {"num_queries": float(scored), "skipped_queries": float(len(self.qy) - scored)}


def _per_sample(values: object, n: int, name: str) -> torch.Tensor | None:
    """Integer ids or cameras, one per sample, or None."""
    if values is None:
        return None
    t = _as_tensor(values, name)
    if t.shape != (n,):
        raise BenchError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise BenchError(f"{name} must be integers, got {t.dtype}")
    return t.to("cpu", torch.int64)


def _operands(q: torch.Tensor, g: torch.Tensor, distance: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) with ``A @ B.T`` the ranking score, smaller nearer: as `bench.metrics.retrieval` scores.

    Euclidean: the squared distance in torch.cdist's own form ``[-2q, |q|^2, 1] . [g, 1, |g|^2]``;
    cosine: minus the similarity of the L2-normalised rows.
    """
    if distance == "cosine":
        return -F.normalize(q, dim=1), F.normalize(g, dim=1)
    qq, gg = q.pow(2).sum(-1, keepdim=True), g.pow(2).sum(-1, keepdim=True)
    return torch.cat((q.mul(-2), qq, torch.ones_like(qq)), dim=1), torch.cat((g, torch.ones_like(gg), gg), dim=1)
