"""`dmlbench budget-check` on a real tiny sweep: rows, resume after a kill, refusal, leaderboard and claims;
Kendall's tau and the cells that moved against hand-computed cases."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from _sweeps import CELLS, sweep, sweep_base  # noqa: F401  (fixtures)
from scipy import stats as st

from bench.cli import main
from bench.reports import budget
from bench.reports.source import Results

METRICS = ["precision_at_1", "r_precision", "map_at_r", "recall_at_1", "recall_at_2", "lake_accuracy"]


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dmlbench: error: "), err
    return err[0]


def _args(run: Path, *extra: str) -> list[str]:
    """`dmlbench budget-check` pointed at a copied sweep (its protocol, storage, tracking store, results)."""
    return [
        "budget-check",
        str(run / "reports-tiny.yaml"),
        "--results-dir",
        str(run / "results"),
        "--storage",
        f"sqlite:///{run / 'runs' / 'optuna.db'}",
        "--tracking-uri",
        str(run / "runs" / "mlflow.db"),
        "--data-root",
        str(Path(__file__).resolve().parents[2].parent / "shared" / "data"),
        "--threads",
        "1",
        "--quiet",
        *extra,
    ]


def _copy(run: Path, to: Path) -> Path:
    """A whole sweep (its protocol, Optuna and MLflow stores, results), so the check writes into a private copy."""
    shutil.copytree(run, to)
    return to


@pytest.fixture(scope="module")
def checked(sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny sweep after `budget-check --multiple 1` then the default 2x (do not modify: copy it)."""
    run = _copy(sweep.parents[1], tmp_path_factory.mktemp("budget") / "run")  # results/<name> -> the sweep
    assert main(_args(run, "--multiple", "1")) == 0
    assert main(_args(run)) == 0
    return run


def _budget_runs(run: Path) -> list:
    """The MLflow runs of kind budget_check in a copied sweep's tracking store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'runs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dmlbench/reports-tiny")
    return client.search_runs([experiment.experiment_id], "tags.kind = 'budget_check'", max_results=1000)


def _table(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "results" / "reports-tiny" / "budget_check.csv")


def _finals(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "results" / "reports-tiny" / "finals.csv")


def test_rows_at_the_multiple_with_the_finals_seeds_and_params(checked: Path) -> None:
    table, finals = _table(checked), _finals(checked)
    assert len(table) == 2 * len(finals) == 2 * 3 * len(CELLS)
    assert not table.duplicated(["cell", "seed", "multiple"]).any()
    for multiple, rows in table.groupby("multiple"):
        assert (rows["iterations"] == 30 * multiple).all() and (rows["state"] == "COMPLETE").all()
        merged = rows.merge(finals, on=["cell", "seed"], suffixes=("", "_final"))
        assert len(merged) == len(finals)  # the same final seeds, every cell
        assert (merged["params"] == merged["params_final"]).all()  # the finals' tuned configuration
        assert np.allclose(merged["val_map_at_r"], merged["val_map_at_r_final"])
        same = np.isclose(
            merged[METRICS].to_numpy(float), merged[[f"{m}_final" for m in METRICS]].to_numpy(float), rtol=0, atol=1e-12
        )
        if multiple == 1:  # one times the budget is the finals again, evaluated exactly like them
            assert same.all()
        else:  # twice the training changes the embeddings
            assert not same[:, METRICS.index("map_at_r")].all()
    runs = _budget_runs(checked)
    assert len(runs) == len(table)
    for r in runs:
        row = table[
            (table["cell"] == r.data.tags["cell"])
            & (table["seed"] == int(r.data.tags["seed"]))
            & (table["multiple"] == int(r.data.tags["multiple"]))
        ]
        assert len(row) == 1 and r.data.tags["state"] == "COMPLETE" and r.info.status == "FINISHED"
        assert r.data.metrics["map_at_r"] == pytest.approx(float(row["map_at_r"].iloc[0]))
        assert r.data.metrics["iterations"] == row["iterations"].iloc[0]
        assert r.data.tags["dmlbench.device"].startswith("cpu")  # where the check trained (`--device`)
        assert r.data.tags["dmlbench.device"] == row["device"].iloc[0]  # the row names it too
    assert table["device"].str.startswith("cpu: ").all()
    # the manifest lists the check's parts beside the sweep's: one per check that trained
    parts = json.loads((checked / "results" / "reports-tiny" / "manifest.json").read_text())["hardware"]
    ran = [p for p in parts if p.get("kind") == "budget_check"]
    assert [p["multiple"] for p in ran] == [1, 2] and all(p["device"] == table["device"].iloc[0] for p in ran)
    assert len(parts) > len(ran)  # the sweep's own parts kept


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no CUDA device")
def test_a_check_on_a_device_this_machine_lacks_is_refused_in_one_line(
    checked: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(checked, tmp_path / "run")
    before = _table(run)
    capsys.readouterr()
    assert main(_args(run, "--multiple", "3", "--device", "cuda")) == 2
    assert "training.device: 'cuda' but no CUDA device is available" in _error_line(capsys)
    assert _table(run).equals(before)  # nothing recorded, nothing lost


def test_a_killed_check_resumes_without_redoing_finished_seeds(
    checked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.sweep import final_run  # the budget check trains through it

    run = _copy(checked, tmp_path / "run")
    path = run / "results" / "reports-tiny" / "budget_check.csv"
    full = _table(run)
    partial = full[full["multiple"] == 1].copy()
    partial = pd.concat([partial, full[full["multiple"] == 2].head(2)])
    sentinel = 0.123456789  # a kept row is kept, not retrained: its value would change back
    partial.loc[partial.index[-1], "map_at_r"] = sentinel
    stale = partial.index[-2]  # a row of other parameters (its cell run again since) is trained again
    partial.loc[stale, ["params", "map_at_r"]] = ['{"loss.margin": 9.0}', 0.5]
    partial.to_csv(path, index=False)
    real, calls = final_run.train_and_score, []

    def killed_on_the_third(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as Ctrl-C or SIGTERM in the middle of a seed
        return real(*args, **kwargs)

    monkeypatch.setattr(final_run, "train_and_score", killed_on_the_third)
    assert main(_args(run)) == 130
    after_kill = pd.read_csv(path)  # whole rows only: the two seeds trained before the kill, nothing else
    assert len(after_kill) == len(partial) + 1 and not after_kill.duplicated(["cell", "seed", "multiple"]).any()
    monkeypatch.setattr(final_run, "train_and_score", real)
    calls.clear()
    assert main(_args(run)) == 0
    resumed = pd.read_csv(path)
    assert len(resumed) == len(full)
    key = ["multiple", "cell", "seed"]
    a, b = resumed.set_index(key).sort_index(), full.set_index(key).sort_index()
    kept = (2, partial["cell"].iloc[-1], int(partial["seed"].iloc[-1]))
    assert a.loc[kept, "map_at_r"] == sentinel
    a.loc[kept, "map_at_r"] = b.loc[kept, "map_at_r"]
    # every retrained seed equals the uninterrupted check's (the same seeds, same threads)
    assert np.allclose(a[METRICS].to_numpy(float), b[METRICS].to_numpy(float), rtol=0, atol=1e-12)
    assert (a["params"] == b["params"]).all()  # the stale row was replaced by the current parameters' run
    runs = _budget_runs(run)
    assert len(runs) == len(full)  # the killed seed's run was reopened, not duplicated
    assert all(r.info.status == "FINISHED" for r in runs)


def test_shards_split_the_check_without_training_a_seed_twice(
    checked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers with --shard 1/2 and 2/2 train disjoint halves whose union is the whole check."""
    from bench.sweep import final_run  # the budget check trains through it

    run = _copy(checked, tmp_path / "run")
    path = run / "results" / "reports-tiny" / "budget_check.csv"
    full = _table(run)
    full[full["multiple"] == 1].to_csv(path, index=False)  # the 2x rows to be trained again
    real, trained = final_run.train_and_score, []

    def counted(*args: object, **kwargs: object) -> object:
        out = real(*args, **kwargs)
        trained.append(1)
        return out

    monkeypatch.setattr(final_run, "train_and_score", counted)
    assert main(_args(run, "--shard", "1/2")) == 0
    first = len(trained)
    assert main(_args(run, "--shard", "2/2")) == 0
    pairs = len(full[full["multiple"] == 2])
    assert first == (pairs + 1) // 2 and len(trained) == pairs  # each (cell, seed) trained once
    resumed = pd.read_csv(path)
    key = ["multiple", "cell", "seed"]
    a, b = resumed.set_index(key).sort_index(), full.set_index(key).sort_index()
    assert np.allclose(a[METRICS].to_numpy(float), b[METRICS].to_numpy(float), rtol=0, atol=1e-12)
    assert main(_args(run, "--shard", "3/2")) == 2


def test_a_table_written_before_rows_named_their_device_is_resumed(checked: Path, tmp_path: Path) -> None:
    """budget_check.csv of an earlier version (no device column): its rows kept, the new ones name theirs."""
    run = _copy(checked, tmp_path / "run")
    path = run / "results" / "reports-tiny" / "budget_check.csv"
    full = _table(run)
    full[full["multiple"] == 1].drop(columns=["device"]).to_csv(path, index=False)
    assert main(_args(run)) == 0
    resumed = pd.read_csv(path)
    assert list(resumed.columns) == list(full.columns) and len(resumed) == len(full)
    assert resumed[resumed["multiple"] == 1]["device"].isna().all()
    assert resumed[resumed["multiple"] == 2]["device"].str.startswith("cpu: ").all()
    # the leaderboard counts the check's cost from the rows that name their device
    results = run / "results" / "reports-tiny"
    assert main(["leaderboard", str(results), "--quiet"]) == 0
    at2 = resumed[resumed["multiple"] == 2]
    cost = (
        f"the budget check at 2x trained {at2['iterations'].sum():,.0f} iterations in "
        f"{at2['wall_time_s'].sum():,.0f} device-seconds"
    )
    compute = next(line for line in (results / "leaderboard.md").read_text().splitlines() if "compute:" in line)
    assert cost in compute and at2["device"].iloc[0] in compute


def test_refused_before_the_run_finished(checked: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(checked, tmp_path / "run")
    results = run / "results" / "reports-tiny"
    (results / "budget_check.csv").unlink()
    manifest = json.loads((results / "manifest.json").read_text())
    manifest["finished"] = None
    (results / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(_args(run)) == 2
    line = _error_line(capsys)
    assert "has not finished" in line and "dmlbench run" in line
    assert not (results / "budget_check.csv").exists()
    shutil.rmtree(results)
    assert main(_args(run)) == 2
    assert "holds no results of reports-tiny" in _error_line(capsys)


def test_leaderboard_columns_and_kendall_tau(checked: Path, tmp_path: Path) -> None:
    run = _copy(checked, tmp_path / "run")
    results = run / "results" / "reports-tiny"
    assert main(["leaderboard", str(results), "--quiet"]) == 0
    md = (results / "leaderboard.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| rank"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert {"map_at_r at 2x", "change at 2x", "rank at 2x"} <= set(cols)
    finals, table = _finals(run), _table(run)
    at2 = table[table["multiple"] == 2]
    base = finals.groupby("cell")["map_at_r"].mean()
    later = at2.groupby("cell")["map_at_r"].mean()
    order = lambda s: {c: i for i, c in enumerate(sorted(s.index, key=lambda c: (-s[c], c)))}  # noqa: E731
    r1, r2 = order(base), order(later)
    cells = sorted(base.index)
    tau = st.kendalltau([r1[c] for c in cells], [r2[c] for c in cells]).statistic
    assert f"Kendall's tau between the rankings of map_at_r is {tau:.2f}" in md
    moved = [c for c in sorted(cells, key=r1.get) if r1[c] != r2[c]]
    assert ("cells that moved: none" in md) == (not moved)
    for c in moved:
        assert f"{c} (rank {r1[c] + 1} to {r2[c] + 1})" in md
    for line in md.splitlines():
        if line.startswith("| ") and "`" in line.split("|")[2]:
            row = dict(zip(cols, [c.strip() for c in line.strip("|").split("|")]))
            cell = row["cell"].strip("`")
            x = at2[at2["cell"] == cell].sort_values("seed")["map_at_r"].to_numpy()
            y = finals[finals["cell"] == cell].sort_values("seed")["map_at_r"].to_numpy()
            ci = st.ttest_rel(x, y).confidence_interval(0.95)
            assert row["change at 2x"] == f"{(x - y).mean():+.3f} [{ci.low:+.3f}, {ci.high:+.3f}]"
            assert row["rank at 2x"] == str(r2[cell] + 1)
    assert ("not stable" in md) == bool(moved)
    page = (results / "leaderboard.html").read_text()
    assert "map_at_r at 2x" in page and "Kendall&#x27;s tau" in page
    # The leaderboard rebuilt from MLflow alone has the check too.
    out = tmp_path / "from-mlflow"
    assert (
        main(
            [
                "leaderboard",
                "--mlflow-experiment",
                "dmlbench/reports-tiny",
                "--tracking-uri",
                str(run / "runs" / "mlflow.db"),
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    assert f"Kendall's tau between the rankings of map_at_r is {tau:.2f}" in (out / "leaderboard.md").read_text()


def _claims(path: Path) -> Path:
    doc = {
        "protocol": "reports-tiny",
        "claims": [
            {"id": "bh-beats-ba", "kind": "beats", "a": "triplet+batch_hard", "b": "triplet+batch_all", "source": "t"},
            {
                "id": "within",
                "kind": "within",
                "a": "contrastive+none",
                "b": "triplet+batch_all",
                "points": 0.05,
                "source": "t",
            },
            {
                "id": "people",
                "kind": "against_reference",
                "cell": "best",
                "metric": "lake_accuracy",
                "value": 95.5,
                "unit": "percent",
                "reference": "people",
                "expect": "below",
                "source": "Lake et al. 2015",
            },
        ],
    }
    path.write_text(json.dumps(doc))
    return path


def test_claims_say_whether_the_table_is_stable(
    checked: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(checked, tmp_path / "run")
    results = run / "results" / "reports-tiny"
    finals, table = _finals(run), _table(run)
    cf = _claims(tmp_path / "reports-tiny.json")  # the protocol's own claims file: claims.md, claims.json
    # Stable by construction: at 2x every seed scores its final + 0.01 (ranking and differences unchanged).
    shifted = table[table["multiple"] == 1].copy()
    shifted["multiple"] = 2
    shifted["map_at_r"] += 0.01
    shifted.to_csv(results / "budget_check.csv", index=False)
    assert main(["claims", str(cf), "--results", str(results), "--quiet"]) == 0
    doc = json.loads((results / "claims.json").read_text())
    assert doc["budget_check"]["kendall_tau"] == 1.0 and doc["budget_check"]["moved"] == []
    for v in doc["verdicts"]:
        assert v["stable"] is True and v["verdict_at_multiple"] == v["verdict"], v
    # Unstable: the last cell at 1x scores far above the others at 2x.
    last = finals.groupby("cell")["map_at_r"].mean().sort_values().index[0]
    unstable = shifted.copy()
    unstable.loc[unstable["cell"] == last, "map_at_r"] = 0.95
    unstable.to_csv(results / "budget_check.csv", index=False)
    assert main(["claims", str(cf), "--results", str(results), "--quiet"]) == 0
    doc = json.loads((results / "claims.json").read_text())
    assert doc["budget_check"]["moved"][0] != last and last in doc["budget_check"]["moved"]
    md = (results / "claims.md").read_text()
    assert "**The table's ranking is not stable**" in md
    for v in doc["verdicts"]:
        assert v["stable"] is False and v["stability"].startswith("not stable at 2x the budget"), v
        assert f"| **{v['verdict']}** | not stable at 2x" in md
        if last in v["records"]["cells"]:
            assert f"{last} (rank" in v["stability"]
    # Incomplete: a cell not yet checked (a check still running) moves nothing, so it is "not yet shown", not
    # "not stable", on the claims and on the leaderboard.
    shifted[shifted["cell"] != last].to_csv(results / "budget_check.csv", index=False)
    assert main(["claims", str(cf), "--results", str(results), "--quiet"]) == 0
    md = (results / "claims.md").read_text()
    assert "**The table's ranking is not yet shown stable** (the check is incomplete)" in md and last in md
    doc = json.loads((results / "claims.json").read_text())
    for v in doc["verdicts"]:  # nothing moved among the checked cells: no verdict is called unstable
        assert v["stable"] is False and v["check_pending"] is True, v
        assert v["stability"].startswith("not yet shown stable at 2x the budget: the budget check lacks"), v
    assert "not stable at 2x" not in md
    capsys.readouterr()  # the earlier calls' terminal tables
    assert main(["claims", str(cf), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "not yet shown (check incomplete)" in out and "NOT STABLE" not in out
    assert main(["leaderboard", str(results), "--quiet"]) == 0
    board = (results / "leaderboard.md").read_text()
    assert "the ranking is not yet shown stable when every cell trains longer" in board
    assert "the ranking is not stable when" not in board


# --------------------------------------------------------------------------- hand-computed cases


def test_ranking_ties_break_by_cell_id_and_nan_last() -> None:
    assert budget.ranking({"b": 0.5, "a": 0.5, "c": 0.7, "d": math.nan}) == {"c": 1, "a": 2, "b": 3, "d": 4}


@pytest.mark.parametrize(
    "before, after, tau, moved",
    [
        ({"a": 0.5, "b": 0.4, "c": 0.3, "d": 0.2}, {"a": 0.6, "b": 0.5, "c": 0.4, "d": 0.3}, 1.0, []),
        # one adjacent swap of four: 5 concordant and 1 discordant pair of 6, tau = (5 - 1) / 6
        ({"a": 0.5, "b": 0.4, "c": 0.3, "d": 0.2}, {"a": 0.5, "b": 0.3, "c": 0.4, "d": 0.2}, 2 / 3, ["b", "c"]),
        # reversed: every pair discordant; the middle one of three keeps its rank
        ({"a": 0.3, "b": 0.2, "c": 0.1}, {"a": 0.1, "b": 0.2, "c": 0.3}, -1.0, ["a", "c"]),
        # the first goes last of four: 3 discordant pairs of 6, tau = (3 - 3) / 6
        ({"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6}, {"a": 0.1, "b": 0.8, "c": 0.7, "d": 0.6}, 0.0, ["a", "b", "c", "d"]),
        ({"a": 0.9}, {"a": 0.1}, math.nan, []),
    ],
)
def test_kendall_tau_and_moved_cells(
    before: dict[str, float], after: dict[str, float], tau: float, moved: list[str]
) -> None:
    r1, r2 = budget.ranking(before), budget.ranking(after)
    got = budget.kendall_tau(r1, r2)
    assert (math.isnan(got) and math.isnan(tau)) or got == pytest.approx(tau)
    assert budget.moved(r1, r2) == moved


def _results(
    finals: dict[str, list[float]], later: dict[str, list[float]], params: dict[str, str] | None = None
) -> Results:
    """Finals and a 2x check in memory (parameters `{}` unless ``params`` names a cell's at the check)."""
    rows = [
        {"cell": c, "seed": s, "map_at_r": v, "val_map_at_r": 0.5, "state": "COMPLETE", "params": "{}"}
        for c, vs in finals.items()
        for s, v in enumerate(vs)
    ]
    check = [
        {
            "protocol_hash": "h",
            "cell": c,
            "seed": s,
            "multiple": 2,
            "iterations": 60,
            "map_at_r": v,
            "state": "COMPLETE",
            "params": (params or {}).get(c, "{}"),
        }
        for c, vs in later.items()
        for s, v in enumerate(vs)
    ]
    return Results(
        Path("mem"),
        {"protocol": "p", "protocol_hash": "h", "primary_metric": "map_at_r"},
        pd.DataFrame(rows),
        budget_check=pd.DataFrame(check),
    )


def test_change_is_the_paired_mean_difference_and_a_missing_cell_is_not_stable() -> None:
    finals = {"A": [0.50, 0.60, 0.55], "B": [0.40, 0.45, 0.42], "C": [0.30, 0.31, 0.29]}
    later = {"A": [0.52, 0.63, 0.56], "B": [0.47, 0.50, 0.49]}
    check = budget.check(_results(finals, later))
    assert check is not None and check.multiple == 2 and check.iterations == 60
    d = check.changes["A"].change
    ci = st.ttest_rel(later["A"], finals["A"]).confidence_interval(0.95)
    assert d.test == "paired" and d.diff == pytest.approx(0.02) and (d.low, d.high) == pytest.approx((ci.low, ci.high))
    assert check.tau == 1.0 and check.moved == [] and check.missing == ["C"] and not check.stable
    full = budget.check(_results(finals, {**later, "C": [0.9, 0.9, 0.9]}))
    assert full is not None and full.moved == ["A", "B", "C"] and full.tau == pytest.approx(-1 / 3)
    # A cell whose check ran other parameters (it was --redo'ne since) is not checked.
    stale = budget.check(_results(finals, {**later, "C": [0.3] * 3}, params={"B": '{"loss.margin": 0.2}'}))
    assert stale is not None and stale.missing == ["B"] and not stale.stable
    assert (
        budget.check(
            Results(
                Path("mem"), {"primary_metric": "map_at_r"}, pd.DataFrame([{"cell": "A", "seed": 0, "map_at_r": 0.5}])
            )
        )
        is None
    )
