"""The shipped smoke protocol end to end: every own loss and miner on real Omniglot, run twice (issue 12).

This is the check that the whole path (protocol -> plan -> trials -> finals ->
tables -> reports) works for every registry entry the protocol names, not only
for the few cells the faster runner tests use, and that a rerun gives the same
tables. The smoke protocol's quadruplet+margohnm cell once gave three different
trial-0 values in three fresh runs: the backward of 2-D advanced indexing
(``dist[q.i, q.j]``, an ``index_put_`` with accumulation) summed the gradients
of repeated pairs in a thread-timing order; the gathers now go through
``index_select`` (`bench.losses.base.flat_gather`).

One sweep goes through ``dmlbench run`` in a process of its own, as a user runs
it, then to the leaderboard and the regression check; the other through
``bench.cli.main`` in this process. Their tables must be equal to the bit:
the same code in another process, with its data cache built by the first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.cli import main
from bench.plan import plan
from bench.protocol import load_protocol
from bench.sweep.tables import read

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


def _run_args(protocol: Path, work: Path, data_root: Path) -> list[str]:
    return [
        "run",
        str(protocol),
        "--results-dir",
        str(work / "results"),
        "--storage",
        f"sqlite:///{work / 'optuna.db'}",
        "--tracking-uri",
        str(work / "mlflow.db"),
        "--data-root",
        str(data_root),
        "--threads",
        "1",
        "--quiet",
    ]


def _dmlbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "bench.cli", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=900,
    )


def _tables(work: Path) -> dict[str, pd.DataFrame]:
    folder = work / "results" / "omniglot-smoke"
    return {name: pd.read_csv(folder / name).drop(columns=list(TIMING), errors="ignore") for name in TABLES}


def test_every_smoke_cell_runs_reports_and_reruns_to_identical_tables(tmp_path: Path, data_root: Path) -> None:
    shipped = load_protocol(SMOKE)
    cells = [c.id for c in plan(shipped).cells]
    losses = {c.split("+")[0] for c in cells}
    miners = {c.split("+")[1] for c in cells}
    # the protocol's promise: every own loss and every own miner
    assert {"contrastive", "triplet", "lifted_structure", "npair", "infonce"} <= losses
    assert any(loss.startswith("quadruplet") for loss in losses)
    assert {"batch_all", "batch_hard", "semihard", "hard", "offline", "hardest_of_pool", "margohnm"} <= miners

    protocol_path = _short_smoke(tmp_path)
    protocol = load_protocol(protocol_path)
    assert [c.id for c in plan(protocol).cells] == cells
    run = _dmlbench(*_run_args(protocol_path, tmp_path / "a", data_root), cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:]
    table = run.stdout[run.stdout.index("rank  ") :]
    results = tmp_path / "a" / "results" / protocol.name
    tables = read(results)
    finals, summary = tables["finals"], tables["summary"]
    assert tables["manifest"]["protocol_hash"] == protocol.hash
    assert sorted(summary["cell"]) == sorted(cells)  # none refused by the budget audit
    assert len(finals) == len(cells) * len(protocol.final_seeds)
    assert (finals["state"] == "COMPLETE").all(), finals[finals["state"] != "COMPLETE"][["cell", "reason"]]
    assert finals["map_at_r"].between(0, 1).all()
    for cell in cells:  # every cell ranked in the printed table
        assert re.search(rf"^\s*\d+\s+{re.escape(cell)}\s", table, re.M), table

    board = _dmlbench("leaderboard", str(results), "--quiet", cwd=tmp_path)
    assert board.returncode == 0, board.stdout
    assert all(f"`{c}`" in (results / "leaderboard.md").read_text() for c in cells)
    same = _dmlbench("regress", "--baseline", str(results), "--current", str(results), "--json", "r.json", cwd=tmp_path)
    assert same.returncode == 0, same.stdout
    statuses = {row["cell"]: row["status"] for row in json.loads((tmp_path / "r.json").read_text())["cells"]}
    assert statuses == {c: "same" for c in cells}

    # the rerun, in this process: the same tables to the bit
    assert main(_run_args(protocol_path, tmp_path / "b", data_root)) == 0
    first, second = _tables(tmp_path / "a"), _tables(tmp_path / "b")
    for name in TABLES:
        pd.testing.assert_frame_equal(first[name], second[name], check_exact=True, obj=name)
