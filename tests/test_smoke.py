"""The shipped smoke protocol end to end, as `make demo` runs it: every own loss and miner on real Omniglot.

This is the check that the whole path (protocol -> plan -> trials -> finals ->
tables -> reports) works for every registry entry the protocol names, not only
for the few cells the faster runner tests use.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.plan import plan
from bench.protocol import load_protocol
from bench.sweep.tables import read

# whole omniglot-smoke sweeps, trained for real
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "protocols" / "omniglot-smoke.yaml"


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


def test_smoke_protocol_runs_every_cell_and_reports(tmp_path: Path, data_root: Path) -> None:
    protocol = load_protocol(SMOKE)
    cells = [c.id for c in plan(protocol).cells]
    losses = {c.split("+")[0] for c in cells}
    miners = {c.split("+")[1] for c in cells}
    # the protocol's promise: every own loss and every own miner
    assert {"contrastive", "triplet", "lifted_structure", "npair", "infonce"} <= losses
    assert any(loss.startswith("quadruplet") for loss in losses)
    assert {"batch_all", "batch_hard", "semihard", "hard", "offline", "hardest_of_pool", "margohnm"} <= miners

    run = _dmlbench(
        "run",
        str(SMOKE),
        "--results-dir",
        "results",
        "--storage",
        "sqlite:///runs/optuna.db",
        "--tracking-uri",
        "runs/mlflow.db",
        "--data-root",
        str(data_root),
        "--quiet",
        "--threads",
        "1",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    table = run.stdout[run.stdout.index("rank  ") :]
    tables = read(tmp_path / "results" / protocol.name)
    finals, summary = tables["finals"], tables["summary"]
    assert tables["manifest"]["protocol_hash"] == protocol.hash
    assert sorted(summary["cell"]) == sorted(cells)  # none refused by the budget audit
    assert len(finals) == len(cells) * len(protocol.final_seeds)
    assert (finals["state"] == "COMPLETE").all(), finals[finals["state"] != "COMPLETE"][["cell", "reason"]]
    assert finals["map_at_r"].between(0, 1).all()
    for cell in cells:  # every cell ranked in the printed table
        assert re.search(rf"^\s*\d+\s+{re.escape(cell)}\s", table, re.M), table

    results = tmp_path / "results" / protocol.name
    board = _dmlbench("leaderboard", str(results), "--quiet", cwd=tmp_path)
    assert board.returncode == 0, board.stdout
    assert all(f"`{c}`" in (results / "leaderboard.md").read_text() for c in cells)
    same = _dmlbench("regress", "--baseline", str(results), "--current", str(results), "--json", "r.json", cwd=tmp_path)
    assert same.returncode == 0, same.stdout
    statuses = {row["cell"]: row["status"] for row in json.loads((tmp_path / "r.json").read_text())["cells"]}
    assert statuses == {c: "same" for c in cells}
