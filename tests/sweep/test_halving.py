"""Successive halving (tuning.strategy) and a seed range (final.seeds {min, max, half_width}), end to end: a
real sweep on a few Omniglot classes, killed and resumed, its budgets audited."""

from __future__ import annotations

import json
import signal
import sqlite3
import time

import optuna
import pandas as pd
import pytest
from _shared import RUNNER_TINY, cli, run_args, trials_in_state

from bench.plan import plan
from bench.plan.seeds import seeds_wanted
from bench.protocol import parse_protocol
from bench.sweep.budget_audit import audit
from bench.sweep.records import Records, collect
from bench.sweep.tables import read
from bench.sweep.tuning import open_storage

STRATEGY = "tuning: {trials: 4, strategy: {type: successive_halving, min_iterations: 4, eta: 2}}"
SEEDS = "final: {seeds: {min: 2, max: 4, half_width: HALF}}"
RUNGS = ((4, 4), (2, 8), (1, 12))  # configurations x iterations: slots 0-3, 4-5, 6
CELLS = ("triplet+none", "triplet+batch_hard")  # and contrastive-diverging+none, whose every trial fails
NO_RESULT = "1 of 3 planned cell(s) have no result (contrastive-diverging+none: "


def _text(half: float) -> str:
    text = RUNNER_TINY.replace("ITERATIONS", "12").replace("tuning: {trials: 2}", STRATEGY)
    return text.replace("final: {seeds: [0, 1]}", SEEDS.replace("HALF", str(half)))


def _untimed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in frame.columns if c == "wall_time_s"])


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, data_root) -> dict:
    """The same protocol run whole, and run again killed mid-way (SIGKILL) and resumed. A half-width of 1e-6
    no cell reaches: every cell trains its range's maximum, past the minimum one seed at a time."""
    root = tmp_path_factory.mktemp("halving")
    path = root / "tiny.yaml"
    path.write_text(_text(1e-6))
    clean, killed = root / "clean", root / "killed"
    reference = cli(run_args(path, clean, data_root))
    victim = cli(run_args(path, killed, data_root))
    deadline = time.monotonic() + 300
    db = killed / "optuna.db"
    while time.monotonic() < deadline and victim.poll() is None:
        if (
            trials_in_state(db, "COMPLETE") >= 6 and trials_in_state(db, "RUNNING") >= 1
        ):  # past rung 0 of the first cell
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the sweep ended before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    resumed = cli(run_args(path, killed, data_root))
    out = {"path": path, "clean": clean, "killed": killed}
    for name, proc in (("reference", reference), ("resumed", resumed)):
        text, _ = proc.communicate(timeout=600)
        assert proc.returncode == 1 and NO_RESULT in text, text  # exit 1: the diverging cell, as planned
        out[name] = text
    return out


@pytest.mark.slow
def test_every_cell_trains_the_same_rungs_and_the_audit_passes(sweeps) -> None:
    results = sweeps["clean"] / "results" / "tiny"
    manifest = json.loads((results / "manifest.json").read_text())
    assert manifest["refused"] == {}
    assert manifest["budget"]["rungs"] == [list(r) for r in RUNGS] and manifest["budget"]["seeds_min"] == 2
    trials = pd.read_csv(results / "trials.csv")
    allotted = {}
    for cell, t in trials.groupby("cell"):
        t = t.sort_values("trial")
        assert list(t.trial) == list(range(7))
        assert list(t.budget_iterations) == [4, 4, 4, 4, 8, 8, 12]  # 1 fold a trial
        allotted[cell] = int(t.budget_iterations.sum())
    assert set(allotted.values()) == {44} and len(allotted) == 3  # the same budget in every cell, failures too
    for cell in CELLS:
        t = trials[trials.cell == cell].set_index("trial")
        assert (t.state == "COMPLETE").all() and list(t.iterations) == [4, 4, 4, 4, 8, 8, 12]
        # rung 1 trains rung 0's best two configurations, rung 2 rung 1's best (ties: the lower slot)
        r0 = t.loc[0:3]
        order = sorted(r0.index, key=lambda s: (-r0.value[s], s))
        assert list(t.loc[4:5].params) == [r0.params[s] for s in order[:2]]
        r1 = t.loc[4:5]
        best1 = r1.params[min(r1.index, key=lambda s: (-r1.value[s], s))]
        assert t.params[6] == best1
    # the diverging cell: rung 0 fails, the later rungs record that nothing was promoted, nothing trained
    d = trials[trials.cell == "contrastive-diverging+none"].set_index("trial")
    assert (d.state == "FAIL").all() and list(d.iterations[4:]) == [0, 0, 0]
    assert d.reason[4].startswith("nothing to promote")


@pytest.mark.slow
def test_a_promoted_configuration_repeats_its_shorter_run(sweeps) -> None:
    """Rung i + 1 retrains the configuration from its start with the seed of its rung-0 slot: its first
    iterations are rung i's run (the records say which rung-0 slot seeds it)."""
    storage = open_storage(f"sqlite:///{sweeps['clean'] / 'optuna.db'}")
    p = plan(parse_protocol(sweeps["path"].read_text()).with_data(_data(sweeps)))
    from bench.sweep.tuning import study_name

    for cell in (c for c in p.cells if c.id in CELLS):
        study = optuna.load_study(study_name=study_name(p.protocol, cell), storage=storage)
        done = {t.user_attrs["slot"]: t for t in study.get_trials() if t.state.name == "COMPLETE"}
        for slot in (4, 5, 6):
            t = done[slot]
            origin = done[t.user_attrs["seed_slot"]]
            assert origin.user_attrs["slot"] < 4 and origin.params == t.params
            assert t.intermediate_values == {RUNGS[t.user_attrs["rung"]][1]: t.value}  # the rung's report


@pytest.mark.slow
def test_seeds_past_the_minimum_follow_the_rule_and_the_finals_use_the_top_rungs_winner(sweeps) -> None:
    results = sweeps["clean"] / "results" / "tiny"
    finals = pd.read_csv(results / "finals.csv")
    trials = pd.read_csv(results / "trials.csv")
    for cell in CELLS:
        f = finals[finals.cell == cell].sort_values("seed")
        values = list(f.map_at_r)
        assert list(f.seed) == [0, 1, 2, 3] and seeds_wanted(values, 2, 4, 1e-6) == 4
        top = trials[(trials.cell == cell) & (trials.trial == 6)]
        assert set(f.params) == set(top.params)  # the top rung's only configuration
    summary = pd.read_csv(results / "summary.csv").set_index("cell")
    assert list(summary.loc[list(CELLS), "n_seeds"]) == [4, 4]


@pytest.mark.slow
def test_a_killed_sweep_resumes_to_the_same_tables(sweeps) -> None:
    a, b = read(sweeps["clean"] / "results" / "tiny"), read(sweeps["killed"] / "results" / "tiny")
    for name in ("trials", "finals", "summary"):
        pd.testing.assert_frame_equal(_untimed(a[name]), _untimed(b[name]))
    with sqlite3.connect(sweeps["killed"] / "optuna.db") as db:
        replaced = db.execute("select count(*) from trial_user_attributes where key = 'replaces'").fetchone()[0]
    assert replaced >= 1  # the killed trial was re-asked into its slot


@pytest.mark.slow
def test_the_audit_refuses_a_rung_or_a_seed_count_that_differs(sweeps) -> None:
    storage = open_storage(f"sqlite:///{sweeps['clean'] / 'optuna.db'}")
    p = plan(parse_protocol(sweeps["path"].read_text()).with_data(_data(sweeps)))
    records = collect(p, storage)
    assert audit(p, records) == {}
    cell = CELLS[0]
    # a rung-1 trial given the full budget: refused
    bad = Records([dict(r) for r in records.trials], records.finals)
    row = next(r for r in bad.trials if r["cell"] == cell and r["trial"] == 4)
    row["budget_iterations"] = 12
    assert "trial 4 was given 12 iterations, not 8" in audit(p, bad)[cell]
    # a seed range cut short of where its rule stops: refused
    short = Records(records.trials, [r for r in records.finals if not (r["cell"] == cell and r["seed"] == 3)])
    assert "the seed rule" in audit(p, short)[cell]
    # a rule that would have stopped at the minimum, with four seeds recorded: refused too
    loose = plan(parse_protocol(_text(1.0)).with_data(_data(sweeps)))
    assert "stops at 2" in audit(loose, records).get(cell, "")


def _data(sweeps: dict) -> str:
    return json.loads((sweeps["clean"] / "results" / "tiny" / "manifest.json").read_text())["data_fingerprint"]


@pytest.mark.slow
def test_two_workers_share_the_rungs_and_the_seeds(sweeps, data_root, tmp_path) -> None:
    """Two processes on one storage: each rung slot and each seed trained once, a rung started only after the
    one before it, and the tables those of one worker."""
    shared = [
        "--storage",
        f"sqlite:///{tmp_path / 'optuna.db'}",
        "--tracking-uri",
        str(tmp_path / "mlruns"),
        "--data-root",
        str(data_root),
        "--quiet",
    ]
    path = sweeps["path"]
    workers = [cli(["run", str(path), "--results-dir", str(tmp_path / f"results-{w}"), *shared]) for w in "ab"]
    outputs = [w.communicate(timeout=900)[0] for w in workers]
    assert [w.returncode for w in workers] == [1, 1] and all(NO_RESULT in o for o in outputs), outputs
    one = read(sweeps["clean"] / "results" / "tiny")
    for w in "ab":
        both = read(tmp_path / f"results-{w}" / "tiny")
        assert both["manifest"]["refused"] == {}
        # TPE's proposals in a multi-worker sweep depend on which trials finished first (bench.sweep.runner):
        # the slots, their rungs and budgets and the seeds are the same; the values may differ
        for name, columns in (("trials", ["cell", "trial", "budget_iterations"]), ("finals", ["cell", "seed"])):
            mine = both[name][columns].sort_values(columns).reset_index(drop=True)
            pd.testing.assert_frame_equal(mine, one[name][columns].sort_values(columns).reset_index(drop=True))
    with sqlite3.connect(tmp_path / "optuna.db") as db:
        done = db.execute(
            "select s.study_name, a.value_json, count(*) from trials t join studies s using (study_id) "
            "join trial_user_attributes a on a.trial_id = t.trial_id and a.key = 'slot' "
            "where t.state in ('COMPLETE', 'FAIL') and t.trial_id not in "
            "(select trial_id from trial_user_attributes where key = 'replaces') and t.trial_id not in "
            "(select trial_id from trial_system_attributes where key = 'dmlbench:surplus') "
            "group by s.study_name, a.value_json"
        ).fetchall()
        starts = db.execute(
            "select s.study_name, a.value_json, t.datetime_start, t.datetime_complete from trials t "
            "join studies s using (study_id) join trial_user_attributes a on a.trial_id = t.trial_id "
            "and a.key = 'slot' where t.state = 'COMPLETE' and s.study_name not like '%final%' "
            "and s.study_name not like '%floor%'"
        ).fetchall()
    assert all(n == 1 for _, _, n in done), [d for d in done if d[2] != 1]
    by_study: dict[str, dict[int, tuple[str, str]]] = {}
    for study, slot, start, end in starts:
        by_study.setdefault(study, {})[int(slot)] = (start, end)
    for study, slots in by_study.items():  # every rung-1 slot started after every rung-0 slot completed
        if len(slots) == 7:
            assert min(slots[s][0] for s in (4, 5)) >= max(slots[s][1] for s in range(4)), study
            assert slots[6][0] >= max(slots[s][1] for s in (4, 5)), study


@pytest.mark.slow
def test_the_leaderboard_from_mlflow_is_the_results_leaderboard(sweeps, tmp_path) -> None:
    """Rebuilt from the MLflow records alone, the rung budgets pass the same audit and the table is the same."""
    import shutil

    from bench.cli import main

    copy = tmp_path / "tiny"
    shutil.copytree(sweeps["clean"] / "results" / "tiny", copy)
    out = tmp_path / "from-mlflow"
    assert main(["leaderboard", str(copy), "--quiet"]) == 0
    store = sweeps["clean"] / "mlruns"
    args = ["leaderboard", "--mlflow-experiment", "dmlbench/tiny", "--tracking-uri", str(store), "--out", str(out)]
    assert main([*args, "--quiet"]) == 0

    def kept(md: str) -> str:
        skip = ("- created", "- finished", "- read from")
        return "\n".join(line for line in md.splitlines() if not line.startswith(skip))

    mine = kept((copy / "leaderboard.md").read_text())
    assert kept((out / "leaderboard.md").read_text()) == mine
    assert "rungs [[4, 4], [2, 8], [1, 12]]" in mine and "seeds_min 2" in mine  # the footer's budget


def test_a_rungs_run_is_early_stopped_within_its_rung_and_scored_at_its_end(data_root) -> None:
    """Early stopping composes with the rungs: a run of a rung (``stop_after``) checks every ``check_every`` and
    at the rung's end, and keeps its best checkpoint among those."""
    from bench.data import load
    from bench.training import EarlyStopping, TrainConfig, train

    background = load("omniglot:background", data_root, 14)
    data = background.subset(background.classes[:12])
    config = TrainConfig(
        trunk="mlp", embedding_dim=16, loss="triplet", miner="batch_hard", P=4, K=4, iterations=30, seed=0
    )
    checked: list[int] = []
    scores = {5: 0.2, 10: 0.1, 12: 0.3}

    def score(it: int, model) -> float:
        checked.append(it)
        return scores[it]

    result = train(config, data, early_stopping=EarlyStopping(5, 10, score), stop_after=12)
    assert checked == [5, 10, 12] and result.iterations == 12 and result.best_iteration == 12
