"""One rule for `run`, `run --cells` and `merge`: a cell the results must hold without a result is exit 1.

With --cells the cells asked for are the ones a job must hold; the plan's other cells are other jobs', so a
job that completes its cells exits 0 without a "no result" warning. A merge answers for every planned cell:
one no job ran, or one a job ran whose every trial failed, is exit 1 and a labelled row (real runs, real stores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _shared import RUNNER_TINY

from bench.cli import main
from bench.reports import leaderboard, source

pytestmark = pytest.mark.slow

DIVERGING = "contrastive-diverging+none"  # every trial diverges (RUNNER_TINY)


def _job(root: Path, name: str, protocol: Path, cells: str, data_root: Path) -> tuple[int, Path]:
    job = root / name
    argv = ["run", str(protocol), "--cells", cells, "--results-dir", str(job / "results")]
    argv += ["--storage", f"sqlite:///{job / 'optuna.db'}", "--tracking-uri", str(job / "mlruns")]
    code = main([*argv, "--data-root", str(data_root), "--threads", "1", "--quiet"])
    return code, job / "results"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, data_root):
    root = tmp_path_factory.mktemp("cells-rule")
    protocol = root / "tiny.yaml"
    protocol.write_text(RUNNER_TINY.replace("ITERATIONS", "10"))
    return root, {
        name: _job(root, name, protocol, cells, data_root)
        for name, cells in (("a", "triplet+none"), ("d", f"triplet+batch_hard,{DIVERGING}"))
    }


def test_a_job_that_completes_its_cells_exits_0_without_a_no_result_warning(jobs, capsys):
    _, runs = jobs
    code, results = runs["a"]
    assert code == 0
    res = source.load(results / "tiny")
    board = leaderboard.build(res)
    assert board.missing == {} and not any("no result" in w for w in board.warnings)
    assert board.job and "1 of the 3 planned cells" in board.job
    text = leaderboard.text(board)
    assert "triplet+batch_hard" not in text and DIVERGING not in text  # other jobs' cells: no row
    assert main(["leaderboard", str(results / "tiny"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "no result" not in err and "warning" not in err.lower()


def test_a_cell_asked_for_without_a_result_is_exit_1(jobs, data_root, capsys):
    root, runs = jobs
    code, results = runs["d"]
    assert code == 1
    assert json.loads((results / "tiny" / "manifest.json").read_text())["cells"] == ["triplet+batch_hard", DIVERGING]
    board = leaderboard.build(source.load(results / "tiny"))
    assert list(board.missing) == [DIVERGING] and "triplet+none" not in leaderboard.text(board)
    # rerun (nothing to train): the same answer, named on stderr with its reason
    code, _ = _job(root, "d", root / "tiny.yaml", f"triplet+batch_hard,{DIVERGING}", data_root)
    err = capsys.readouterr().err
    assert code == 1 and f"1 of 2 of the cell(s) asked for (--cells) have no result ({DIVERGING}: every" in err, err


def test_merge_exits_1_with_a_labelled_row_for_each_planned_cell_without_a_result(jobs, capsys):
    root, runs = jobs
    a, d = (runs[k][1] for k in "ad")
    capsys.readouterr()
    # every cell ran, one of them without a result (its every trial failed in job d)
    assert main(["merge", str(root / "all"), str(a), str(d)]) == 1
    err = capsys.readouterr().err
    assert f"1 of 3 planned cell(s) have no result ({DIVERGING}: every trial failed" in err, err
    md = (root / "all" / "leaderboard.md").read_text() if (root / "all" / "leaderboard.md").exists() else ""
    board = leaderboard.build(source.load(root / "all"))
    assert list(board.missing) == [DIVERGING] and board.job is None
    assert f"{DIVERGING} (no result)" in leaderboard.text(board)
    assert md == ""  # merge writes the tables; the leaderboard command writes the pages
    # a planned cell no job ran: exit 1, and the row says so
    assert main(["merge", str(root / "part"), str(a)]) == 1
    err = capsys.readouterr().err
    assert "2 of 3 planned cell(s) have no result" in err and f"{DIVERGING}: not run: no merged job ran it" in err
    manifest = json.loads((root / "part" / "manifest.json").read_text())
    assert manifest["not_run"] == {c: "no merged job ran it" for c in ("triplet+batch_hard", DIVERGING)}
    assert main(["leaderboard", str(root / "part"), "--quiet"]) == 0
    md = (root / "part" / "leaderboard.md").read_text()
    assert f"| - | `{DIVERGING}` | 0 |" in md and "no result: not run: no merged job ran it" in md


def test_a_job_into_a_folder_holding_other_cells_is_refused_and_the_tables_kept(jobs, data_root, capsys):
    """`run --cells` rewrites its folder's tables with its own cells alone: into a folder that holds others (a
    finished sweep's, another job's) it is refused in one line before anything is written."""
    root, runs = jobs
    _, results = runs["a"]  # holds triplet+none
    before = {p.name: p.read_bytes() for p in (results / "tiny").glob("*.csv")}
    argv = ["run", str(root / "tiny.yaml"), "--cells", "triplet+batch_hard", "--results-dir", str(results)]
    argv += ["--storage", f"sqlite:///{root / 'a' / 'optuna.db'}", "--tracking-uri", str(root / "a" / "mlruns")]
    assert main([*argv, "--data-root", str(data_root), "--threads", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds the tables of 1 cell(s) outside this job (triplet+none)" in err[0], err
    assert {p.name: p.read_bytes() for p in (results / "tiny").glob("*.csv")} == before
