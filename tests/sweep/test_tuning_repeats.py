"""tuning.repeats: the whole tuning stage drawn R times, each draw's winner tested, intervals over the draws."""

from __future__ import annotations

import math

import mlflow
import numpy as np
import optuna
import pandas as pd
import pytest
from _shared import RUNNER_TINY
from _shared import sweep_options as _options
from scipy import stats as st

from bench.errors import BenchError
from bench.plan import plan
from bench.protocol import parse_protocol
from bench.reports import leaderboard, source
from bench.stats import compare
from bench.sweep.runner import run_protocol
from bench.sweep.seeds import for_draw
from bench.sweep.tuning import open_storage

CELL, OTHER = "triplet+batch_hard", "triplet+none"
DRAWS = 3


def _text(repeats: int | None = DRAWS, iterations: int = 12) -> str:
    text = RUNNER_TINY.replace("ITERATIONS", str(iterations))
    if repeats is not None:
        text = text.replace("tuning: {trials: 2}", f"tuning: {{trials: 2, repeats: {repeats}}}")
    return text


def test_one_draw_is_the_default_and_keeps_the_hash() -> None:
    plain = parse_protocol(_text(None))
    assert parse_protocol(_text(1)).hash == plain.hash
    repeated = parse_protocol(_text())
    assert repeated.hash != plain.hash and repeated.shared_hash != plain.shared_hash
    b, b1 = plan(repeated).budget, plan(plain).budget
    assert (b.draws, b.trial_count, b.final_count) == (DRAWS, 2 * DRAWS, 2 * DRAWS)
    assert b.total_iterations == DRAWS * b1.total_iterations
    from bench.commands.plan import format_plan

    text = format_plan(plan(repeated))
    assert (
        f"budget, the same for every cell: {DRAWS} draws x (2 trials x 1 fold(s) x 12 iterations + 2 seeds x 12" in text
    )
    assert f"repeated in {DRAWS} independent draws (tuning.repeats)" in text
    assert "draws x" not in format_plan(plan(plain))


def test_draw_zero_is_the_protocol_and_other_draws_have_their_own_seed() -> None:
    p = parse_protocol(_text())
    assert for_draw(p, 0) is p
    seeds = {for_draw(p, r).seed for r in range(4)}
    assert len(seeds) == 4
    assert for_draw(p, 2).hash == p.hash and for_draw(p, 2).text == p.text  # records stay the protocol's


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "two"])
def test_a_bad_repeats_is_refused(bad: str) -> None:
    with pytest.raises(BenchError) as e:
        parse_protocol(_text(None).replace("tuning: {trials: 2}", f"tuning: {{trials: 2, repeats: {bad}}}"))
    assert "repeats" in str(e.value)


def test_budget_check_refuses_repeats_in_one_line(tmp_path) -> None:
    from bench.sweep.budget_check import budget_check

    with pytest.raises(BenchError, match="tuning.repeats") as e:
        budget_check(parse_protocol(_text()), results_dir=tmp_path)
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, data_root) -> dict:
    out = {}
    for name, repeats in (("repeated", DRAWS), ("plain", None)):
        root = tmp_path_factory.mktemp(name)
        path = root / "tiny.yaml"
        path.write_text(_text(repeats))
        out[name] = {"root": root, "path": path, "outcome": run_protocol(path, _options(root, data_root))}
        out[name]["results"] = root / "results" / "tiny"
    return out


@pytest.mark.slow
def test_every_draw_tunes_and_tests_with_the_same_budget(sweeps) -> None:
    r = sweeps["repeated"]
    assert r["outcome"].manifest["refused"] == {}
    trials = pd.read_csv(r["results"] / "trials.csv")
    finals = pd.read_csv(r["results"] / "finals.csv")
    for cell in (CELL, OTHER):
        t, f = trials[trials.cell == cell], finals[finals.cell == cell]
        assert sorted(zip(t.draw, t.trial)) == [(d, s) for d in range(DRAWS) for s in range(2)]
        assert sorted(zip(f.draw, f.seed)) == [(d, s) for d in range(DRAWS) for s in (0, 1)]
        assert (f.state == "COMPLETE").all() and (f.iterations == 12).all()
        # each draw retrains its own winner: the parameters of its best trial
        for d in range(DRAWS):
            td = t[(t.draw == d) & (t.state == "COMPLETE")]
            best = td.loc[td.value.idxmax(), "params"]
            assert set(f[f.draw == d].params) == {best}
    # the Optuna history: each draw's best so far, its own
    hist = pd.read_csv(r["results"] / "artifacts" / CELL / "optuna_history.csv")
    assert list(hist.columns) == ["draw", "trial", "state", "value", "best_so_far"]
    for d in range(DRAWS):
        h = hist[hist.draw == d]
        assert list(h.best_so_far) == list(h.value.cummax())
        # the samplers differ between draws: their first trials drew other parameters
    first = trials[(trials.cell == CELL) & (trials.trial == 0)].sort_values("draw").params
    assert first.nunique() == DRAWS
    # the cell whose every trial diverges, in every draw: a labelled row, never a missing one
    summary = pd.read_csv(r["results"] / "summary.csv").set_index("cell")
    assert summary.loc["contrastive-diverging+none", "n_seeds"] == 0
    assert summary.loc["contrastive-diverging+none", "n_trials"] == 2 * DRAWS


@pytest.mark.slow
def test_draw_zero_is_the_unrepeated_sweep(sweeps) -> None:
    rep = pd.read_csv(sweeps["repeated"]["results"] / "finals.csv")
    plain = pd.read_csv(sweeps["plain"]["results"] / "finals.csv")
    for cell in (CELL, OTHER):
        a = rep[(rep.cell == cell) & (rep.draw == 0)].sort_values("seed")
        b = plain[plain.cell == cell].sort_values("seed")
        assert list(a.params) == list(b.params)
        assert a.map_at_r.to_numpy() == pytest.approx(b.map_at_r.to_numpy(), abs=1e-9)
    # the other draws trained from other seeds: the same seed id, another value
    a = rep[rep.cell == CELL].set_index(["draw", "seed"]).map_at_r
    assert a[(1, 0)] != pytest.approx(a[(0, 0)], abs=1e-9) or a[(2, 0)] != pytest.approx(a[(0, 0)], abs=1e-9)


@pytest.mark.slow
def test_common_random_numbers_hold_within_a_draw_and_differ_between_draws(sweeps) -> None:
    """A trial's fold run is seeded by (draw, slot, fold): the same in every cell, another in every draw."""
    root = sweeps["repeated"]["root"]
    from bench.stores.tracking import resolve_tracking_uri

    client = mlflow.MlflowClient(tracking_uri=resolve_tracking_uri(str(root / "mlruns")))
    experiment = client.get_experiment_by_name("dmlbench/tiny")
    found = client.search_runs([experiment.experiment_id], filter_string="tags.kind = 'fold'", max_results=5000)
    runs = pd.DataFrame(
        [
            {"tags.trial": r.data.tags["trial"], "tags.cell": r.data.tags["cell"], "tags.draw": r.data.tags.get("draw")}
            | {"params.seed": r.data.params["seed"]}
            for r in found
        ]
    )
    runs = runs[runs["tags.trial"] == "0"]
    runs = runs.assign(draw=runs["tags.draw"].fillna("0"))
    seeds = runs.groupby(["draw", "tags.cell"])["params.seed"].first().unstack()
    assert (seeds.nunique(axis=1) == 1).all()  # every cell, one seed per draw
    assert seeds.iloc[:, 0].nunique() == DRAWS  # another per draw


@pytest.mark.slow
def test_intervals_and_tests_are_over_the_draws_means(sweeps) -> None:
    r = sweeps["repeated"]
    finals = pd.read_csv(r["results"] / "finals.csv")
    res = source.load(r["results"])
    for cell in (CELL, OTHER):
        means = finals[finals.cell == cell].groupby("draw").map_at_r.mean().to_numpy()
        assert res.values(cell, "map_at_r") == pytest.approx(means)
        assert res.seeds(cell) == [f"draw {d}" for d in range(DRAWS)]
        # the summary's interval: Student's t over the 3 draw means (2 degrees of freedom), not over 6 runs
        half = st.t.ppf(0.975, DRAWS - 1) * means.std(ddof=1) / math.sqrt(DRAWS)
        row = pd.read_csv(r["results"] / "summary.csv").set_index("cell").loc[cell]
        assert row.map_at_r_mean == pytest.approx(means.mean())
        assert row.map_at_r_ci_low == pytest.approx(means.mean() - half)
        assert row.map_at_r_ci_high == pytest.approx(means.mean() + half)
        board = {b.cell: b for b in leaderboard.build(res).rows}[cell]
        assert board.metrics["map_at_r"].low == pytest.approx(max(0.0, means.mean() - half))
    # two cells are paired draw by draw (the same draw seeds): a paired t over 3 differences
    d = compare(res.values(CELL, "map_at_r"), res.values(OTHER, "map_at_r"), res.seeds(CELL), res.seeds(OTHER))
    diffs = res.values(CELL, "map_at_r") - res.values(OTHER, "map_at_r")
    assert d.test == "paired" and d.diff == pytest.approx(float(np.mean(diffs)))
    # a cell against the floor's seeds is never paired by a coincidence of numbers
    floor, floor_seeds = res.floor_values("map_at_r")
    assert compare(res.values(CELL, "map_at_r"), floor, res.seeds(CELL), floor_seeds).test == "Welch"
    text = leaderboard.markdown(leaderboard.build(res))
    assert f"over the means of {DRAWS} independent tuning draws" in text


@pytest.mark.slow
def test_a_rerun_resumes_to_the_same_tables_and_mlflow_rebuilds_them(sweeps, data_root, tmp_path) -> None:
    from bench.reports import mlflow_source

    r = sweeps["repeated"]
    before = pd.read_csv(r["results"] / "finals.csv")
    again = run_protocol(r["path"], _options(r["root"], data_root))
    assert again.recorded_iterations == again.total_iterations  # every draw's records were found: nothing trained again
    after = pd.read_csv(r["results"] / "finals.csv")
    pd.testing.assert_frame_equal(before, after)
    storage = open_storage(f"sqlite:///{r['root'] / 'optuna.db'}")
    names = optuna.get_all_study_names(storage)
    assert sum(n.endswith(f":{CELL}:final:draw2") for n in names) == 1
    rebuilt = mlflow_source.load("tiny", tmp_path / "lb", tracking_uri=str(r["root"] / "mlruns"))
    res = source.load(r["results"])
    for cell in (CELL, OTHER):
        assert rebuilt.values(cell, "map_at_r") == pytest.approx(res.values(cell, "map_at_r")), cell
        assert rebuilt.seeds(cell) == res.seeds(cell)


@pytest.mark.slow
def test_a_claim_is_judged_over_the_draws_and_says_so(sweeps, tmp_path) -> None:
    from bench.reports import claims

    path = tmp_path / "claims.yaml"
    path.write_text(
        "protocol: tiny\nmetric: map_at_r\nclaims:\n"
        f"  - {{id: hard-beats-none, kind: beats, a: {CELL}, b: {OTHER}, source: test, statement: test}}\n"
    )
    res = source.load(sweeps["repeated"]["results"])
    (v,) = claims.evaluate(claims.parse(path), res)
    caveat = claims.tuning_caveat(res)
    assert f"over {DRAWS} independent tuning draws" in caveat and caveat != claims.TUNING_CAVEAT
    text = claims.markdown(claims.parse(path), res, [v])
    assert caveat in text and claims.TUNING_CAVEAT not in text
    if v.testable:  # a tiny sweep's cells may sit at the floor, which makes the claim not testable
        diffs = res.values(CELL, "map_at_r") - res.values(OTHER, "map_at_r")
        half = st.t.ppf(0.975, DRAWS - 1) * diffs.std(ddof=1) / math.sqrt(DRAWS)
        assert v.effect == pytest.approx(diffs.mean())
        assert (v.low, v.high) == pytest.approx((diffs.mean() - half, diffs.mean() + half))
        assert caveat in v.reason
