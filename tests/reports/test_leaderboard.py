"""`dmlbench leaderboard` on a real tiny sweep: ranks, intervals, footer, and the page in chromium."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _sweeps import CELLS, sweep, sweep_base, sweep_copy  # noqa: F401  (fixtures)
from scipy import stats as st

from bench.cli import main
from bench.stats import t_interval


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dmlbench: error: "), err
    return err[0]


def test_t_interval_is_scipy_t_interval() -> None:
    values = [0.31, 0.35, 0.29, 0.40]
    iv = t_interval(values)
    low, high = st.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=st.sem(values))
    assert (iv.low, iv.high) == pytest.approx((low, high))
    one = t_interval([0.5])
    assert one.mean == 0.5 and math.isnan(one.low) and not one.defined


def _rows(md: str) -> list[list[str]]:
    """The ranked cells' rows (the floor row apart: `_floor_row`)."""
    lines = [
        l for l in md.splitlines() if l.startswith("| ") and not l.startswith(("| rank", "| floor")) and "---" not in l
    ]
    return [[c.strip() for c in l.strip("|").split("|")] for l in lines]


def _floor_row(md: str) -> list[str] | None:
    line = next((l for l in md.splitlines() if l.startswith("| floor |")), None)
    return None if line is None else [c.strip() for c in line.strip("|").split("|")]


def test_markdown_ranks_cells_by_primary_mean_with_footer(sweep_copy: Path) -> None:
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    md = (sweep_copy / "leaderboard.md").read_text()
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    finals = pd.read_csv(sweep_copy / "finals.csv")
    means = finals.groupby("cell")["map_at_r"].mean().sort_values(ascending=False)
    rows = _rows(md)
    assert [r[1].strip("`") for r in rows] == list(means.index)
    assert [r[0] for r in rows] == [str(i + 1) for i in range(len(rows))]
    assert set(means.index) == set(CELLS)
    for r in rows:  # "mean [low, high]" of the primary, from the per-seed rows
        vals = finals.loc[finals["cell"] == r[1].strip("`"), "map_at_r"]
        low, high = st.t.interval(0.95, len(vals) - 1, loc=vals.mean(), scale=st.sem(vals))
        assert r[2] == "3" and r[3] == f"{vals.mean():.3f} [{low:.3f}, {high:.3f}]"
    footer = md.split("\n---\n", 1)[1]
    assert manifest["protocol_hash"] in footer
    fp = manifest["fingerprints"]
    digests = [fp["train"], fp["test"], fp["split"], *(d for fold in fp["folds"] for d in fold.values())]
    assert len(digests) >= 5 and all(d in footer for d in digests)
    for metric in ("precision_at_1", "r_precision", "lake_accuracy", "val_map_at_r", "budget", "tuned hyperparameters"):
        assert metric in md.splitlines()[4]


def test_leaderboard_agrees_with_runner_summary(sweep: Path, tmp_path: Path) -> None:
    """Our intervals and the runner's summary.csv are the same documented t-interval."""
    from bench.reports import leaderboard, source

    board = leaderboard.build(source.load(sweep))
    summary = pd.read_csv(sweep / "summary.csv").set_index("cell")
    for row in board.rows:
        iv = row.metrics["map_at_r"]
        s = summary.loc[row.cell]
        assert (iv.mean, iv.low, iv.high) == pytest.approx(
            (s["map_at_r_mean"], s["map_at_r_ci_low"], s["map_at_r_ci_high"])
        )
        assert row.n_seeds == s["n_seeds"]


def _chromium(url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed (apt-get install chromium): the page must be checked in a browser")
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=3000",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _body_cells(dom: str) -> list[str]:
    return re.findall(r'<tr data-cell="([^"]+)"', dom)


def test_html_page_renders_sorts_and_is_self_contained(sweep_copy: Path, tmp_path: Path) -> None:
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    page = sweep_copy / "leaderboard.html"
    html = page.read_text()
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"\b(src|href)\s*=", html), "the page must not load anything"
    static = _body_cells(html)
    assert sorted(static) == sorted(CELLS)
    # Sort by cell once (ascending) or twice (descending): whichever differs from the ranked order.
    clicks, want = ("cell", sorted(static)) if sorted(static) != static else ("cell,cell", sorted(static, reverse=True))
    done = _chromium(f"{page.as_uri()}#sort={clicks}", tmp_path / "p1", "--dump-dom")
    dom = done.stdout
    assert 'data-ready="yes"' in dom, done.stderr[-2000:]
    assert _body_cells(dom) == want != static
    assert dom.count("<svg") >= 4 + len(CELLS)  # metrics, transfer, histories
    assert 'class="plot plot-scatter"' in dom and dom.count('class="plot plot-lines"') == len(CELLS)
    with_pairs = [c for c in CELLS if (sweep_copy / "artifacts" / c / "pair_distances.npz").exists()]
    assert dom.count('class="plot plot-hist"') == min(3, len(with_pairs))

    shot = tmp_path / "shot.png"
    _chromium(page.as_uri(), tmp_path / "p2", f"--screenshot={shot}", "--window-size=1200,1600")
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("RGB"))
    ink = (img < 200).any(axis=2).mean()
    colours = len(np.unique(img.reshape(-1, 3), axis=0))
    assert 0.01 < ink < 0.9 and colours > 20, (ink, colours)


def test_bad_results_directories_are_one_line_errors(
    tmp_path: Path, sweep_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["leaderboard", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in _error_line(capsys)
    (tmp_path / "empty").mkdir()
    assert main(["leaderboard", str(tmp_path / "empty")]) == 2
    assert "no manifest.json" in _error_line(capsys)
    finals = pd.read_csv(sweep_copy / "finals.csv")
    finals.iloc[:0].to_csv(sweep_copy / "finals.csv", index=False)
    assert main(["leaderboard", str(sweep_copy)]) == 2
    assert "no final runs" in _error_line(capsys)
    # Rows of another protocol version under this manifest: never pooled.
    finals.loc[finals.index[0], "protocol_hash"] = "0" * 64
    finals.to_csv(sweep_copy / "finals.csv", index=False)
    assert main(["leaderboard", str(sweep_copy)]) == 2
    assert "two protocol versions" in _error_line(capsys)


def test_failed_seeds_are_counted_and_refused_cells_are_not_ranked(sweep_copy: Path) -> None:
    """A failed seed has no metrics to average, but is shown (count and reason); a cell the budget audit
    refused is never ranked: it is a row without a rank that says why."""
    finals = pd.read_csv(sweep_copy / "finals.csv")
    first = finals.index[finals["cell"] == CELLS[0]][0]
    finals["reason"] = finals["reason"].astype(object)
    finals.loc[first, ["state", "map_at_r", "reason"]] = ["FAIL", np.nan, "RuntimeError: loss is NaN"]
    finals.to_csv(sweep_copy / "finals.csv", index=False)
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    manifest["refused"] = {CELLS[2]: "2 trials recorded, the budget is 1"}
    (sweep_copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    md = (sweep_copy / "leaderboard.md").read_text()
    rows = {r[1].strip("`"): r for r in _rows(md)}
    assert set(rows) == {CELLS[0], CELLS[1], CELLS[2]}
    assert rows[CELLS[2]][0] == "-" and rows[CELLS[2]][3] == "-"
    assert "no result: left out by the budget audit: 2 trials recorded" in rows[CELLS[2]][-1]
    assert rows[CELLS[0]][2] == "2" and rows[CELLS[1]][2] == "3"
    kept = finals.loc[(finals["cell"] == CELLS[0]) & (finals["state"] == "COMPLETE"), "map_at_r"]
    assert rows[CELLS[0]][3].startswith(f"{kept.mean():.3f} [")
    seed = int(finals.loc[first, "seed"])
    assert f"1 final seed(s) failed (seed {seed}: RuntimeError: loss is NaN)" in rows[CELLS[0]][-1]
    assert "failed" not in rows[CELLS[1]][-1]
    assert f"left out (budget audit): `{CELLS[2]}`" in md.split("\n---\n", 1)[1]
    # A cell whose every seed failed is still on the board, last, with its failures.
    finals.loc[finals["cell"] == CELLS[1], ["state", "map_at_r", "reason"]] = ["FAIL", np.nan, "out of memory"]
    finals.to_csv(sweep_copy / "finals.csv", index=False)
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    rows = _rows((sweep_copy / "leaderboard.md").read_text())
    assert [r[1].strip("`") for r in rows] == [CELLS[0], CELLS[1], CELLS[2]]
    assert rows[1][2] == "0" and rows[1][3] == "-" and "3 final seed(s) failed" in rows[1][-1]


def _without_times(md: str) -> str:
    return "\n".join(
        line for line in md.splitlines() if not line.startswith(("- created", "- finished", "- read from"))
    )


def test_leaderboard_from_the_mlflow_experiment_is_the_results_leaderboard(
    sweep: Path, sweep_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same sweep read from its MLflow records (not the results directory) gives the same table,
    footer and plots; the first seed's artifacts are downloaded beside the pages."""
    store = sweep.parent.parent / "runs" / "mlflow.db"
    out = tmp_path / "from-mlflow"
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    assert (
        main(
            [
                "leaderboard",
                "--mlflow-experiment",
                "dmlbench/reports-tiny",
                "--tracking-uri",
                str(store),
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    expected = _without_times((sweep_copy / "leaderboard.md").read_text())
    assert "- read from MLflow experiment dmlbench/reports-tiny" in (out / "leaderboard.md").read_text()
    assert _without_times((out / "leaderboard.md").read_text()) == expected
    assert len(_rows(expected)) == len(CELLS)
    for cell in CELLS:
        mine, theirs = sweep_copy / "artifacts" / cell, out / "artifacts" / cell
        assert (theirs / "optuna_history.csv").read_text() == (mine / "optuna_history.csv").read_text()
        if (mine / "pair_distances.npz").exists():
            with np.load(mine / "pair_distances.npz") as a, np.load(theirs / "pair_distances.npz") as b:
                assert np.array_equal(a["pos"], b["pos"]) and np.array_equal(a["neg"], b["neg"])
    # The name without its `dmlbench/` prefix finds the same experiment.
    assert (
        main(
            [
                "leaderboard",
                "--mlflow-experiment",
                "reports-tiny",
                "--tracking-uri",
                str(store),
                "--out",
                str(tmp_path / "short"),
                "--quiet",
            ]
        )
        == 0
    )
    assert _without_times((tmp_path / "short" / "leaderboard.md").read_text()) == expected
    capsys.readouterr()


def test_mlflow_leaderboard_never_pools_protocol_versions(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of another protocol version in the experiment: refused until --protocol-hash picks one."""
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlflow.db"
    shutil.copy(sweep.parent.parent / "runs" / "mlflow.db", store)
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("dmlbench/reports-tiny")
    ours = json.loads((sweep / "manifest.json").read_text())["protocol_hash"]
    client.create_run(
        experiment.experiment_id,
        tags={
            "dmlbench.protocol_hash": "f" * 64,
            "cell": "triplet+batch_hard",
            "kind": "final",
            "seed": "0",
            "state": "COMPLETE",
        },
    )
    args = [
        "leaderboard",
        "--mlflow-experiment",
        "reports-tiny",
        "--tracking-uri",
        str(store),
        "--out",
        str(tmp_path / "lb"),
        "--quiet",
    ]
    assert main(args) == 2
    line = _error_line(capsys)
    assert "2 versions of the protocol" in line and ours[:12] in line and "--protocol-hash" in line
    assert main([*args, "--protocol-hash", ours[:8]]) == 0
    assert main([*args, "--protocol-hash", "f" * 8]) == 2  # that version recorded no protocol file
    assert "recorded its protocol file" in _error_line(capsys)
    assert main(["leaderboard", "--mlflow-experiment", "nope", "--tracking-uri", str(store)]) == 2
    assert "no MLflow experiment 'nope'" in _error_line(capsys)
    assert main(["leaderboard", "--mlflow-experiment", "reports-tiny", "--tracking-uri", str(tmp_path / "x.db")]) == 2
    assert "no MLflow store at" in _error_line(capsys) and not (tmp_path / "x.db").exists()
    (tmp_path / "text.db").write_text("not a database\n")
    assert (
        main(["leaderboard", "--mlflow-experiment", "reports-tiny", "--tracking-uri", str(tmp_path / "text.db")]) == 2
    )
    assert "cannot read MLflow tracking store" in _error_line(capsys)
    assert (tmp_path / "text.db").read_text() == "not a database\n"


def _write_floor(results: Path, per_seed: pd.DataFrame) -> pd.DataFrame:
    """floor.csv as the runner writes it (protocol_hash, seed, the metric columns), from given per-seed rows."""
    manifest = json.loads((results / "manifest.json").read_text())
    floor = per_seed[["seed", *manifest["metrics"]]].copy()
    floor.insert(0, "protocol_hash", manifest["protocol_hash"])
    floor.to_csv(results / "floor.csv", index=False)
    return floor


def test_floor_row_and_collapsed_cells(sweep_copy: Path, tmp_path: Path) -> None:
    """The floor is its own row; a cell not significantly above it (one-sided, paired by seed) is collapsed."""
    finals = pd.read_csv(sweep_copy / "finals.csv")
    means = finals.groupby("cell")["map_at_r"].mean()
    worst = means.idxmin()
    # The floor: the worst cell's own per-seed numbers with the seeds reversed (same mean, so that cell is
    # not above it; a real floor is the untrained trunk, which the runner writes).
    rows_worst = finals[finals["cell"] == worst].sort_values("seed").copy()
    metrics = json.loads((sweep_copy / "manifest.json").read_text())["metrics"]
    rows_worst[metrics] = rows_worst[metrics].to_numpy()[::-1]
    floor = _write_floor(sweep_copy, rows_worst)
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    md = (sweep_copy / "leaderboard.md").read_text()
    fr = _floor_row(md)
    low, high = st.t.interval(0.95, 2, loc=floor["map_at_r"].mean(), scale=st.sem(floor["map_at_r"]))
    assert fr is not None and fr[1] == "untrained trunk" and fr[2] == "3"
    assert fr[3] == f"{floor['map_at_r'].mean():.3f} [{low:.3f}, {high:.3f}]"
    rows = {r[1].strip("`"): r for r in _rows(md)}
    for cell, r in rows.items():
        x = finals[finals["cell"] == cell].sort_values("seed")["map_at_r"].to_numpy()
        p = st.ttest_rel(x, floor["map_at_r"].to_numpy(), alternative="greater").pvalue
        below = "collapsed" in r[-1] or "not shown above the floor" in r[-1]
        assert below == (p >= 0.05), (cell, p, r[-1])
        if p >= 0.05:
            assert f"paired, one-sided p = {p:.3g}" in r[-1]
        share = (x.mean() - floor["map_at_r"].mean()) / (means.max() - floor["map_at_r"].mean())
        assert ("barely trained" in r[-1]) == (p < 0.05 and share < 0.25), (cell, p, share, r[-1])
        if "barely trained" in r[-1]:
            assert f"{share:.0%} of the best cell's gain" in r[-1]
    assert "collapsed" in rows[worst][-1] or "not shown above the floor" in rows[worst][-1]
    footer = md.split("\n---\n", 1)[1]
    assert "floor: the untrained trunk" in footer
    page = (sweep_copy / "leaderboard.html").read_text()
    assert page.count('<tr class="floor" data-floor="yes">') == 1
    assert sorted(_body_cells(page)) == sorted(CELLS)  # the floor is no cell
    collapsed = [c for c, r in rows.items() if "collapsed" in r[-1] or "not shown above the floor" in r[-1]]
    assert page.count('class="collapsed"') == len(collapsed)
    # Without floor.csv: no floor row, and the footer says why nothing is marked.
    (sweep_copy / "floor.csv").unlink()
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    md = (sweep_copy / "leaderboard.md").read_text()
    assert _floor_row(md) is None and not any("collapsed" in r[-1] for r in _rows(md))
    assert "no floor row" in md


def test_tuned_value_at_the_edge_of_its_range_is_warned(sweep_copy: Path) -> None:
    """Ranges come from re-planning the protocol the results ran; 0.98 of [0.01, 1] (log) is at the top."""
    from bench.reports.edges import position

    assert position(0.98, {"type": "float", "low": 0.01, "high": 1.0, "log": True}) == pytest.approx(
        (math.log(0.98) - math.log(0.01)) / (math.log(1.0) - math.log(0.01))
    )
    finals = pd.read_csv(sweep_copy / "finals.csv")
    for cell, margin in (("triplet+batch_hard", 0.98), ("triplet+batch_all", 0.1)):
        finals.loc[finals["cell"] == cell, "params"] = json.dumps({"loss.margin": margin})
    finals.to_csv(sweep_copy / "finals.csv", index=False)
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    rows = {r[1].strip("`"): r for r in _rows((sweep_copy / "leaderboard.md").read_text())}
    assert "edge: loss.margin=0.98 at the high edge of [0.01, 1, log]" in rows["triplet+batch_hard"][-1]
    assert "edge" not in rows["triplet+batch_all"][-1]
    # The protocol file gone: ranges unknown, and the footer says so instead of staying silent.
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    manifest["protocol_file"] = str(sweep_copy / "gone.yaml")
    manifest.pop("protocol_text", None)  # results from before the manifest kept the protocol's text
    (sweep_copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    md = (sweep_copy / "leaderboard.md").read_text()
    assert "edge:" not in md and "not checked against their search ranges" in md


def test_a_planned_cell_without_a_result_is_a_row_that_says_why(sweep_copy: Path, capsys) -> None:
    """Every trial of a cell failed, so it had no final seed: it was missing from the table, not marked."""
    gone = CELLS[1]
    finals = pd.read_csv(sweep_copy / "finals.csv")
    finals[finals["cell"] != gone].to_csv(sweep_copy / "finals.csv", index=False)
    trials = pd.read_csv(sweep_copy / "trials.csv")
    mask = trials["cell"] == gone
    trials.loc[mask, "state"] = "FAIL"
    trials.loc[mask, "value"] = np.nan
    trials["reason"] = trials["reason"].astype(object)
    trials.loc[mask, "reason"] = "loss 'centroid' has no parameter 'temperature'"
    trials.to_csv(sweep_copy / "trials.csv", index=False)
    summary = pd.read_csv(sweep_copy / "summary.csv")  # what the runner writes for a cell with no winner
    summary.loc[summary["cell"] == gone, "n_seeds"] = 0
    summary.to_csv(sweep_copy / "summary.csv", index=False)
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    md = (sweep_copy / "leaderboard.md").read_text()
    row = next(r for r in _rows(md) if r[1].strip("`") == gone)
    assert row[0] == "-" and row[2] == "0"
    assert "no result: every trial failed" in row[-1] and "has no parameter 'temperature'" in row[-1]
    assert "1 planned cell(s) have no result" in md
    page = (sweep_copy / "leaderboard.html").read_text()
    assert f'data-cell="{gone}" class="collapsed" data-missing="yes"' in page
    from bench.reports import leaderboard, source

    out = leaderboard.text(leaderboard.build(source.load(sweep_copy)))  # what `dmlbench run` prints at its end
    assert f"{gone} (no result)" in out and f"{gone}: no result: every trial failed" in out


def test_the_spearman_warning_needs_enough_cells_to_mean_something() -> None:
    from bench.reports import leaderboard
    from bench.reports.source import Results

    def board(n: int) -> leaderboard.Board:
        rows = [
            {"cell": f"c{i}", "seed": s, "map_at_r": 0.3 + 0.05 * i + 0.001 * s, "val_map_at_r": 0.9 - 0.05 * i}
            for i in range(n)
            for s in range(3)
        ]  # validation ranks the cells in reverse of the test
        return leaderboard.build(
            Results(
                Path("mem"), {"protocol": "p", "protocol_hash": "h", "primary_metric": "map_at_r"}, pd.DataFrame(rows)
            )
        )

    few, many = board(leaderboard.MIN_TRANSFER_CELLS - 1), board(leaderboard.MIN_TRANSFER_CELLS)
    assert few.transfer == pytest.approx(-1.0) and many.transfer == pytest.approx(-1.0)
    assert not any("Spearman" in w for w in few.warnings)
    assert any("Spearman) of map_at_r is -1.00" in w for w in many.warnings)
