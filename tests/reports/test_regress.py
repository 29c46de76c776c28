"""`dmlbench regress` on real tiny sweeps: a caught regression, a tolerated drop, refusals."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _sweeps import CELLS, run_sweep, sweep, sweep_base, sweep_copy  # noqa: F401  (fixtures)
from scipy import stats as st

from bench.cli import main
from bench.reports.regress import classify
from bench.stats import welch


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dmlbench: error: "), err
    return err[0]


def _shift(results: Path, cells: list[str], amount: float, keep_seeds: int | None = None) -> pd.DataFrame:
    """The documented transformation: lower the primary metric of `cells` by `amount` (optionally drop seeds)."""
    finals = pd.read_csv(results / "finals.csv")
    rows = finals["cell"].isin(cells)
    finals.loc[rows, "map_at_r"] -= amount
    if keep_seeds is not None:
        extra = rows & (finals.groupby("cell").cumcount() >= keep_seeds)
        finals = finals[~extra]
    finals.to_csv(results / "finals.csv", index=False)
    return finals


def _report(path: Path) -> dict[str, dict]:
    return {c["cell"]: c for c in json.loads(path.read_text())["cells"]}


def test_welch_is_scipy_welch() -> None:
    a, b = [0.30, 0.33, 0.31], [0.36, 0.35, 0.39, 0.37]
    d = welch(a, b)
    ref = st.ttest_ind(a, b, equal_var=False, alternative="less")
    ci = st.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d.p_less == pytest.approx(ref.pvalue)
    assert d.p_greater == pytest.approx(1 - ref.pvalue)
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high))
    assert d.diff == pytest.approx(np.mean(a) - np.mean(b))
    single = welch([0.3], b)
    assert not single.testable and math.isnan(single.p_less)


def test_nan_and_zero_variance_rules_around_scipy() -> None:
    """What scipy leaves undecided, decided once for every report: NaN seeds dropped, identical seeds certain."""
    from bench.stats import paired, t_interval

    d = welch([0.30, math.nan, 0.33, 0.31], [0.36, 0.35, 0.39, 0.37])
    clean = welch([0.30, 0.33, 0.31], [0.36, 0.35, 0.39, 0.37])
    assert d.n_a == 3 and (d.low, d.high) == pytest.approx((clean.low, clean.high))
    same = welch([0.5, 0.5, 0.5], [0.4, 0.4])  # scipy alone gives NaN here
    assert (same.low, same.high, same.p_greater, same.p_less) == (pytest.approx(0.1), pytest.approx(0.1), 0.0, 1.0)
    iv = t_interval([0.5, 0.5, 0.5])
    assert (iv.mean, iv.low, iv.high, iv.n) == (0.5, 0.5, 0.5, 3)
    p = paired([0.5, 0.6, 0.7], [0.4, 0.5, 0.6])  # +0.1 at every seed: certain, though Welch is not
    assert p.test == "paired" and p.p_greater == 0.0 and welch([0.5, 0.6, 0.7], [0.4, 0.5, 0.6]).p_greater > 0.05


def test_rule_needs_both_size_and_significance() -> None:
    base = [0.50, 0.52, 0.51]
    assert classify(base, [0.40, 0.41, 0.42], 0.01, 0.05)[0] == "worse"
    assert classify(base, [0.505, 0.515, 0.505], 0.01, 0.05)[0] == "same"  # tiny drop
    assert classify(base, [0.20, 0.75, 0.40], 0.01, 0.05)[0] == "worse?"  # large but noisy
    assert classify(base, [0.40], 0.01, 0.05)[0] == "worse?"  # one seed: never significant
    assert classify(base, [0.60, 0.61, 0.62], 0.01, 0.05)[0] == "better"


def test_same_results_do_not_regress(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep), "--json", str(out)]) == 0
    cells = _report(out)
    assert set(cells) == set(CELLS) and {c["status"] for c in cells.values()} == {"same"}
    assert {c["test"] for c in cells.values()} == {"paired"} and {c["change"]["diff"] for c in cells.values()} == {0}
    assert json.loads(out.read_text())["exit_code"] == 0


def test_regression_is_caught(
    sweep: Path, sweep_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    finals = pd.read_csv(sweep / "finals.csv")
    victim = finals.groupby("cell")["map_at_r"].mean().idxmax()
    sd = finals.loc[finals["cell"] == victim, "map_at_r"].std(ddof=1)
    amount = max(0.05, 6 * sd)  # well past the tolerance and past the seed noise
    _shift(sweep_copy, [victim], amount)
    out = tmp_path / "r.json"
    code = main(["regress", "--baseline", str(sweep), "--current", str(sweep_copy), "--json", str(out)])
    assert code == 1
    cells = _report(out)
    assert cells[victim]["status"] == "worse"
    assert cells[victim]["change"]["diff"] == pytest.approx(-amount)
    assert cells[victim]["change"]["p_drop"] < 0.05
    assert all(c["status"] == "same" for k, c in cells.items() if k != victim)
    assert json.loads(out.read_text())["regressions"] == [victim]
    printed = capsys.readouterr().out
    assert victim in printed and "1 regression(s)" in printed


def test_drop_within_tolerance_passes(sweep: Path, sweep_copy: Path, tmp_path: Path) -> None:
    _shift(sweep_copy, list(CELLS), 0.005)
    out = tmp_path / "r.json"
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep_copy), "--json", str(out)]) == 0
    assert {c["status"] for c in _report(out).values()} == {"same"}
    # With a tolerance below the drop, the test over seeds decides: a drop no larger than the
    # seed noise stays 'worse?' (no failure); the exit status follows the significant ones.
    code = main(
        ["regress", "--baseline", str(sweep), "--current", str(sweep_copy), "--tolerance", "0.001", "--json", str(out)]
    )
    cells = _report(out).values()
    assert {c["status"] for c in cells} <= {"worse", "worse?"}
    assert code == (1 if any(c["status"] == "worse" for c in cells) else 0)
    assert all((c["status"] == "worse") == (c["change"]["p_drop"] < 0.05) for c in cells)


def test_single_seed_drop_is_inconclusive(
    sweep: Path, sweep_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One final seed on both sides: no variance, so a drop beyond the tolerance is `worse?` and passes."""
    baseline = tmp_path / "baseline" / sweep.name
    shutil.copytree(sweep, baseline)
    _shift(baseline, [CELLS[0]], 0.0, keep_seeds=1)
    _shift(sweep_copy, [CELLS[0]], 0.2, keep_seeds=1)
    out = tmp_path / "r.json"
    assert main(["regress", "--baseline", str(baseline), "--current", str(sweep_copy), "--json", str(out)]) == 0
    cell = _report(out)[CELLS[0]]
    assert cell["status"] == "worse?" and cell["current"]["n_seeds"] == 1 and cell["change"]["p_drop"] is None
    assert cell["test"] == "paired" and cell["problems"] == []
    # Against the full baseline, the current's two lost seeds fail the check whatever the statistics say.
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep_copy), "--json", str(out)]) == 1
    cell = _report(out)[CELLS[0]]
    assert cell["status"] == "seeds missing" and cell["test"] == "Welch"
    seeds = sorted(pd.read_csv(sweep / "finals.csv").query("cell == @CELLS[0]")["seed"])
    assert cell["problems"] == [f"seed {s} missing" for s in seeds[1:]]
    assert f"{CELLS[0]}: seed {seeds[1]} missing" in capsys.readouterr().out


def test_missing_cell_fails_unless_allowed(sweep: Path, sweep_copy: Path, tmp_path: Path) -> None:
    finals = pd.read_csv(sweep_copy / "finals.csv")
    finals[finals["cell"] != CELLS[1]].to_csv(sweep_copy / "finals.csv", index=False)
    out = tmp_path / "r.json"
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep_copy), "--json", str(out)]) == 1
    assert _report(out)[CELLS[1]]["status"] == "missing"
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep_copy), "--allow-missing"]) == 0
    # Reversed, the cell is new in the current run, which never fails.
    assert main(["regress", "--baseline", str(sweep_copy), "--current", str(sweep), "--json", str(out)]) == 0
    assert _report(out)[CELLS[1]]["status"] == "new"


def test_other_protocol_is_refused(
    sweep: Path, sweep_base: Path, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same protocol name with fewer iterations (and one cell) is another protocol: never compared."""
    other = run_sweep(sweep_base, "short", 10, data_root, losses="    - {name: contrastive, miners: [none]}")
    capsys.readouterr()
    assert main(["regress", "--baseline", str(sweep), "--current", str(other)]) == 2
    assert "cannot compare" in _error_line(capsys)


def test_other_split_is_refused(sweep: Path, sweep_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Same protocol hash, other data (e.g. a changed dataset file): the fingerprints tell, and it is refused."""
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    manifest["fingerprints"]["folds"][0]["validation"] = "f" * 64
    (sweep_copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep_copy)]) == 2
    assert "fold 0 validation fingerprints differ" in _error_line(capsys)


def test_unusable_inputs(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regress", "--baseline", str(tmp_path / "none"), "--current", str(sweep)]) == 2
    assert "does not exist" in _error_line(capsys)
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep), "--alpha", "1.5"]) == 2
    assert "--alpha" in _error_line(capsys)
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep), "--metric", "accuracy"]) == 2
    assert "no metric 'accuracy'" in _error_line(capsys)
    for wide in ("1", "5"):  # a drop of MAP@R (in [0, 1]) can never exceed it: a check that always passes
        assert main(["regress", "--baseline", str(sweep), "--current", str(sweep), "--tolerance", wide]) == 2
        assert "no drop could fail the check" in _error_line(capsys)


def test_two_different_protocols_are_named_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    """Results of two protocols (other names, other shared settings) are refused as two protocols, not as versions
    of the baseline's protocol with other shared settings."""
    repo = Path(__file__).resolve().parents[2]
    quick, standard = repo / "results" / "omniglot-quick", repo / "results" / "omniglot-standard"
    assert main(["regress", "--baseline", str(quick), "--current", str(standard)]) == 2
    line = _error_line(capsys)
    assert f"{quick} holds protocol omniglot-quick and {standard} protocol omniglot-standard" in line, line
    assert "two different protocols" in line and "versions of" not in line.replace("not versions of one", "")


def test_intervals_never_reach_beyond_the_metrics_range(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seeds near 1.0: the t interval's high bound passes 1; regress and summary.csv clip it, marked, mean kept."""
    from bench.reports.leaderboard.cells import CLIP_NOTE
    from bench.sweep.frames import t_interval as summary_interval

    baseline = tmp_path / "baseline" / sweep.name
    shutil.copytree(sweep, baseline)
    finals = pd.read_csv(baseline / "finals.csv")
    rows = finals["cell"] == CELLS[0]
    finals.loc[rows, "map_at_r"] = [0.99, 0.999, 0.9, 0.95, 0.97][: int(rows.sum())]
    finals.to_csv(baseline / "finals.csv", index=False)
    out = tmp_path / "r.json"
    assert main(["regress", "--baseline", str(baseline), "--current", str(baseline), "--json", str(out)]) == 0
    cell = _report(out)[CELLS[0]]
    values = finals.loc[rows, "map_at_r"].tolist()
    assert cell["baseline"]["ci_high"] == 1.0 and cell["baseline"]["clipped"] is True
    assert cell["baseline"]["mean"] == pytest.approx(np.mean(values))
    assert all(c["current"]["clipped"] is False for k, c in _report(out).items() if k != CELLS[0])
    printed = capsys.readouterr().out
    assert "1.000]*" in printed and CLIP_NOTE in printed
    mean, low, high = summary_interval(values, "map_at_r")
    assert (mean, high) == (pytest.approx(np.mean(values)), 1.0) and low < 1.0
    assert summary_interval(values, "some_unbounded_score")[2] > 1.0  # a metric with no known range: as it is
