"""The own pair losses against PML (`bench.crosscheck.losses`): equal values and gradients."""

from __future__ import annotations

import pytest
from _pair_loss_refs import OWN

from bench.crosscheck import TOLERANCE
from bench.crosscheck.losses import checks, run, specs


@pytest.mark.parametrize("spec", specs(), ids=lambda s: s.name)
def test_equal_to_pml(spec):
    result = run(spec, cases=21, seed=1)
    assert result.cases >= 18, result.note  # nearly every case compared, not skipped
    assert result.max_rel_value <= TOLERANCE and result.max_rel_grad <= TOLERANCE, result


def test_checks_cover_every_own_loss_and_carry_pml_settings():
    results = list(checks(cases=2, seed=3))
    assert {r.name.split(" ")[0] for r in results} == set(OWN)
    assert all(r.passed and r.pml_settings for r in results)
