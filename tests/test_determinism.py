"""Reruns give the same weights at two threads (issue 12, determinism).

The smoke protocol's quadruplet+margohnm cell gave three different trial-0
values in three fresh runs: the backward of 2-D advanced indexing
(``dist[q.i, q.j]``, an ``index_put_`` with accumulation) summed the gradients
of repeated pairs in a thread-timing order. The gathers now go through
``index_select`` (`bench.losses.base.flat_gather`). `tests/test_smoke.py` runs
every cell of the smoke protocol twice and compares whole tables; these tests
train the quadruplet cells twice at two threads, where the old code differed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# smoke cells trained for real, twice each
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "protocols" / "omniglot-smoke.yaml"


@pytest.mark.parametrize("cell", ["quadruplet+margohnm", "quadruplet+none", "quadruplet+hardest_of_pool"])
def test_quadruplet_cells_repeat_exactly_at_two_threads(cell: str, data_root: Path) -> None:
    """Two threads: where the summation order of the old 2-D indexing changed from run to run."""
    from bench.plan import plan
    from bench.protocol import load_protocol
    from bench.sweep.prepare import prepare
    from bench.sweep.tuning import final_config
    from bench.training import train

    protocol = load_protocol(SMOKE)
    [target] = [c for c in plan(protocol).cells if c.id == cell]
    params = {k: (v["low"] + v["high"]) / 2 for k, v in target.search_space.items()}
    prepared = prepare(protocol, str(data_root))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        weights = []
        for _ in range(2):
            model = train(final_config(protocol, target, params, 0), prepared.train).model
            weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(weights[0], weights[1])
