"""Reruns give the same tables (issue 12, determinism).

The smoke protocol's quadruplet+margohnm cell gave three different trial-0
values in three fresh runs: the backward of 2-D advanced indexing
(``dist[q.i, q.j]``, an ``index_put_`` with accumulation) summed the
gradients of repeated pairs in a thread-timing order. The gathers now go
through ``index_select`` (`bench.losses.base.flat_gather`). These tests
run every cell of the smoke protocol twice and compare whole tables, and
train the quadruplet cells twice at two threads, where the old code differed.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.cli import main

# whole omniglot-smoke sweeps, trained for real
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "protocols" / "omniglot-smoke.yaml"
TABLES = ("finals.csv", "trials.csv", "summary.csv")
TIMING = ("wall_time_s",)  # the only columns allowed to differ (bench.sweep.tables.TIMING_COLUMNS)


def _short_smoke(tmp_path: Path) -> Path:
    """The smoke protocol's cells, every one, with a smaller budget: one trial and one final seed a cell, 20
    iterations a run instead of 40 (MargOHNM still leaves its warm-up, the offline miner still refreshes).
    A second trial or seed of a cell takes the same code path with other numbers; what differed between
    reruns was the path (the summation order of a backward pass), so every cell is trained once a sweep."""
    text = SMOKE.read_text()
    for old, new in (
        ("iterations: 40", "iterations: 20"),
        ("refresh_every: 20", "refresh_every: 10"),
        ("warmup_iterations: 10", "warmup_iterations: 5"),
        ("trials: 2", "trials: 1"),
        ("seeds: 2", "seeds: 1"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "omniglot-smoke.yaml"
    path.write_text(text)
    return path


def _run(protocol: Path, work: Path, data_root: Path) -> dict[str, pd.DataFrame]:
    code = main(
        [
            "run",
            str(protocol),
            "--results-dir",
            str(work / "results"),
            "--data-root",
            str(data_root),
            "--storage",
            f"sqlite:///{work / 'optuna.db'}",
            "--tracking-uri",
            str(work / "mlflow.db"),
            "--threads",
            "1",
            "--quiet",
        ]
    )
    assert code == 0
    folder = work / "results" / "omniglot-smoke"
    return {name: pd.read_csv(folder / name).drop(columns=list(TIMING), errors="ignore") for name in TABLES}


def test_every_smoke_cell_twice_gives_identical_tables(tmp_path: Path, data_root: Path) -> None:
    protocol = _short_smoke(tmp_path)
    first = _run(protocol, tmp_path / "a", data_root)
    second = _run(protocol, tmp_path / "b", data_root)
    assert len(first["summary.csv"]) == 13 and (first["finals.csv"]["state"] == "COMPLETE").all()
    for name in TABLES:
        pd.testing.assert_frame_equal(first[name], second[name], check_exact=True, obj=name)


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
