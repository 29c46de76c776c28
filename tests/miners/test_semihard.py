"""Semi-hard mining (`bench.miners.semihard`) against a loop reference."""

from __future__ import annotations

import itertools

import pytest
from _triplet_refs import _as_set, _pk, distance_matrix

from bench.registry import build_miner


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_semihard_nearest_matches_loop_reference(distance):
    margin = 0.3
    for seed, (p, k) in enumerate([(5, 4), (3, 2), (8, 3), (1, 5)]):
        x, y = _pk(p, k, 6, seed)
        x[1] = x[2]  # a tie
        got = build_miner("semihard", semantics="nearest", margin=margin, distance=distance)(x, y)
        d = distance_matrix(x, distance=distance)
        expected = set()
        for a, pos in itertools.product(range(len(y)), repeat=2):
            if a == pos or y[a] != y[pos]:
                continue
            negs = [n for n in range(len(y)) if y[n] != y[a]]
            if not negs:
                continue
            semi = [n for n in negs if 0 < d[a, n] - d[a, pos] <= margin]
            pool = semi or negs
            expected.add((a, pos, min(pool, key=lambda n: (float(d[a, n]), n))))
        assert _as_set(got) == expected
        assert len(got[0]) == len(expected)


def test_semihard_nearest_is_a_subset_of_all_semihard_or_a_fallback():
    x, y = _pk(6, 4, 8, 7)
    nearest = _as_set(build_miner("semihard", semantics="nearest", margin=0.5)(x, y))
    every = _as_set(build_miner("semihard", margin=0.5)(x, y))
    d = distance_matrix(x)
    for a, p, n in nearest - every:  # fallbacks: no semi-hard negative exists for this pair
        assert not any((a, p, m) in every for m in range(len(y)))
        assert d[a, n] == min(d[a, m] for m in range(len(y)) if y[m] != y[a])
    assert nearest & every
