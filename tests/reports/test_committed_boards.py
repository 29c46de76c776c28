"""Every committed leaderboard is what the code writes now from its folder's tables.

A committed `leaderboard.md` that the current code would write differently is
a stale answer beside the results it claims to show (a column added since, a
label changed); regenerate it with `dmlbench leaderboard results/<name>`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import main

ROOT = Path(__file__).resolve().parents[2]
BOARDS = sorted(p.parent for p in (ROOT / "results").glob("*/leaderboard.md"))


def test_the_committed_results_have_leaderboards():
    assert len(BOARDS) >= 4


@pytest.mark.parametrize("folder", BOARDS, ids=[b.name for b in BOARDS])
def test_a_committed_leaderboard_is_what_the_code_writes_now(folder: Path, tmp_path: Path, capsys):
    md, html = tmp_path / "leaderboard.md", tmp_path / "leaderboard.html"
    assert main(["leaderboard", str(folder), "--markdown", str(md), "--html", str(html), "--quiet"]) == 0
    capsys.readouterr()
    written = (folder / "leaderboard.md").read_text()
    assert md.read_text() == written, f"{folder.name}/leaderboard.md is stale: run `dmlbench leaderboard {folder}`"
    assert html.read_text() == (folder / "leaderboard.html").read_text()
