"""Query-versus-gallery retrieval (In-shop) and person re-identification (Market-1501) metrics.

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

Memory and speed: queries go in chunks scored against the whole gallery, sized so that
a chunk's working set stays near ``BLOCK_ELEMENTS`` x 4 bytes (128 MB; see ``RANK_COST``,
``REID_COST``), whatever the sizes. The exclusion rules are index lists made once (junk
columns; (query, gallery) pairs of the same sample or the same identity and camera) and
``R`` is counted from the labels, so a chunk costs its scores and little more:

* Recall@K, P@1, R-Precision and MAP@R look at most ``K = max(max(ks), largest R)`` items
  deep, found by `top_ranked` (column-group minima pick the candidates, ranked by (score,
  position); a row tied at the k-th score goes to `ranked_prefix`);
* a symmetric learned pair score (``pair_score.symmetric``) ranking a set against itself scores one
  triangle: each chunk from its first row on, the rest kept by the chunks above (``MIRROR_ELEMENTS``);
* re-ID mAP needs every correct item's rank: junk columns are left out of the scores (never
  ranked, so never scored), and `_Scorer.positive_ranks` maps each row's scores monotonically
  into histogram bins, slice by slice of rows, counts the items in bins before each correct
  item's, and orders exactly (score, then position: what `sorted_ranks`' stable sort gives)
  only the items of the bins that correct items share.

Both give exactly the numbers of the full-pass versions (``tests/metrics/test_query_gallery_fast.py``
compares with a frozen copy, ties included).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bench.errors import BenchError
from bench.metrics._score_bins import MAGIC_BITS, bin_maps, equal_pairs, near_ranks, score_bins, true_positions
from bench.metrics.retrieval import (
    BLOCK_ELEMENTS,
    RETRIEVAL_DISTANCES,
    _as_tensor,
    _check_ks,
    _group_size,
    as_embeddings_and_labels,
)

PairScore = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (query rows, gallery) -> scores, smaller nearer
RANKING_METRICS = ("precision_at_1", "r_precision", "map_at_r", "recall_at_k")
# A chunk's working set in float32 blocks (4 bytes an element): ranking needs the scores and a gather of
# the column-group minima and candidates (~8 bytes an element); re-ID keeps the chunk's scores and its
# correct items (~4 bytes an element with a few correct items a row; more when one identity fills the
# gallery), and works on one slice of rows at a time (`SLICE_ELEMENTS`). So a chunk stays near
# BLOCK_ELEMENTS x 4 bytes (128 MB), whatever the size.
RANK_COST, REID_COST = 2, 4
# re-ID's counted ranks (`_Scorer.positive_ranks`): gallery items a histogram bin holds on average; the
# most bins in one slice (their numbers exact in float32: `score_bins` adds 2^23, below 2^24); the elements
# of a slice (its scores, bins and lookup stay in a core's cache through the passes over them)
BIN_SHARE, BIN_LIMIT, SLICE_ELEMENTS = 8, 1 << 22, 1 << 19
# A symmetric pair score of a set against itself is scored for one triangle (`_Scorer._learned`), keeping at
# most ~N^2 / 4 values: only within MIRROR_ELEMENTS x 4 bytes (256 MB: N up to 16,384; Omniglot's test set is
# 13,180); larger sets score every pair.
MIRROR_ELEMENTS = 1 << 26


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
    # Every metric here looks at most K items deep: Recall@k at k <= max(ks), R-Precision and MAP@R at R.
    depth = max(max(ks) if need_rank else 1, int(scorer.r.max()) if need_r and len(scorer.r) else 1)
    depth = max(1, min(depth, len(scorer.gy)))
    for s, e, block in scorer.blocks(scorer.rows(RANK_COST)):
        top = top_ranked(block, depth)
        hit = scorer.hits(s, e, top, torch.gather(block, 1, top))
        if need_rank:  # beyond the depth: depth + 1, which no k <= depth counts
            first[s:e] = torch.where(hit.any(dim=1), hit.to(torch.uint8).argmax(dim=1) + 1, depth + 1)
        if need_r:
            r_prec[s:e], map_r[s:e] = _r_metrics_from_hits(hit, scorer.r[s:e])
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
    for s, e, block in scorer.blocks(scorer.rows(REID_COST), ranked_only=True):
        first[s:e], ap[s:e] = scorer.positive_ranks(s, e, block)
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


def top_ranked(scores: torch.Tensor, k: int, group_size: int | None = None) -> torch.Tensor:
    """`ranked_prefix`'s result, found from column-group minima instead of passes over every column.

    The row is cut into groups of ``g`` columns (the last ``N mod g`` columns are always candidates).
    The k groups with the smallest minima hold k items no larger than the k-th smallest minimum M, so
    the k-th smallest score T of the candidates is <= M, and every item outside them is >= M >= T.
    Ranked by (score, position), the candidates' first k are thus the row's first k unless an outside
    group holds an item equal to T, i.e. more than k groups have a minimum <= T: such rows (exact
    ties at the boundary) are ranked by `ranked_prefix` itself.
    """
    rows, n = scores.shape
    k = min(k, n)
    g = group_size if group_size is not None else _group_size(n, k)
    groups = n // g if g > 1 else 0
    if groups < k + 1:
        return ranked_prefix(scores, k)
    full = groups * g
    minima = scores[:, :full].reshape(rows, groups, g).amin(dim=2)
    chosen = torch.topk(minima, k, dim=1, largest=False, sorted=False).indices.sort(dim=1).values
    columns = (chosen.unsqueeze(2) * g + torch.arange(g)).view(rows, k * g)  # increasing: position order
    if full < n:
        columns = torch.cat((columns, torch.arange(full, n).expand(rows, n - full)), dim=1)
    values, order = torch.sort(torch.gather(scores, 1, columns), dim=1, stable=True)
    best = torch.gather(columns, 1, order[:, :k])
    unsafe = ((minima <= values[:, k - 1 : k]).sum(dim=1) > k).nonzero().squeeze(1)
    if len(unsafe):
        best[unsafe] = ranked_prefix(scores[unsafe], k)
    return best


def _r_metrics_from_hits(hit: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """R-Precision and MAP@R of each row from its first ranked items' hits (at least R of them)."""
    width = max(1, min(hit.shape[1], int(r.max()) if len(r) else 1))
    hit = hit[:, :width]
    rank = torch.arange(1, width + 1)
    relevant = hit & (rank.unsqueeze(0) <= r.unsqueeze(1))
    precision = torch.cumsum(relevant, dim=1).to(torch.float64) / rank
    r_float = r.to(torch.float64)
    return relevant.sum(dim=1) / r_float, (precision * relevant).sum(dim=1) / r_float


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
        # one set against itself under a symmetric score: one triangle scored (MIRROR_ELEMENTS)
        symmetric = pair_score is not None and getattr(pair_score, "symmetric", False) is True
        self.mirrors = symmetric and query is gallery and len(self.gy) ** 2 // 4 <= MIRROR_ELEMENTS
        self.mirror: dict[int, list[torch.Tensor]] | None = None
        self._exclusions()

    def rows(self, cost: int) -> int:
        """Queries per chunk: the caller's, or as many as keep ``cost`` x the block within BLOCK_ELEMENTS."""
        if self.chunk_size is not None:
            return int(self.chunk_size)
        return max(1, BLOCK_ELEMENTS // ((cost + self.pair_cost) * len(self.gy)))

    def _exclusions(self) -> None:
        """The rules as index lists, once: excluded columns (junk), excluded (query, gallery) pairs (the
        query itself, same identity and camera), and R, each query's number of correct gallery items."""
        G = len(self.gy)
        never = torch.zeros(G, dtype=torch.bool)
        if self.junk is not None:
            never |= self.gy == self.junk
        self.matchable = ~never
        if self.distractor is not None:
            self.matchable &= self.gy != self.distractor
        self.never_columns = never.nonzero().squeeze(1)
        # re-ID's blocks leave the never-ranked columns out: block column c is gallery item ranked[c]
        self.ranked = (~never).nonzero().squeeze(1)
        self.column = torch.full((G,), -1, dtype=torch.int64)
        self.column[self.ranked] = torch.arange(len(self.ranked))
        pairs = []
        if self.qid is not None and self.gid is not None:
            pairs.append(equal_pairs(self.qid, self.gid))
        if self.qcam is not None and self.gcam is not None:
            # (identity, camera) as one integer: the two renumbered 0.. by a sort each (no sort of rows)
            identity = torch.unique(torch.cat((self.qy, self.gy)), return_inverse=True)[1]
            camera = torch.unique(torch.cat((self.qcam, self.gcam)), return_inverse=True)[1]
            key = identity * (int(camera.max()) + 1) + camera
            pairs.append(equal_pairs(key[: len(self.qy)], key[len(self.qy) :]))
        flat = torch.unique(torch.cat([q * G + j for q, j in pairs])) if pairs else torch.zeros(0, dtype=torch.int64)
        self.ex_q, self.ex_g, self.ex_flat = flat // G, flat % G, flat  # sorted by query
        # the matchable gallery items, sorted by label once for `_positives`
        self.match_index = self.matchable.nonzero().squeeze(1)
        values, order = torch.sort(self.gy[self.match_index], stable=True)
        self.match_sorted = (values, order)
        # R: the query's class in the gallery (matchable items), less its excluded pairs of that class.
        labels, counts = torch.unique(self.gy[self.matchable], return_counts=True)
        at = torch.searchsorted(labels, self.qy).clamp(max=max(len(labels) - 1, 0))
        same = torch.zeros(len(self.qy), dtype=torch.int64)
        if len(labels):
            same = torch.where(labels[at] == self.qy, counts[at], 0)
        lost = (self.gy[self.ex_g] == self.qy[self.ex_q]) & self.matchable[self.ex_g]
        self.r = same - torch.bincount(self.ex_q[lost], minlength=len(self.qy))
        self.has = self.r > 0

    def blocks(self, rows: int, ranked_only: bool = False) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(start, end, scores) per chunk of queries, excluded gallery items at +inf; with ``ranked_only``
        the never-ranked columns (junk) are left out of the scores instead, so block column c is gallery
        item ``self.ranked[c]`` (increasing: ties still break by gallery position). Callers write each
        chunk's results into arrays made beforehand and keep every row (a row without a correct item is
        dropped at the end, by `nonempty`), and keep nothing of a block past its chunk: the distance
        blocks are one buffer, rewritten chunk after chunk. Blocks of one size and no small allocation
        that outlives a chunk let the allocator reuse its memory; results appended chunk by chunk pinned
        the heap between freed blocks (RSS grew from 0.2 to 1 GB over SOP's 60,502 queries)."""
        q_op, g_op = _operands(self.q, self.g, self.distance)
        ex_q, ex_g, never = self.ex_q, self.ex_g, self.never_columns
        drop = ranked_only and len(never) > 0
        if drop:
            g_op = g_op[self.ranked]
            kept = self.column[ex_g] >= 0
            ex_q, ex_g, never = ex_q[kept], self.column[ex_g[kept]], never[:0]
        g_t = g_op.T  # a transposed view: BLAS reads it as is, no copy of the gallery
        self.mirror = {} if self.mirrors else None  # the kept transposes, by the chunk start that reads them
        out = torch.empty(min(rows, len(self.qy)), len(g_op)) if self.pair_score is None else None
        inf = float("inf")
        for s in range(0, len(self.qy), rows):
            e = min(s + rows, len(self.qy))
            with torch.no_grad():
                if out is not None:
                    scores = torch.matmul(q_op[s:e], g_t, out=out[: e - s])
                else:
                    scores = self._learned(s, e, rows)
                    if drop:
                        scores = scores[:, self.ranked]
            if len(never):
                scores.index_fill_(1, never, inf)
            a, b = torch.searchsorted(ex_q, torch.tensor([s, e])).tolist()
            if b > a:
                scores[ex_q[a:b] - s, ex_g[a:b]] = inf
            yield s, e, scores

    def hits(self, s: int, e: int, top: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Whether each ranked gallery item (positions ``top`` of queries s..e, scores ``values``) is correct."""
        return (self.gy[top] == self.qy[s:e].unsqueeze(1)) & self.matchable[top] & torch.isfinite(values)

    def positive_ranks(self, s: int, e: int, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`sorted_ranks` of queries s..e (``scores``: their `blocks` over the ranked columns), no row sorted.

        A correct item's rank is 1 + the items before it in (score, position) order. Each row's scores
        go through a monotone map into ``M = G / BIN_SHARE`` bins of their own (`score_bins`: every float
        step is monotone, so a lower bin holds lower scores). In slices of rows (`SLICE_ELEMENTS`), a
        histogram counts the items of the bins that no correct item shares, and a lookup lists the items
        of the bins that correct items share ("near" items: a few a correct item); `near_ranks` orders
        each row's near items exactly (score, then position: the ties of `sorted_ranks`' stable sort)
        and adds a correct item's place among them to the items counted in lower bins. Scores crowded
        into a few bins make many near items: their sort costs at most a sort of the row. Near items are
        ordered once a row's slice has ended and at least a slice's worth of them is held."""
        rows, G = scores.shape
        q, j = self._positives(s, e)
        q, j = q - s, self.column[j]
        M = min(BIN_LIMIT, max(8, G // BIN_SHARE))
        step = max(1, min(SLICE_ELEMENTS // max(G, 1), BIN_LIMIT // M))
        scale, offset = bin_maps(q, scores[q, j], rows, M)
        unbase = MAGIC_BITS - (torch.arange(rows) % step * M).to(torch.int32)  # and the row's first bin
        bounds = torch.searchsorted(q, torch.arange(0, rows + step, step).clamp(max=rows)).tolist()
        buffer = torch.empty(min(step, rows) * G)
        rank = torch.zeros(len(q), dtype=torch.int64)
        flats, nears, counted = [], [], []  # near items and counted ranks since correct item ``done``
        done = held = 0
        for i, a in enumerate(range(0, rows, step)):
            b = min(rows, a + step)
            block, u, v = scores[a:b], bounds[i], bounds[i + 1]
            bins = score_bins(block, scale[a:b], offset[a:b], unbase[a:b], M, buffer)
            qs = q[u:v] - a
            key = bins.index_select(0, qs * G + j[u:v]).to(torch.int64)
            shared = torch.zeros((b - a) * M, dtype=torch.bool)
            shared.index_fill_(0, key, True)
            hist = torch.bincount(bins, minlength=(b - a) * M).masked_fill_(shared, 0)
            below = torch.cumsum(hist, 0)
            first_bin = qs * M
            # the row's items in lower bins that no correct item shares
            counted.append(
                below.index_select(0, key) - below.index_select(0, first_bin) + hist.index_select(0, first_bin)
            )
            flat = true_positions(torch.index_select(shared, 0, bins))
            nears.append(block.reshape(-1).index_select(0, flat))
            flats.append(flat + a * G)
            held += len(flat)
            if held >= step * G or b == rows:
                rank[done:v] = near_ranks(
                    torch.cat(flats), torch.cat(nears), q[done:v], j[done:v], torch.cat(counted), G
                )
                flats, nears, counted, done, held = [], [], [], v, 0
        # Each row's correct items in rank order, summed in the order sorted_ranks sums them.
        per_row = torch.bincount(q, minlength=rows)
        order = torch.sort(q * (G + 1) + rank).indices
        q, rank = q[order], rank[order]
        slot = torch.arange(len(q)) - (torch.cumsum(per_row, dim=0) - per_row)[q]
        precision = (slot + 1).to(torch.float64) / rank
        ap = torch.zeros(rows, dtype=torch.float64).index_add_(0, q, precision) / per_row
        first = torch.zeros(rows, dtype=torch.int64)  # 0 (and AP NaN) for a row without a correct item
        first[q[slot == 0]] = rank[slot == 0]
        return first, ap

    def _positives(self, s: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(query, gallery) index pairs of the correct items of queries s..e, by query then position."""
        q, at = equal_pairs(self.qy[s:e], self.gy[self.match_index], self.match_sorted)
        q, j = q + s, self.match_index[at]
        a, b = torch.searchsorted(self.ex_q, torch.tensor([s, e])).tolist()
        if b > a:
            keep = ~torch.isin(q * len(self.gy) + j, self.ex_flat[a:b])
            q, j = q[keep], j[keep]
        return q, j

    def _learned(self, s: int, e: int, rows: int) -> torch.Tensor:
        """``pair_score`` of queries s..e against the gallery: (e - s, gallery) float32. Under `mirrors`
        only the columns from s on are scored; those before s are the transposes the chunks above kept,
        and this chunk keeps its columns from e on for the chunks of ``rows`` queries below it."""
        if self.mirror is None:
            return self._scored(self.q[s:e], self.g)
        n = len(self.gy)
        fresh = self._scored(self.q[s:e], self.g[s:])
        for t in range(e, n, rows):  # clones: the block is rewritten (exclusions) once returned
            self.mirror.setdefault(t, []).append(fresh[:, t - s : min(t + rows, n) - s].clone())
        above = self.mirror.pop(s, [])
        return torch.cat([piece.T for piece in above] + [fresh], dim=1) if above else fresh

    def _scored(self, query: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
        """``pair_score`` of query rows against gallery rows, checked: (queries, gallery) finite float32."""
        assert self.pair_score is not None
        scores = self.pair_score(query, gallery)
        if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (len(query), len(gallery)):
            shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise BenchError(f"pair_score returned {shape}, expected ({len(query)}, {len(gallery)})")
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
