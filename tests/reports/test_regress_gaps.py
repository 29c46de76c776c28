"""`dmlbench regress` fails whenever the current tables lack anything the baseline has, and pairs by seed.

Built from the committed omniglot-quick results (13 cells, 3 final seeds, 8 metrics), copied twice and
edited: every way a current table can be shorter than its baseline is one row of `CASES`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from bench.cli import main
from bench.stats import paired

COMMITTED = Path(__file__).resolve().parents[2] / "results" / "omniglot-quick"
CELL = "triplet+batch_hard"  # the cell each edit damages
FAILED_REASON = "RuntimeError: CUDA out of memory"


@pytest.fixture()
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """(baseline, current): two copies of the committed tables, safe to edit."""
    out = []
    for side in ("baseline", "current"):
        dst = tmp_path / side / COMMITTED.name
        shutil.copytree(COMMITTED, dst, ignore=shutil.ignore_patterns("artifacts", "baseline", "*.html"))
        out.append(dst)
    return out[0], out[1]


def _finals(path: Path, edit: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
    finals = pd.read_csv(path / "finals.csv")
    edit(finals).to_csv(path / "finals.csv", index=False)


def _rows(f: pd.DataFrame, seed: int | None = None) -> pd.Series:
    rows = f["cell"] == CELL
    return rows & (f["seed"] == seed) if seed is not None else rows


def _fail(f: pd.DataFrame, rows: pd.Series) -> pd.DataFrame:
    """What the runner writes for a final seed that raised: state FAIL, its reason, no metrics."""
    f["reason"] = f["reason"].astype(object)
    f.loc[rows, "state"] = "FAIL"
    f.loc[rows, "reason"] = FAILED_REASON
    for m in json.loads((COMMITTED / "manifest.json").read_text())["metrics"]:
        f.loc[rows, m] = math.nan
    return f


def _set(seed: int, column: str, value: float) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def edit(f: pd.DataFrame) -> pd.DataFrame:
        f.loc[_rows(f, seed), column] = value
        return f

    return edit


def _text_value(seed: int, column: str, text: str) -> Callable[[Path], None]:
    """Write `text` literally into one value of finals.csv (pandas would write NaN as empty)."""

    def edit(path: Path) -> None:
        rows = list(csv.DictReader(io.StringIO((path / "finals.csv").read_text())))
        for row in rows:
            if row["cell"] == CELL and row["seed"] == str(seed):
                row[column] = text
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        (path / "finals.csv").write_text(buf.getvalue())

    return edit


def _on_finals(edit: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[Path], None]:
    return lambda path: _finals(path, edit)


def _refuse(path: Path) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["refused"] = {CELL: "trial 3 trained 599 iterations, the budget is 600"}
    (path / "manifest.json").write_text(json.dumps(manifest))


def _renumber(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[_rows(f, 2), "seed"] = 7
    return f


def _drop_every_seed(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[_rows(f), "map_at_r"] -= 0.05
    return f


# (id, edit of the current results directory, extra options, exit code, CELL's status or None, words that name it)
CASES: list[tuple[str, Callable[[Path], None], list[str], int, str | None, str]] = [
    ("cell absent", _on_finals(lambda f: f[~_rows(f)]), [], 1, "missing", "no final row"),
    ("cell refused by the audit", _refuse, [], 1, "missing", "refused by the budget audit: trial 3 trained 599"),
    ("cell only as failed rows", _on_finals(lambda f: _fail(f, _rows(f))), [], 1, "failed", "seed 0 failed: Runtime"),
    (
        "cell only as failed rows, --allow-missing",
        _on_finals(lambda f: _fail(f, _rows(f))),
        ["--allow-missing"],
        1,
        "failed",
        f"seed 2 failed: {FAILED_REASON}",
    ),
    ("final seed absent", _on_finals(lambda f: f[~_rows(f, 2)]), [], 1, "seeds missing", "seed 2 missing"),
    (
        "final seed absent, --allow-missing",
        _on_finals(lambda f: f[~_rows(f, 0)]),
        ["--allow-missing"],
        1,
        "seeds missing",
        "seed 0 missing",
    ),
    (
        "final seed failed",
        _on_finals(lambda f: _fail(f, _rows(f, 1))),
        [],
        1,
        "seeds missing",
        f"seed 1 failed: {FAILED_REASON}",
    ),
    ("final seed renumbered", _on_finals(_renumber), [], 1, "seeds missing", "seed 7 not in the baseline"),
    ("seed column dropped", _on_finals(lambda f: f.drop(columns="seed")), [], 1, "seeds missing", "no seed column"),
    ("compared value 'nan'", _text_value(0, "map_at_r", "nan"), [], 1, "not a number", "map_at_r at seed 0: empty"),
    ("compared value empty", _text_value(1, "map_at_r", ""), [], 1, "not a number", "map_at_r at seed 1: empty"),
    ("compared value inf", _text_value(1, "map_at_r", "inf"), [], 2, None, "seed 1: map_at_r = "),
    (
        "other metric NaN",
        _on_finals(_set(1, "recall_at_2", math.nan)),
        [],
        1,
        "values missing",
        "recall_at_2 at seed 1",
    ),
    ("other metric empty", _text_value(2, "lake_accuracy", ""), [], 1, "values missing", "lake_accuracy at seed 2"),
    (
        "other metric column emptied",
        _on_finals(lambda f: f.assign(recall_at_8=math.nan)),
        [],
        1,
        "values missing",
        "recall_at_8 at seed 0",
    ),
    ("metric column dropped", _on_finals(lambda f: f.drop(columns="lake_accuracy")), [], 1, "same", "lake_accuracy"),
    (
        "compared metric column dropped",
        _on_finals(lambda f: f.drop(columns="map_at_r")),
        [],
        2,
        None,
        "primary metric 'map_at_r' is not a column",
    ),
    (
        "--metric column dropped",
        _on_finals(lambda f: f.drop(columns="recall_at_1")),
        ["--metric", "recall_at_1"],
        2,
        None,
        "no metric 'recall_at_1'",
    ),
    ("finals.csv empty file", lambda p: (p / "finals.csv").write_text(""), [], 2, None, "unreadable results table"),
    ("finals.csv header only", _on_finals(lambda f: f.iloc[:0]), [], 2, None, "holds no final runs"),
    ("finals.csv deleted", lambda p: (p / "finals.csv").unlink(), [], 2, None, "holds no final runs"),
    ("every row failed", _on_finals(lambda f: _fail(f, f["cell"] == f["cell"])), [], 2, None, "no completed"),
    ("0.05 lower on every seed", _on_finals(_drop_every_seed), [], 1, "worse", "1 regression(s): triplet+batch_hard"),
]


@pytest.mark.parametrize(("name", "edit", "options", "code", "status", "words"), CASES, ids=[c[0] for c in CASES])
def test_current_shorter_than_baseline_fails(
    pair: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    edit: Callable[[Path], None],
    options: list[str],
    code: int,
    status: str | None,
    words: str,
) -> None:
    """Each way the current tables can lack what the baseline has fails, naming what is missing."""
    baseline, current = pair
    edit(current)
    out = tmp_path / "r.json"
    args = ["regress", "--baseline", str(baseline), "--current", str(current), *options]
    assert main([*args, "--json", str(out)]) == code
    printed, err = capsys.readouterr()
    if code == 2:  # unusable input: one line, nothing written
        assert err.count("\n") == 1 and err.startswith("dmlbench: error: ") and words in err, err
        assert not out.exists()
        return
    assert words in printed, printed
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == 1
    cells = {c["cell"]: c for c in doc["cells"]}
    assert cells[CELL]["status"] == status
    named = " ".join(cells[CELL]["problems"] + doc["missing_columns"]) + " " + " ".join(doc["regressions"])
    assert words in named or status == "worse"
    # the other eleven cells are untouched, equal on every seed: paired and same, unless a column went for all
    others = {c["status"] for k, c in cells.items() if k != CELL}
    assert others == (
        {"values missing"} if "emptied" in name else {"seeds missing"} if "seed column" in name else {"same"}
    )
    # CSV keeps the finding too (a table-level row for missing columns)
    assert main([*args, "--format", "csv", "-q"]) == 1
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert any(words in r["problems"] for r in rows) or status == "worse"


def test_missing_column_is_named_at_table_level(pair: tuple[Path, Path], tmp_path: Path) -> None:
    baseline, current = pair
    _finals(current, lambda f: f.drop(columns=["lake_accuracy", "recall_at_4"]))
    out = tmp_path / "r.json"
    assert main(["regress", "--baseline", str(baseline), "--current", str(current), "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["missing_columns"] == ["recall_at_4", "lake_accuracy"] and doc["regressions"] == []
    # the reverse (current has columns the baseline lacks) is not a loss
    assert main(["regress", "--baseline", str(current), "--current", str(baseline)]) == 0


def test_equal_on_every_seed_passes_paired(pair: tuple[Path, Path], tmp_path: Path) -> None:
    baseline, current = pair
    out = tmp_path / "r.json"
    assert main(["regress", "--baseline", str(baseline), "--current", str(current), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    cells = json.loads((COMMITTED / "manifest.json").read_text())["cells"]
    assert len(doc["cells"]) == len(cells) and doc["missing_columns"] == [] and doc["regressions"] == []
    for c in doc["cells"]:
        assert (c["status"], c["test"], c["change"]["test"], c["change"]["diff"], c["problems"]) == (
            "same",
            "paired",
            "paired",
            0.0,
            [],
        )
    assert doc["rule"]["test"].startswith("one-sided paired t-test")


def test_uniform_drop_fails_paired_where_welch_passed(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The case that passed the gate: 0.05 MAP@R lower on every seed of a 3-seed cell whose seeds spread by
    0.05. Welch's p is 0.14 (the spread hides the drop); paired by seed, the drop is the same at every seed."""
    baseline, current = pair
    spread = [0.28, 0.33, 0.38]  # seeds 0, 1, 2
    for side in (baseline, current):
        _finals(side, lambda f: f.assign(map_at_r=f["map_at_r"].mask(_rows(f), f["seed"].map(dict(enumerate(spread))))))
    _finals(current, _drop_every_seed)
    out = tmp_path / "r.json"
    assert main(["regress", "--baseline", str(baseline), "--current", str(current), "--json", str(out)]) == 1
    cell = {c["cell"]: c for c in json.loads(out.read_text())["cells"]}[CELL]
    assert cell["status"] == "worse" and cell["test"] == "paired" and cell["problems"] == []
    assert cell["change"]["diff"] == pytest.approx(-0.05) and cell["change"]["p_drop"] < 1e-6
    welch_p = st.ttest_ind(np.subtract(spread, 0.05), spread, equal_var=False, alternative="less").pvalue
    assert welch_p == pytest.approx(0.14, abs=0.01)  # what the unpaired gate said: "worse?", exit 0


def test_seeds_differ_uses_welch_and_says_so(pair: tuple[Path, Path], tmp_path: Path) -> None:
    baseline, current = pair
    extra = pd.read_csv(current / "finals.csv")
    row = extra[_rows(extra, 2)].assign(seed=3)
    pd.concat([extra, row]).to_csv(current / "finals.csv", index=False)
    out = tmp_path / "r.json"
    assert main(["regress", "--baseline", str(baseline), "--current", str(current), "--json", str(out)]) == 1
    cell = {c["cell"]: c for c in json.loads(out.read_text())["cells"]}[CELL]
    assert (cell["status"], cell["test"], cell["problems"]) == ("seeds differ", "Welch", ["seed 3 not in the baseline"])


def test_paired_is_scipy_ttest_rel() -> None:
    """bench.stats.paired against scipy's paired test: one-sided p-values, interval, df."""
    rng = np.random.default_rng(3)
    base = rng.uniform(0.3, 0.4, size=5)
    cur = base - 0.01 + rng.normal(0, 0.005, size=5)
    d = paired(cur, base)
    assert d.test == "paired" and d.df == 4
    assert d.p_less == pytest.approx(st.ttest_rel(cur, base, alternative="less").pvalue, rel=1e-12)
    assert d.p_greater == pytest.approx(st.ttest_rel(cur, base, alternative="greater").pvalue, rel=1e-12)
    ci = st.ttest_rel(cur, base).confidence_interval(0.95)
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert d.diff == pytest.approx(float(np.mean(cur - base)))
    assert d.p_less == pytest.approx(st.ttest_1samp(cur - base, 0.0, alternative="less").pvalue, rel=1e-12)
