"""What a verdict costs: the tuning/seed variance split and the power of a design, against simulation and a real
tiny sweep with tuning.repeats: 2 (`dmlbench variance`, `dmlbench power`, the leaderboard's split and compute)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _sweeps import TINY, sweep, sweep_base  # noqa: F401  (fixtures)
from scipy import stats as st

from bench.cli import main
from bench.reports import variance

# ---------------------------------------------------------------------------------------- the estimator


def _nested(rng: np.random.Generator, sims: int, draws: int, seeds: int, s_t: float, s_e: float) -> np.ndarray:
    """``sims`` simulated cells: y[sim, r, s] = 0.5 + t_r + e_rs."""
    t = rng.normal(0, s_t, (sims, draws, 1))
    return 0.5 + t + rng.normal(0, s_e, (sims, draws, seeds))


@pytest.mark.parametrize(
    ("draws", "seeds", "s_t", "s_e"), [(3, 3, 0.02, 0.01), (5, 2, 0.005, 0.015), (3, 5, 0.0, 0.01)]
)
def test_the_anova_estimates_are_unbiased_for_known_variances(draws: int, seeds: int, s_t: float, s_e: float) -> None:
    rng = np.random.default_rng(0)
    ys = _nested(rng, 6000, draws, seeds, s_t, s_e)
    splits = [variance.split(y) for y in ys]
    seed_var = np.array([s.seed_var for s in splits])
    raw = np.array([s.tuning_var_raw for s in splits])
    # each mean is within 4 standard errors of the truth (the estimators' own spread over the simulations)
    assert abs(seed_var.mean() - s_e**2) < 4 * seed_var.std() / math.sqrt(len(ys))
    assert abs(raw.mean() - s_t**2) < 4 * raw.std() / math.sqrt(len(ys))
    # the check has teeth: the naive between-draw variance is biased up by s_e^2 / S
    naive = np.array([y.mean(axis=1).var(ddof=1) for y in ys])
    assert naive.mean() - s_t**2 > 4 * naive.std() / math.sqrt(len(ys))
    # the reported s_t^2 is never negative; at s_t = 0 it is often exactly 0
    assert min(s.tuning_var for s in splits) >= 0
    if s_t == 0:
        assert np.mean([s.tuning_var == 0 for s in splits]) > 0.3


def test_the_estimates_stay_unbiased_when_a_draw_lost_seeds() -> None:
    """Failed seeds leave draws of unequal size: s_t^2 subtracts s_e^2 times the mean of 1/n_r."""
    rng = np.random.default_rng(1)
    s_t, s_e = 0.01, 0.02
    ys = _nested(rng, 8000, 4, 4, s_t, s_e)
    splits = [variance.split([y[0], y[1], y[2, :2], y[3, :3]]) for y in ys]
    raw = np.array([s.tuning_var_raw for s in splits])
    seed_var = np.array([s.seed_var for s in splits])
    assert abs(raw.mean() - s_t**2) < 4 * raw.std() / math.sqrt(len(ys))
    assert abs(seed_var.mean() - s_e**2) < 4 * seed_var.std() / math.sqrt(len(ys))
    assert splits[0].seeds == pytest.approx(1 / np.mean([1 / 4, 1 / 4, 1 / 2, 1 / 3]))


def test_the_tuning_share_interval_and_the_seed_sd_interval_cover_at_their_level() -> None:
    rng = np.random.default_rng(2)
    s_t, s_e = 0.015, 0.01
    ys = _nested(rng, 4000, 4, 3, s_t, s_e)
    splits = [variance.split(y) for y in ys]
    share = s_t**2 / (s_t**2 + s_e**2)
    covered = np.mean([s.share_low <= share <= s.share_high for s in splits])
    covered_e = np.mean([s.seed_var_low <= s_e**2 <= s.seed_var_high for s in splits])
    assert 0.935 < covered < 0.965, covered
    assert 0.935 < covered_e < 0.965, covered_e


def test_a_split_needs_two_draws_and_a_seed_degree_of_freedom() -> None:
    one = variance.split([[0.5, 0.6, 0.55]])
    assert one.draws == 1 and math.isnan(one.tuning_var_raw) and one.seed_var == pytest.approx(0.0025)
    single = variance.split([[0.5], [0.6], [0.7]])
    assert single.seed_df == 0 and math.isnan(single.seed_var)
    constant = variance.split([[0.5, 0.5], [0.7, 0.7]])  # a deterministic trunk: all of it is tuning
    assert constant.seed_var == 0 and constant.share == 1.0


# ---------------------------------------------------------------------------------------- the power formula


def _paired_power(rng: np.random.Generator, n: int, effect: float, sd: float, reps: int = 40000) -> float:
    """Simulated power of the two-sided paired t-test at alpha 0.05 over ``n`` differences N(effect, sd)."""
    d = rng.normal(effect, sd, (reps, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    return float(np.mean(np.abs(t) > st.t.ppf(0.975, n - 1)))


@pytest.mark.parametrize(("effect", "sd"), [(0.02, 0.03), (0.02, 0.015), (0.01, 0.02)])
def test_the_units_needed_reach_80_percent_power_and_one_fewer_does_not(effect: float, sd: float) -> None:
    rng = np.random.default_rng(3)
    n = variance.draws_needed(sd, effect)
    achieved = _paired_power(rng, n, effect, sd)
    assert 0.79 < achieved < 0.88, (n, achieved)
    assert _paired_power(rng, n - 1, effect, sd) < 0.81 or n == 2
    # the t correction matters at small n: the normal formula alone falls short there
    z = max(2, math.ceil((1.959964 + 0.841621) ** 2 * (sd / effect) ** 2))
    if z < n:
        assert _paired_power(rng, z, effect, sd) < 0.79


def test_a_design_of_draws_and_seeds_has_its_power_on_the_nested_model() -> None:
    """Two cells, each draw's score its tuning effect plus S seeds (common random numbers shared by the
    cells); the paired t over the draws' mean differences, at the design's draws, has about 80% power."""
    rng = np.random.default_rng(4)
    s_t, s_e, shared, effect = 0.01, 0.02, 0.012, 0.015
    # the seed noise of each cell: a part common to both cells (the same seed), and its own part
    own = math.sqrt(s_e**2 - shared**2)
    # the split of the difference: tuning effects independent between cells, the shared seed part cancels
    diff = variance.Split(0, 0, effect, 2 * own**2, 0, 2 * s_t**2)
    for seeds in (1, 3, 5):
        (design,) = variance.designs(diff, effect, 4, 400, 100, seeds=[seeds])
        r, reps = design.draws, 20000
        common = rng.normal(0, shared, (reps, r, seeds))
        a = effect + rng.normal(0, s_t, (reps, r, 1)) + common + rng.normal(0, own, (reps, r, seeds))
        b = rng.normal(0, s_t, (reps, r, 1)) + common + rng.normal(0, own, (reps, r, seeds))
        d = (a - b).mean(axis=2)
        t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(r))
        achieved = float(np.mean(np.abs(t) > st.t.ppf(0.975, r - 1)))
        assert 0.79 < achieved < 0.9, (seeds, r, achieved)
        assert design.runs == r * (4 + seeds) and design.iterations == r * (400 + seeds * 100)


def test_a_bad_effect_is_refused() -> None:
    from bench.errors import BenchError

    for bad in (0.0, -0.1, math.nan, math.inf):
        with pytest.raises(BenchError):
            variance.draws_needed(0.01, bad)


# ---------------------------------------------------------------------------------------- a real sweep


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    """A real tiny sweep of three cells with tuning.repeats: 2 (two draws of three final seeds)."""
    from _sweeps import LOSSES

    root = tmp_path_factory.mktemp("repeats")
    text = TINY.format(name="tiny-repeats", iterations=30, losses=LOSSES)
    text = text.replace("tuning: {trials: 1, startup_trials: 1}", "tuning: {trials: 1, startup_trials: 1, repeats: 2}")
    assert "repeats: 2" in text
    proto = root / "tiny-repeats.yaml"
    proto.write_text(text)
    argv = ["run", str(proto), "--results-dir", str(root / "results"), "--data-root", str(data_root)]
    argv += ["--storage", f"sqlite:///{root / 'optuna.db'}", "--tracking-uri", str(root / "mlflow.db"), "--quiet"]
    assert main(argv) == 0
    return root / "results" / "tiny-repeats"


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_variance_on_a_real_sweep_is_the_anova_of_its_finals(repeated: Path, capsys) -> None:
    finals = pd.read_csv(repeated / "finals.csv")
    rows = _json(capsys, ["variance", str(repeated), "--format", "json"])
    assert isinstance(rows, list) and len(rows) == 3
    for row in rows:
        f = finals[finals.cell == row["cell"]]
        groups = [g.sort_values("seed").map_at_r.to_numpy() for _, g in f.groupby("draw")]
        assert row["draws"] == 2 and row["seeds"] == pytest.approx(3)
        within = np.mean([g.var(ddof=1) for g in groups])
        between = np.var([g.mean() for g in groups], ddof=1)
        assert row["seed_sd"] == pytest.approx(math.sqrt(within))
        assert row["tuning_sd"] == pytest.approx(math.sqrt(max(0.0, between - within / 3)))
        assert row["tuning_var_unbiased"] == pytest.approx(between - within / 3)
        assert row["mean"] == pytest.approx(f.map_at_r.mean())
    # the same rows as CSV, and the table names its method
    assert main(["variance", str(repeated), "--format", "csv", "--metric", "precision_at_1"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(table) == 3 and {r["metric"] for r in table} == {"precision_at_1"}
    assert main(["variance", str(repeated), "--cells", "contrastive+none"]) == 0
    out = capsys.readouterr().out
    assert "contrastive+none" in out and "triplet+batch_hard" not in out and "one-way random-effects ANOVA" in out


@pytest.mark.slow
def test_power_on_a_real_sweep_sizes_each_design_from_its_split(repeated: Path, capsys) -> None:
    finals = pd.read_csv(repeated / "finals.csv")
    trials = pd.read_csv(repeated / "trials.csv")
    a, b = "triplet+batch_hard", "contrastive+none"
    rows = _json(capsys, ["power", str(repeated), "--effect", "0.02", "--cells", f"{a},{b}", "--format", "json"])
    assert isinstance(rows, list)
    assert [r["seeds"] for r in rows] == [1, 2, 3, 5, 10]  # the default choices; the sweep's 3 among them
    fa = finals[finals.cell == a].set_index(["draw", "seed"]).map_at_r
    fb = finals[finals.cell == b].set_index(["draw", "seed"]).map_at_r
    d = (fa - fb).dropna()
    groups = [g.to_numpy() for _, g in d.groupby(level="draw")]
    s_e2 = np.mean([g.var(ddof=1) for g in groups])
    s_t2 = max(0.0, np.var([g.mean() for g in groups], ddof=1) - s_e2 / 3)
    tuning_it = trials[trials.cell == a].iterations.sum() / 2
    for r in rows:
        assert r["observed_difference"] == pytest.approx(d.mean()) and r["pairs"] == 6
        sd = math.sqrt(s_t2 + s_e2 / r["seeds"])
        assert r["draw_sd"] == pytest.approx(sd)
        assert r["draws"] == variance.draws_needed(sd, 0.02)
        assert r["iterations_per_cell"] == pytest.approx(r["draws"] * (tuning_it + r["seeds"] * 30))
    assert sum(r["cheapest"] for r in rows) == 1
    cheapest = next(r for r in rows if r["cheapest"])
    assert cheapest["iterations_per_cell"] == min(r["iterations_per_cell"] for r in rows)
    # each cell alone: every variance doubled (two independent cells like it)
    alone = _json(capsys, ["power", str(repeated), "--effect", "0.05", "--seeds", "2,4", "--format", "json"])
    assert isinstance(alone, list) and {r["comparison"] for r in alone} == set(finals.cell)
    assert sorted({r["seeds"] for r in alone}) == [2, 3, 4]
    rows_v = {r["cell"]: r for r in _json(capsys, ["variance", str(repeated), "--format", "json"])}
    for r in alone:
        v = rows_v[r["comparison"]]
        assert r["draw_sd"] == pytest.approx(math.sqrt(2 * v["tuning_sd"] ** 2 + 2 * v["seed_sd"] ** 2 / r["seeds"]))
    assert main(["power", str(repeated), "--effect", "0.02"]) == 0
    assert "cheapest" in capsys.readouterr().out


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dmlbench: error: "), lines
    assert captured.out == ""
    return lines[0]


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(repeated: Path, sweep: Path, capsys, tmp_path: Path) -> None:  # noqa: F811
    assert "tuning.repeats: 1" in _error(capsys, ["variance", str(sweep)])
    assert "invisible" in _error(capsys, ["power", str(sweep), "--effect", "0.02"])
    assert "no cell 'nope+none'" in _error(capsys, ["variance", str(repeated), "--cells", "nope+none"])
    assert "exactly two" in _error(capsys, ["power", str(repeated), "--effect", "0.02", "--cells", "contrastive+none"])
    assert "two different" in _error(capsys, ["power", str(repeated), "--effect", "0.02", "--cells", "a+b,a+b"])
    assert "--effect" in _error(capsys, ["power", str(repeated), "--effect", "0"])
    assert "--effect" in _error(capsys, ["power", str(repeated), "--effect", "nan"])
    assert "--power" in _error(capsys, ["power", str(repeated), "--effect", "0.02", "--power", "1.2"])
    assert "--seeds" in _error(capsys, ["power", str(repeated), "--effect", "0.02", "--seeds", "0,3"])
    assert "no metric 'auc'" in _error(capsys, ["variance", str(repeated), "--metric", "auc"])
    assert "does not exist" in _error(capsys, ["variance", str(tmp_path / "absent")])


# ---------------------------------------------------------------------------------------- the leaderboard


@pytest.mark.slow
def test_the_leaderboard_shows_the_split_and_the_compute(repeated: Path, capsys, tmp_path: Path) -> None:
    md, page = tmp_path / "lb.md", tmp_path / "lb.html"
    common = ["--markdown", str(md), "--html", str(page)]
    doc = _json(capsys, ["leaderboard", str(repeated), *common, "--format", "json"])
    assert isinstance(doc, dict)
    trials, finals = pd.read_csv(repeated / "trials.csv"), pd.read_csv(repeated / "finals.csv")
    split = {r["cell"]: r for r in _json(capsys, ["variance", str(repeated), "--format", "json"])}
    for row in doc["cells"]:
        cell = row["cell"]
        t, f = trials[trials.cell == cell], finals[finals.cell == cell]
        assert row["device_s"] == pytest.approx(t.wall_time_s.sum() + f.wall_time_s.sum())
        assert row["device"] == f.device.iloc[0] and row["device"].startswith("cpu: ") and "thread" in row["device"]
        assert row["iterations"] == t.iterations.sum() + f.iterations.sum()
        assert row["tuning_sd"] == pytest.approx(split[cell]["tuning_sd"])
        assert row["seed_sd"] == pytest.approx(split[cell]["seed_sd"])
    compute = doc["compute"]
    assert compute["device_s"] == pytest.approx(trials.wall_time_s.sum() + finals.wall_time_s.sum())
    assert compute["iterations"] == trials.iterations.sum() + finals.iterations.sum()
    assert compute["devices"] == sorted(set(finals.device))
    text = md.read_text()
    head = next(line for line in text.splitlines() if line.startswith("| rank"))
    for column in ("s_t (map_at_r)", "s_e", "tuning share", "device-s", "device"):
        assert f"| {column} |" in head
    assert (
        f"compute: {int(compute['iterations']):,} training iterations and {compute['device_s']:,.0f} device-seconds"
        in text
    )
    assert "variance split of `map_at_r` over the tuning draws" in text
    assert "device-s" in page.read_text() and "tuning share" in page.read_text()
    assert main(["leaderboard", str(repeated), *common, "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {"device_s", "device", "tuning_sd", "seed_sd", "tuning_share"} <= set(table[0])


@pytest.mark.slow
def test_a_leaderboard_without_draws_has_compute_but_no_split(sweep: Path, capsys, tmp_path: Path) -> None:  # noqa: F811
    md = tmp_path / "lb.md"
    doc = _json(
        capsys,
        ["leaderboard", str(sweep), "--markdown", str(md), "--html", str(tmp_path / "lb.html"), "--format", "json"],
    )
    assert isinstance(doc, dict)
    assert all("tuning_sd" not in r and r["device_s"] > 0 for r in doc["cells"])
    head = next(line for line in md.read_text().splitlines() if line.startswith("| rank"))
    assert "tuning share" not in head and "| device-s |" in head
