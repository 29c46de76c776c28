"""The triplet loss and miners against PML (`bench.crosscheck.triplets`), and that the check has teeth."""

from __future__ import annotations

import random

from bench.crosscheck import TOLERANCE
from bench.crosscheck import triplets as crosscheck
from bench.registry import build_loss


def test_crosscheck_against_pml_passes():
    results = list(crosscheck.checks(cases=30, seed=0))
    assert [r.name for r in results] == [c.name for c in crosscheck.COMBOS]
    for r in results:
        assert r.cases == 30
        assert r.passed, f"{r.name}: value {r.max_rel_value}, grad {r.max_rel_grad} {r.note}"


def test_crosscheck_detects_a_wrong_margin():
    """The comparison has teeth: PML with another margin is reported as different."""
    from pytorch_metric_learning.losses import TripletMarginLoss

    case = crosscheck.make_case(1, random.Random(3))  # a PK layout
    dist, reducer = crosscheck._pml_parts(case)
    own = build_loss(
        "triplet",
        margin=case.margin,
        distance=case.distance,
        normalize=case.normalize,
        soft=case.soft,
        reduction=case.reduction,
    )(case.embeddings, case.labels)
    same = TripletMarginLoss(margin=case.margin, smooth_loss=case.soft, distance=dist, reducer=reducer)
    other = TripletMarginLoss(margin=case.margin + 0.3, smooth_loss=case.soft, distance=dist, reducer=reducer)
    assert crosscheck.rel_diff(own, same(case.embeddings, case.labels)) <= TOLERANCE
    assert crosscheck.rel_diff(own, other(case.embeddings, case.labels)) > 1e-3
