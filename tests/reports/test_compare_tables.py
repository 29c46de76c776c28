"""scripts/compare_tables.py on the committed tables: omniglot-quick as the "cheap" protocol of omniglot-standard."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from bench.reports import source

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("compare_tables", ROOT / "scripts" / "compare_tables.py")
assert SPEC is not None and SPEC.loader is not None
compare_tables = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare_tables)

QUICK, STANDARD = ROOT / "results" / "omniglot-quick", ROOT / "results" / "omniglot-standard"
REFERENCE = ROOT / "results" / "omniglot-standard@dc3c2141bac6"
CLAIMS = ROOT / "protocols" / "claims" / "omniglot-standard.yaml"


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return [
        str(QUICK),
        str(STANDARD),
        "--claims",
        str(CLAIMS),
        "--bootstrap",
        "40",
        "--out",
        str(tmp_path / "c.md"),
        *extra,
    ]


def test_the_report_holds_tau_verdicts_and_compute_recomputed_here(tmp_path, capsys):
    assert compare_tables.main(_argv(tmp_path, "--reference", str(REFERENCE))) == 0
    report = (tmp_path / "c.md").read_text()
    assert capsys.readouterr().out == report
    quick, standard = source.load(QUICK), source.load(STANDARD)
    cells = sorted(set(quick.cells) & set(standard.cells))
    a = [np.mean(quick.values(c, "map_at_r")) for c in cells]
    b = [np.mean(standard.values(c, "map_at_r")) for c in cells]
    assert f"cheap against full: **{kendalltau(a, b).statistic:.3f}**" in report
    assert "Two full runs" in report and "12 common cells" in report
    claim_rows = [line for line in report.splitlines() if line.startswith("| `") and line.count("|") == 5]
    assert len(claim_rows) == len(compare_tables.claims.parse(CLAIMS).claims)
    iterations = sum(int(t["iterations"].sum()) for t in (quick.trials, quick.finals))
    assert f"{iterations:,} against" in report


def test_check_fails_when_a_figure_is_missed_and_a_bad_folder_is_exit_2(tmp_path, capsys):
    assert compare_tables.main(_argv(tmp_path, "--check")) == 1  # 35.7% of the iterations: over 25%
    assert compare_tables.main([str(tmp_path / "absent"), str(STANDARD)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
