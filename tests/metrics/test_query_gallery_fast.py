"""The top-K / counted-rank query-gallery path (issue 25) equals the previous full-pass path exactly, and stays bounded.

`_qg_reference` is a frozen copy of the module before the rewrite. Every metric must be equal (==, not approx)
on random data, with exact score ties (duplicated embeddings, quantised coordinates), duplicated labels across
query and gallery, singleton classes, junk / distractors, camera rules, one set as query and gallery, and a
learned pair score.
"""

from __future__ import annotations

import pytest
import torch

from bench.metrics import query_gallery as qg
from tests.metrics import _qg_reference as old


def _data(seed: int, nq: int, ng: int, classes: int, ties: bool, dim: int = 6):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(ng, dim, generator=gen)
    q = torch.randn(nq, dim, generator=gen)
    if ties:  # coarse coordinates and copied rows: many exactly equal distances, across classes too
        g, q = torch.round(g * 2) / 2, torch.round(q * 2) / 2
        g[ng // 2 :] = g[: ng - ng // 2]
        q[: nq // 3] = g[: nq // 3]
    gy = torch.randint(0, classes, (ng,), generator=gen)
    qy = torch.randint(0, classes, (nq,), generator=gen)
    return q, qy, g, gy


def _same(a: dict[str, float], b: dict[str, float]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), (key, a[key], b[key])


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_query_gallery_equals_the_old_path(seed: int, ties: bool, distance: str) -> None:
    q, qy, g, gy = _data(seed, 70, 900, 40 if seed % 2 else 300, ties)
    for chunk in (None, 7):
        kw = dict(ks=(1, 2, 5, 30), distance=distance, chunk_size=chunk)
        _same(qg.query_gallery_metrics(q, qy, g, gy, **kw), old.query_gallery_metrics(q, qy, g, gy, **kw))


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_one_set_with_ids_equals_the_old_path(seed: int, ties: bool) -> None:
    _, _, x, y = _data(seed, 1, 1500, 200, ties)
    ids = torch.arange(len(y))
    y[:5] = 10_000 + torch.arange(5)  # singleton classes: skipped queries
    for chunk in (None, 64):
        kw = dict(ks=(1, 4, 16), query_ids=ids, gallery_ids=ids, chunk_size=chunk)
        _same(qg.query_gallery_metrics(x, y, x, y, **kw), old.query_gallery_metrics(x, y, x, y, **kw))


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_reid_equals_the_old_path(seed: int, ties: bool) -> None:
    q, qy, g, gy = _data(seed, 60, 800, 25, ties)
    gen = torch.Generator().manual_seed(100 + seed)
    qc, gc = torch.randint(0, 4, (60,), generator=gen), torch.randint(0, 4, (800,), generator=gen)
    gy = torch.where(torch.rand(800, generator=gen) < 0.1, torch.tensor(-1), gy)  # junk; label 0: distractors
    ids = dict(query_ids=torch.arange(60), gallery_ids=torch.arange(60, 860))
    ids["gallery_ids"][:10] = torch.arange(10)  # some queries are in the gallery
    for chunk in (None, 9):
        kw = dict(ks=(1, 5, 10), chunk_size=chunk, **ids)
        _same(qg.reid_metrics(q, qy, qc, g, gy, gc, **kw), old.reid_metrics(q, qy, qc, g, gy, gc, **kw))


def test_learned_pair_score_equals_the_old_path() -> None:
    q, qy, g, gy = _data(3, 50, 700, 30, True)
    w = torch.randn(6, 6, generator=torch.Generator().manual_seed(9))

    def score(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.round(torch.cdist(a @ w, b @ w) * 4) / 4  # coarse: ties

    kw = dict(ks=(1, 2, 8), pair_score=score, pair_cost=3)
    _same(qg.query_gallery_metrics(q, qy, g, gy, **kw), old.query_gallery_metrics(q, qy, g, gy, **kw))


@pytest.mark.parametrize("seed", range(5))
def test_top_ranked_equals_ranked_prefix_under_ties(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 40, (30, 1000), generator=gen).float()  # heavy ties, also at the k-th
    scores[:5, :] = 3.0  # rows of one value
    scores[5:8, 100:] = float("inf")  # fewer finite scores than k
    for k in (1, 7, 25, 200):
        for group in (None, 4, 16):
            assert torch.equal(qg.top_ranked(scores, k, group), qg.ranked_prefix(scores, k)), (k, group)


def test_chunks_hold_the_memory_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default chunks: RANK_COST (REID_COST for re-ID) x rows x gallery within BLOCK_ELEMENTS."""
    q, qy, g, gy = _data(0, 300, 2000, 50, False)
    seen: list[int] = []
    real = qg._Scorer.blocks

    def watched(self, rows, **kw):  # the real blocks, their sizes noted
        for s, e, block in real(self, rows, **kw):
            seen.append(block.numel())
            yield s, e, block

    monkeypatch.setattr(qg._Scorer, "blocks", watched)
    monkeypatch.setattr(qg, "BLOCK_ELEMENTS", 50_000)
    qg.query_gallery_metrics(q, qy, g, gy)
    assert max(seen) * qg.RANK_COST <= 50_000 and len(seen) > 1
    seen.clear()
    qg.reid_metrics(q, qy, torch.zeros(300, dtype=torch.int64), g, gy, torch.ones(2000, dtype=torch.int64))
    assert max(seen) * qg.REID_COST <= 50_000 and len(seen) > 1


def _reid_data(seed: int, nq: int, ng: int, classes: int, ties: bool):
    q, qy, g, gy = _data(seed, nq, ng, classes, ties)
    gen = torch.Generator().manual_seed(200 + seed)
    qc, gc = torch.randint(0, 3, (nq,), generator=gen), torch.randint(0, 3, (ng,), generator=gen)
    gy = torch.where(torch.rand(ng, generator=gen) < 0.15, torch.tensor(-1), gy)  # junk; label 0: distractors
    return q, qy, qc, g, gy, gc


@pytest.mark.parametrize("seed", range(3))
def test_reid_binned_ranks_under_crowded_and_collapsed_scores(seed: int) -> None:
    """Rows whose scores crowd into a few bins (collapsed embeddings: every distance equal; a few
    distinct values) take the sort; rows mixing both, ties at correct items' scores, junk, same-camera
    exclusions and a query in the gallery all give the reference's numbers."""
    q, qy, qc, g, gy, gc = _reid_data(seed, 40, 600, 12, ties=True)
    g[:300] = g[0]  # half the gallery one point: ties and crowded bins
    q[:10] = 0.0  # collapsed queries: every gallery item at one distance from some
    g[300:320] = torch.round(g[300:320])
    ids = dict(query_ids=torch.arange(40), gallery_ids=torch.arange(40, 640))
    ids["gallery_ids"][:5] = torch.arange(5)
    for chunk in (None, 3, 40):
        kw = dict(ks=(1, 5, 10), chunk_size=chunk, **ids)
        _same(qg.reid_metrics(q, qy, qc, g, gy, gc, **kw), old.reid_metrics(q, qy, qc, g, gy, gc, **kw))
    flat = torch.zeros_like(g)  # every distance equal: every row sorted
    _same(qg.reid_metrics(q, qy, qc, flat, gy, gc), old.reid_metrics(q, qy, qc, flat, gy, gc))


@pytest.mark.parametrize("ties", [False, True])
def test_reid_binned_ranks_in_slices_of_rows(monkeypatch: pytest.MonkeyPatch, ties: bool) -> None:
    """A chunk with more bins than float32 counts exactly is cut into row slices: same numbers."""
    q, qy, qc, g, gy, gc = _reid_data(7, 90, 700, 20, ties)
    want = old.reid_metrics(q, qy, qc, g, gy, gc, chunk_size=90)
    for limit in (1 << 22, 700, 1):  # one slice, a few rows a slice, one row a slice
        monkeypatch.setattr(qg, "BIN_LIMIT", limit)
        _same(qg.reid_metrics(q, qy, qc, g, gy, gc, chunk_size=90), want)


@pytest.mark.parametrize("share", [1, 4, 64])
def test_reid_binned_ranks_any_bin_width(monkeypatch: pytest.MonkeyPatch, share: int) -> None:
    """Wide or narrow bins change how many items are compared exactly, never the numbers (cosine too)."""
    monkeypatch.setattr(qg, "BIN_SHARE", share)
    for ties in (False, True):
        q, qy, qc, g, gy, gc = _reid_data(11, 50, 900, 30, ties)
        for distance in ("euclidean", "cosine"):
            kw = dict(ks=(1, 3), distance=distance)
            _same(qg.reid_metrics(q, qy, qc, g, gy, gc, **kw), old.reid_metrics(q, qy, qc, g, gy, gc, **kw))


@pytest.mark.parametrize("slice_elements", [1, 700, 1 << 19])
def test_reid_near_items_ordered_across_slices(monkeypatch: pytest.MonkeyPatch, slice_elements: int) -> None:
    """Slices of one row to all rows, near items ordered once a slice's worth is held (collapsed rows
    make a whole row near): the reference's numbers, ties, junk and same-camera rules included."""
    monkeypatch.setattr(qg, "SLICE_ELEMENTS", slice_elements)
    q, qy, qc, g, gy, gc = _reid_data(5, 45, 650, 15, ties=True)
    g[:200] = g[0]
    q[:6] = 0.0
    for chunk in (None, 11):
        kw = dict(ks=(1, 5), chunk_size=chunk)
        _same(qg.reid_metrics(q, qy, qc, g, gy, gc, **kw), old.reid_metrics(q, qy, qc, g, gy, gc, **kw))


def test_reid_signed_zeros_negative_and_subnormal_scores_keep_the_sort_order() -> None:
    """A learned score with -0.0 and +0.0 (equal: position order), negative values, and rows whose
    correct scores differ by a subnormal (their bin map overflows): the stable sort's numbers."""
    q, qy, qc, g, gy, gc = _reid_data(8, 40, 500, 10, ties=True)
    tiny = torch.finfo(torch.float32).tiny / 8  # a subnormal step

    def signed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raw = torch.round(torch.cdist(a, b)) - 2  # few values, negative ones
        zero = raw == 0
        parity = (torch.arange(b.shape[0]) % 2 == 0).expand_as(raw)
        return torch.where(zero & parity, torch.tensor(-0.0), raw)

    def subnormal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.round(torch.cdist(a, b)) * tiny

    for score in (signed, subnormal):
        kw = dict(ks=(1, 3), pair_score=score)
        _same(qg.reid_metrics(q, qy, qc, g, gy, gc, **kw), old.reid_metrics(q, qy, qc, g, gy, gc, **kw))


def test_reid_gallery_of_junk_only_is_the_no_match_error() -> None:
    q, qy, qc, g, gy, gc = _reid_data(1, 5, 30, 4, ties=False)
    with pytest.raises(qg.BenchError, match="none of the 5 queries"):
        qg.reid_metrics(q, qy, qc, g, torch.full_like(gy, -1), gc)
