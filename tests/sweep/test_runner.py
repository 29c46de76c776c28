"""The runner on real data with real stores: tables, MLflow runs, failed trials, budget audit, resume after kill -9."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from _shared import RUNNER_TINY as TINY
from _shared import cli as _cli
from _shared import run_args, trials_in_state
from _shared import sweep_options as _options

from bench.data.splits import ClassSplit
from bench.errors import BenchError
from bench.plan import plan
from bench.protocol import parse_protocol
from bench.sweep.prepare import TestClassGuard, TestLeakError, prepare
from bench.sweep.runner import run_protocol
from bench.sweep.seeds import derive_seed
from bench.sweep.tables import claim_dir, read
from bench.sweep.tuning import SlotStudy, open_storage, run_trial

pytestmark = pytest.mark.slow


CELLS = ["triplet+none", "triplet+batch_hard", "contrastive-diverging+none"]
# what run says, exiting 1, of the planned cell whose every trial diverges
NO_RESULT = "1 of 3 planned cell(s) have no result (contrastive-diverging+none: "


def _protocol_file(tmp_path: Path, iterations: int = 20) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.replace("ITERATIONS", str(iterations)))
    return path


def _mlflow_runs(root: Path) -> pd.DataFrame:
    with sqlite3.connect(root / "mlruns" / "mlflow.db") as db:
        return pd.read_sql(
            "select r.run_uuid, r.status, r.lifecycle_stage, t.key, t.value from runs r "
            "join tags t on t.run_uuid = r.run_uuid",
            db,
        )


def _without_timing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in frame.columns if c == "wall_time_s"])


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, data_root):
    """One tiny sweep, in process: 3 cells x (2 trials + 2 final seeds), MLP on 12x12 Omniglot."""
    root = tmp_path_factory.mktemp("sweep")
    path = _protocol_file(root)
    start = time.perf_counter()
    outcome = run_protocol(path, _options(root, data_root))
    return root, path, outcome, time.perf_counter() - start


def test_sweep_writes_the_tables(sweep):
    root, path, outcome, _ = sweep
    tables = read(root / "results" / "tiny")
    protocol = parse_protocol(path.read_text())
    trials, finals, summary, manifest = tables["trials"], tables["finals"], tables["summary"], tables["manifest"]
    assert manifest["protocol_hash"] == protocol.hash and manifest["finished"]
    assert manifest["refused"] == {}  # the budget audit left no cell out
    # run_protocol returns the same tables it wrote, and where
    assert outcome.path == root / "results" / "tiny" and outcome.manifest == manifest
    pd.testing.assert_frame_equal(outcome.finals, finals)
    pd.testing.assert_frame_equal(outcome.summary, summary)
    assert len(outcome.trials) == len(trials)
    assert set(manifest["fingerprints"]) == {"split", "train", "test", "folds"}
    umask = os.umask(0)
    os.umask(umask)
    written = [f for f in (root / "results" / "tiny").rglob("*") if f.is_file()]
    assert written and {f.stat().st_mode & 0o777 for f in written} == {0o666 & ~umask}  # shareable, not 0600
    assert list(trials["cell"].unique()) == CELLS and len(trials) == 6
    assert (trials["protocol_hash"] == protocol.hash).all()
    assert set(trials["iterations"][trials["state"] == "COMPLETE"]) == {20}  # 1 fold x 20 iterations
    assert (trials["budget_iterations"] == 20).all()
    ok = trials[trials["cell"] != "contrastive-diverging+none"]
    assert (ok["state"] == "COMPLETE").all() and ok["value"].between(0, 1).all()
    for _, row in ok.iterrows():
        assert json.loads(row["fold_values"]) == [pytest.approx(row["value"])]
        assert set(json.loads(row["params"])) == {"loss.margin"}
    assert len(finals) == 4 and set(finals["seed"]) == {0, 1}
    assert {"precision_at_1", "map_at_r", "recall_at_1", "recall_at_2", "nmi", "lake_accuracy"} <= set(finals)
    assert finals["map_at_r"].between(0, 1).all() and (finals["iterations"] == 20).all()
    assert finals["train_fingerprint"].nunique() == 1 and finals["test_fingerprint"].nunique() == 1
    assert finals["train_fingerprint"].iloc[0] != finals["test_fingerprint"].iloc[0]
    best = ok.loc[ok.groupby("cell")["value"].idxmax()].set_index("cell")
    for cell, group in finals.groupby("cell"):
        assert (group["params"] == best.loc[cell, "params"]).all()  # the best trial is what was retrained
        assert group["val_map_at_r"].iloc[0] == pytest.approx(best.loc[cell, "value"])
    row = summary.set_index("cell").loc["triplet+none"]
    seeds = finals[finals["cell"] == "triplet+none"]["map_at_r"]
    assert row["map_at_r_mean"] == pytest.approx(seeds.mean())
    assert row["map_at_r_ci_low"] < row["map_at_r_mean"] < row["map_at_r_ci_high"]
    assert row["n_seeds"] == 2 and row["n_trials"] == 2 and row["budget_iterations"] == 2 * 20 + 2 * 20
    for cell in ("triplet+none", "triplet+batch_hard"):
        artifacts = root / "results" / "tiny" / "artifacts" / cell
        history = pd.read_csv(artifacts / "optuna_history.csv")
        assert list(history["trial"]) == [0, 1] and history["best_so_far"].is_monotonic_increasing
        import numpy as np

        with np.load(artifacts / "pair_distances.npz") as pairs:
            assert len(pairs["pos"]) > 0 and len(pairs["neg"]) > 0


def test_diverging_trials_are_recorded_as_failed_and_the_sweep_goes_on(sweep):
    root, _, _, _ = sweep
    tables = read(root / "results" / "tiny")
    failed = tables["trials"][tables["trials"]["cell"] == "contrastive-diverging+none"]
    assert list(failed["state"]) == ["FAIL", "FAIL"]
    assert failed["reason"].str.contains("diverged at iteration").all()
    assert failed["value"].isna().all()
    assert "contrastive-diverging+none" not in set(tables["finals"]["cell"])  # nothing to retrain
    summary = tables["summary"].set_index("cell")
    assert summary.loc["contrastive-diverging+none", "n_seeds"] == 0
    assert summary.loc["triplet+batch_hard", "n_seeds"] == 2  # the cell after the failures still ran


def test_mlflow_records_one_run_per_key_with_tags_and_artifacts(sweep):
    root, path, _, _ = sweep
    runs = _mlflow_runs(root)
    keys = runs[runs["key"] == "dmlbench.key"]
    assert keys["value"].is_unique
    assert len(keys) == 3 + 6 + 6 + 4 + 2  # cells, trials, folds, final seeds, floor seeds
    protocol = parse_protocol(path.read_text())
    hashes = runs[runs["key"] == "dmlbench.protocol_hash"]
    assert len(hashes) == len(keys) and (hashes["value"] == protocol.hash).all()
    for tag in ("dmlbench.git_commit", "dmlbench.version.torch", "dmlbench.split_fingerprint"):
        assert (runs["key"] == tag).sum() == len(keys)
    parents = runs[runs["key"] == "mlflow.parentRunId"]
    assert len(parents) == 6 + 6 + 4
    artifacts = root / "mlruns" / "artifacts"
    assert len(list(artifacts.rglob("tiny.yaml"))) == 3
    best = list(artifacts.rglob("best_params.json"))
    assert len(best) == 2 and "params" in json.loads(best[0].read_text())


def test_rerun_of_a_finished_sweep_records_nothing_twice(sweep, data_root):
    root, path, _, _ = sweep
    before = read(root / "results" / "tiny")
    runs_before = len(_mlflow_runs(root))
    run_protocol(path, _options(root, data_root))
    after = read(root / "results" / "tiny")
    assert len(_mlflow_runs(root)) == runs_before
    for name in ("trials", "finals", "summary"):
        pd.testing.assert_frame_equal(before[name], after[name])
    assert after["manifest"]["created"] == before["manifest"]["created"]


def test_common_random_numbers_same_seed_same_start_in_every_cell(sweep, data_root, monkeypatch):
    """Final seed s: the same initial trunk and the same first batch whatever the cell; the floor starts there."""
    import torch

    from bench import registry, training
    from bench.sweep.floor import initial_trunk
    from bench.sweep.tuning import final_config

    _, path, _, _ = sweep
    protocol = parse_protocol(path.read_text())
    prepared = prepare(protocol, str(data_root))
    seen: list[tuple[dict, torch.Tensor]] = []
    build_trunk = registry.build_trunk

    def spy(name: str, **params):  # the real trunk; its weights at birth and its first input are kept
        trunk = build_trunk(name, **params)
        state = {k: v.clone() for k, v in trunk.state_dict().items()}
        first: list[torch.Tensor] = []
        trunk.register_forward_pre_hook(lambda _, args: first.append(args[0].clone()) if not first else None)
        seen.append((state, first))
        return trunk

    monkeypatch.setattr(registry, "build_trunk", spy)  # trunks are built through the registry (bench.trunks)
    cells = plan(protocol).cells
    by_seed = {}
    for cell, params, seed in (
        (cells[0], {"loss.margin": 0.1}, 1),
        (cells[1], {"loss.margin": 0.3}, 1),
        (cells[0], {"loss.margin": 0.1}, 0),
    ):
        config = final_config(protocol, cell, params, seed)
        config.iterations = 1
        training.train(config, prepared.train)
        by_seed.setdefault(seed, []).append(seen[-1])
    (w1, x1), (w2, x2) = by_seed[1]
    assert cells[0].id != cells[1].id and w1.keys() == w2.keys()
    assert all(torch.equal(w1[k], w2[k]) for k in w1) and torch.equal(x1[0], x2[0])
    w0, x0 = by_seed[0][0]
    assert not torch.equal(x0[0], x1[0]) and not all(torch.equal(w0[k], w1[k]) for k in w0)  # seeds differ
    monkeypatch.undo()
    floor = initial_trunk(protocol, 1, tuple(prepared.train.x.shape[1:]))
    assert all(torch.equal(v, w1[k]) for k, v in floor.state_dict().items())
    runs = _mlflow_runs(root := sweep[0])
    with sqlite3.connect(root / "mlruns" / "mlflow.db") as db:  # tuning: slot t, fold f seeded alike in every cell
        seeds = dict(
            db.execute(
                "select t.value, p.value from tags t join params p on p.run_uuid = t.run_uuid "
                "where t.key = 'dmlbench.key' and p.key = 'seed' and t.value like '%/trial0/fold0'"
            )
        )
    assert len(seeds) == len(CELLS) and len(set(seeds.values())) == 1, seeds
    assert len(runs) > 0


def test_floor_is_the_untrained_trunk_scored_like_the_finals(sweep, data_root, monkeypatch):
    from bench.sweep import floor

    root, path, _, _ = sweep
    tables = read(root / "results" / "tiny")
    protocol = parse_protocol(path.read_text()).with_data(tables["manifest"]["data_fingerprint"])  # as the run's
    frame, finals = tables["floor"], tables["finals"]
    metrics = [c for c in finals.columns if c in frame.columns and c not in ("protocol_hash", "seed")]
    assert list(frame.columns) == ["protocol_hash", "shared_key", "seed", *metrics]
    assert metrics == [c for c in finals.columns if c in set(metrics)] and "map_at_r" in metrics
    assert {"precision_at_1", "recall_at_1", "recall_at_2", "nmi", "lake_accuracy"} <= set(metrics)
    assert list(frame["seed"]) == [0, 1] and (frame["protocol_hash"] == protocol.hash).all()
    assert set(frame["shared_key"]) == {tables["manifest"]["shared_key"]}
    assert frame[metrics].apply(lambda c: c.between(0, 1)).all().all()
    trained = finals[finals["state"] == "COMPLETE"].groupby("cell")["map_at_r"].mean()
    assert trained.max() > frame["map_at_r"].max()  # training adds something over the floor somewhere
    prepared = prepare(protocol, str(data_root))
    again = floor.floor_row(protocol, prepared, 1)
    assert again == pytest.approx(frame.iloc[1].to_dict())  # recomputed: the same row
    calls = []
    monkeypatch.setattr(floor, "floor_row", lambda *a: calls.append(a))
    kept = floor.update_floor(protocol, prepared, root / "results" / "tiny")
    assert calls == [] and kept.equals(frame)  # idempotent: nothing recomputed when every seed is there


def test_best_trial_is_chosen_on_validation_only_and_ties_go_to_the_lower_slot():
    from optuna.trial import TrialState, create_trial

    from bench.sweep.tuning import best_trial

    def trial(slot: int, value: float | None, test: float) -> optuna.trial.FrozenTrial:
        state = TrialState.COMPLETE if value is not None else TrialState.FAIL
        return create_trial(
            state=state, value=value, user_attrs={"slot": slot, "map_at_r": test, "metrics": {"map_at_r": test}}
        )

    counted = {0: trial(0, 0.40, 0.10), 1: trial(1, 0.50, 0.20), 2: trial(2, 0.50, 0.90), 3: trial(3, None, 1.0)}
    assert best_trial(counted).user_attrs["slot"] == 1  # the tie with slot 2 goes to the lower slot, not to test
    assert best_trial({2: counted[2], 1: counted[1]}).user_attrs["slot"] == 1  # whatever the dict order
    assert best_trial({3: counted[3]}) is None


def test_failed_final_seed_stays_visible_and_is_counted(sweep):
    """A final seed that fails is a FAIL row with its reason in finals.csv and counts in summary.n_failed."""
    from bench.sweep.frames import tables
    from bench.sweep.records import collect
    from bench.sweep.tuning import open_storage

    root, path, _, _ = sweep
    protocol = parse_protocol(path.read_text())
    p = plan(protocol)
    manifest = json.loads((root / "results" / "tiny" / "manifest.json").read_text())
    p = plan(protocol.with_data(manifest["data_fingerprint"]))  # the records are keyed by the data read too
    records = collect(p, open_storage(f"sqlite:///{root / 'optuna.db'}"))
    row = next(r for r in records.finals if r["cell"] == "triplet+none" and r["seed"] == 1)
    row.update(state="FAIL", reason="diverged at iteration 7: loss nan", map_at_r=float("nan"))
    frames = tables(p, records, refused={})
    failed = frames["finals"].query("cell == 'triplet+none' and seed == 1").iloc[0]
    assert failed["state"] == "FAIL" and failed["reason"].startswith("diverged at iteration 7")
    summary = frames["summary"].set_index("cell")
    assert summary.loc["triplet+none", "n_failed"] == 1 and summary.loc["triplet+none", "n_seeds"] == 1
    assert summary.loc["triplet+batch_hard", "n_failed"] == 0
    ok = frames["finals"].query("cell == 'triplet+none' and state == 'COMPLETE'")["map_at_r"]
    assert summary.loc["triplet+none", "map_at_r_mean"] == pytest.approx(ok.mean())
    written = read(root / "results" / "tiny")["summary"].set_index("cell")
    assert (written["n_failed"] == 0).all()  # the real sweep: nothing failed in the finals


def test_a_final_seed_given_back_mid_write_is_read_as_its_seed(sweep, tmp_path):
    """Ctrl-C gives a final seed back in two writes (failed, then re-enqueued): a worker writing its tables in
    between, or a kill in between, finds the slot held by a failed trial with no record. It is read as the seed
    its slot stands for, a labelled FAIL row, not a crash; once re-enqueued, the slot is open again."""
    from optuna.trial import TrialState

    from bench.sweep.records import collect
    from bench.sweep.tuning import study_name
    from bench.sweep.tuning._slots import _requeue

    root, path, _, _ = sweep
    shutil.copy(root / "optuna.db", tmp_path / "optuna.db")
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    protocol = parse_protocol(path.read_text())
    manifest = json.loads((root / "results" / "tiny" / "manifest.json").read_text())
    p = plan(protocol.with_data(manifest["data_fingerprint"]))
    cell = next(c for c in p.cells if c.id == "triplet+none")
    name = study_name(p.protocol, cell, finals=True)
    optuna.delete_study(study_name=name, storage=storage)  # its seeds not yet trained, in this copy
    finals = SlotStudy(storage, name, len(protocol.final_seeds))
    slot = finals.claim()
    assert slot is not None and slot.slot == 0
    storage.set_trial_state_values(slot.trial_id, TrialState.FAIL)  # abandon's first write

    rows = [r for r in collect(p, storage).finals if r["cell"] == "triplet+none"]
    assert [(r["seed"], r["state"]) for r in rows] == [(protocol.final_seeds[0], "FAIL")]
    assert rows[0]["reason"].startswith("given back")

    _requeue(finals.study, storage.get_trial(slot.trial_id), "interrupted")  # abandon's second
    assert [r for r in collect(p, storage).finals if r["cell"] == "triplet+none"] == []
    assert finals.open_slots()


class RaisesLater(torch.nn.Module):
    """A plugin loss with a bug that shows only in training: its second call on raises (always, or only when
    trained on every training class, as the final seeds are); its first call, the pre-flight's, passes, with
    a gradient (a loss that gives none is refused before the sweep, `bench.sweep.probe.dead_cells`)."""

    def __init__(self, num_classes: int, finals_only: bool = False) -> None:
        super().__init__()
        self.num_classes, self.finals_only, self.calls = num_classes, finals_only, 0

    def forward(self, embeddings, labels, indices_tuple=None):
        self.calls += 1
        if self.calls > 1 and (not self.finals_only or self.num_classes >= 12):
            raise RuntimeError("boom")
        return embeddings.pow(2).mean()


RAISING = TINY.replace("validation: {folds: 3, use: 1, group_by: alphabet}", "validation: {folds: 3, use: 1}").replace(
    """  losses:
    - {name: triplet}
""",
    """  losses:
    - {name: triplet, miners: [none]}
    - {name: raises_later, miners: [none]}
    - {name: raises_later, label: raises-in-finals, params: {finals_only: true}, miners: [none]}
""",
)


def test_a_loss_that_raises_fails_its_trial_or_final_seed_with_its_reason_and_the_sweep_goes_on(tmp_path, data_root):
    from bench import registry
    from bench.registry import _lookup

    registry.register("loss", "raises_later", tuples="triplets", needs=("num_classes",))(RaisesLater)
    try:
        path = tmp_path / "raising.yaml"
        path.write_text(RAISING.replace("ITERATIONS", "6"))
        run_protocol(path, _options(tmp_path, data_root))
    finally:
        del _lookup._REGISTERED[("loss", "raises_later")]
    tables = read(tmp_path / "results" / "tiny")
    trials = tables["trials"].set_index("cell")
    failed = trials.loc[["raises_later+none"]]
    assert list(failed["state"]) == ["FAIL", "FAIL"]
    assert (failed["reason"] == "fold 0: loss raises_later raised RuntimeError: boom").all()
    assert list(trials.loc[["raises-in-finals+none"], "state"]) == ["COMPLETE", "COMPLETE"]
    finals = tables["finals"].set_index("cell")
    assert list(finals.loc[["raises-in-finals+none"], "state"]) == ["FAIL", "FAIL"]
    assert (finals.loc[["raises-in-finals+none"], "reason"] == "loss raises_later raised RuntimeError: boom").all()
    assert list(finals.loc[["triplet+none"], "state"]) == ["COMPLETE", "COMPLETE"]  # the other cells ran


def test_records_and_manifest_name_the_commit_each_cell_ran(sweep):
    """Each trial and final run records the commit its process ran (HEAD may move after: compare to the run's)."""
    root, _, _, _ = sweep
    tables = read(root / "results" / "tiny")
    manifest = tables["manifest"]
    head, dirty = manifest["git_commit"], manifest["git_dirty"]
    assert re.fullmatch(r"[0-9a-f]{40}", head)  # this checkout is a repository: a real commit, not "unknown"
    finals, trials = tables["finals"], tables["trials"]
    assert (finals["git_commit"] == head).all() and (trials["git_commit"] == head).all()
    assert (finals["git_dirty"] == dirty).all() and (trials["git_dirty"] == dirty).all()
    assert manifest["cell_commits"] == {cell: [head + ("+dirty" if dirty else "")] for cell in CELLS}


def test_a_worker_with_nothing_to_claim_scores_the_floor_instead_of_waiting(sweep, data_root, tmp_path, monkeypatch):
    """Every cell waiting on other workers (here: `_work` says so for the first pass), a worker scores floor
    seeds; the floor phase finds them done, scores none twice, and the table is the plain sweep's floor."""
    from bench.sweep import runner

    root, path, _, _ = sweep
    real, passes = runner.Sweep._work, []

    def work(self, cell):
        passes.append(cell.id)
        return False if len(passes) <= 3 else real(self, cell)  # the first pass over the 3 cells: all wait

    monkeypatch.setattr(runner.Sweep, "_work", work)
    out = tmp_path / "run"
    lines = []
    monkeypatch.setattr(runner.Sweep, "line", lambda self, text: lines.append(text))
    run_protocol(path, _options(out, data_root))
    assert any(x == "the floor, seed 0, scored while the cells wait" for x in lines), lines
    assert not any(x.startswith("waiting for other workers") for x in lines)  # a floor seed, not a wait
    storage = open_storage(f"sqlite:///{out / 'optuna.db'}")
    (name,) = [s for s in optuna.get_all_study_names(storage) if s.endswith(":floor")]
    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]  # each seed scored once
    want = read(root / "results" / "tiny")["floor"]
    assert read(out / "results" / "tiny")["floor"].equals(want)


def test_read_gives_an_empty_floor_when_there_is_none(sweep, tmp_path):
    copy = tmp_path / "tiny"
    shutil.copytree(sweep[0] / "results" / "tiny", copy)
    (copy / "floor.csv").unlink()
    tables = read(copy)
    assert isinstance(tables["floor"], pd.DataFrame) and tables["floor"].empty and not tables["finals"].empty


def test_budget_audit_refuses_a_cell_with_a_differing_budget(sweep, data_root, tmp_path):
    source, path, _, _ = sweep
    root = tmp_path / "copy"  # the shared sweep stays untouched for the other tests
    shutil.copytree(source, root)
    with sqlite3.connect(root / "optuna.db") as db:  # as if one trial of one cell had trained longer
        (trial_id,) = db.execute(
            "select t.trial_id from trials t join studies s on s.study_id = t.study_id "
            "where s.study_name like '%:triplet+batch_hard' order by t.number limit 1"
        ).fetchone()
        db.execute(
            "update trial_user_attributes set value_json = '25' where trial_id = ? and key = 'iterations'", (trial_id,)
        )
    with pytest.raises(
        BenchError,
        match=r"refused to report 1 cell.*triplet\+batch_hard: trial 0 \(COMPLETE\) "
        r"trained 25 iterations, the budget is 20",
    ):
        run_protocol(path, _options(root, data_root))
    tables = read(root / "results" / "tiny")
    assert "triplet+batch_hard" not in set(tables["summary"]["cell"])
    assert {"triplet+none", "contrastive-diverging+none"} <= set(tables["summary"]["cell"])
    assert "triplet+batch_hard" in tables["manifest"]["refused"]
    assert len(tables["trials"]) == 6  # the records themselves are kept


def test_test_classes_never_reach_a_trial(data_root, tmp_path):
    protocol = parse_protocol(TINY.replace("ITERATIONS", "5"))
    prepared = prepare(protocol, str(data_root))
    assert not set(prepared.train.classes) & set(prepared.test.classes)
    for fold_train, fold_val in prepared.folds:
        assert not set(fold_train.classes) & set(prepared.test_split.classes)
    # a fold that (by a bug) names a test class is refused before any training
    leak = prepared.test_split.classes[0]
    train_plus_test = prepared.train.__class__(
        __import__("torch").cat([prepared.train.x, prepared.test.x]),
        __import__("torch").cat([prepared.train.y, prepared.test.y]),
        "mixed",
    )
    prepared.train = train_plus_test
    prepared.folds = [(ClassSplit("fold0-train", (*prepared.folds[0][0].classes, leak)), prepared.folds[0][1])]
    storage = open_storage(f"sqlite:///{tmp_path / 'o.db'}")
    study = SlotStudy(storage, "leak", 1)
    slot = study.claim()
    with pytest.raises(TestLeakError, match="fold 0 training data contains 1 test class"):
        run_trial(protocol, prepared, plan(protocol).cells[0], slot.trial, slot.slot)
    with pytest.raises(TestLeakError):
        TestClassGuard(ClassSplit("test", (1, 2))).check([0, 2, 3], "validation")


def test_a_class_with_too_few_samples_is_one_clear_error(tmp_path, data_root):
    path = tmp_path / "few.yaml"
    path.write_text(
        TINY.replace("ITERATIONS", "5").replace("image_size: 12", "image_size: 12\n  min_samples_per_class: 21")
    )
    results = tmp_path / "results" / "tiny"
    results.mkdir(parents=True)
    (results / "manifest.json").write_text(json.dumps({"protocol_hash": "0" * 64}))
    with pytest.raises(
        BenchError,
        match=r"omniglot:background: class \d+ \(.+\) has 20 sample\(s\); every train class "
        r"needs at least 21 \(data.min_samples_per_class\)",
    ):
        run_protocol(path, _options(tmp_path, data_root))
    assert json.loads((results / "manifest.json").read_text())["protocol_hash"] == "0" * 64  # nothing moved


def test_workers_never_take_more_slots_than_the_budget(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first, second = (SlotStudy(open_storage(url), "cell", 3) for _ in range(2))  # two workers, one study
    claimed = []
    for worker in (first, second, first, second, first):
        slot = worker.claim()
        if slot is not None:
            claimed.append(slot.slot)
            worker.study.tell(slot.trial, 0.5)
    assert claimed == [0, 1, 2]
    assert len(first.counted()) == 3 and first.finished() and second.finished()
    assert derive_seed(0, "triplet+none", "trial", 1, "fold", 0) == derive_seed(
        0, "triplet+none", "trial", 1, "fold", 0
    )
    assert derive_seed(0, "triplet+none", "trial", 1) != derive_seed(0, "triplet+none", "trial", 2)


def test_changed_protocol_never_mixes_with_old_results(tmp_path):
    results = tmp_path / "tiny"
    results.mkdir()
    (results / "manifest.json").write_text(json.dumps({"protocol_hash": "a" * 64, "shared_hash": "c" * 64}))
    (results / "summary.csv").write_text("cell\nold\n")
    assert claim_dir(results, "c" * 64) is None and (results / "summary.csv").exists()
    moved = claim_dir(results, "b" * 64)
    assert moved == str(tmp_path / f"tiny@{'a' * 12}")
    assert (Path(moved) / "summary.csv").read_text() == "cell\nold\n" and not results.exists()
    old, new = (parse_protocol(TINY.replace("ITERATIONS", str(n))) for n in (20, 21))
    from bench.sweep.tuning import study_name

    assert study_name(old, plan(old).cells[0]) != study_name(new, plan(new).cells[0])


def test_resume_after_kill_equals_an_uninterrupted_run(tmp_path, data_root):
    path = _protocol_file(tmp_path, iterations=150)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    reference = _cli(run_args(path, clean, data_root))  # the uninterrupted run, alongside
    victim = _cli(run_args(path, killed, data_root))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and victim.poll() is None:
        db = killed / "optuna.db"
        if trials_in_state(db, "COMPLETE") >= 1 and trials_in_state(db, "RUNNING") >= 1:
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the sweep ended before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert trials_in_state(killed / "optuna.db", "RUNNING") >= 1  # a trial was left behind mid-training
    resumed = _cli(run_args(path, killed, data_root))
    out, _ = resumed.communicate(timeout=300)
    # exit 1 is the diverging cell, planned and without a result: the sweep itself finished
    assert resumed.returncode == 1 and NO_RESULT in out, out
    ref_out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 1 and NO_RESULT in ref_out, ref_out
    lines = [line for line in ref_out.splitlines() if re.search(r" trial \d+/\d+ ", line)]
    assert len(lines) == 6 and all(line.startswith("[") for line in lines)  # --quiet: one line per trial
    assert all(re.search(r"\| \d+% of iterations, ~\d+:\d\d:\d\d left$", line) for line in lines), lines
    table = ref_out[ref_out.index("rank  ") :]  # a finished run prints its ranked cells
    assert re.match(r"rank\s+cell\s+seeds\s+map_at_r \[95% CI\]", table), ref_out
    finals = read(clean / "results" / "tiny")["finals"]
    for cell, rows in finals.groupby("cell"):
        ranked = re.search(rf"^\s*\d+\s+{re.escape(cell)}\s", table, re.M) is not None
        failed = f"no completed final seed: {cell}" in table
        assert (ranked, failed) == ((True, False) if (rows["state"] == "COMPLETE").any() else (False, True)), table

    a, b = read(clean / "results" / "tiny"), read(killed / "results" / "tiny")
    for name in ("trials", "finals", "summary"):
        pd.testing.assert_frame_equal(_without_timing(a[name]), _without_timing(b[name]))
    with sqlite3.connect(killed / "optuna.db") as db:
        replaced = db.execute("select count(*) from trial_user_attributes where key = 'replaces'").fetchone()[0]
    assert replaced >= 1  # the killed trial was re-asked, not skipped
    keys = _mlflow_runs(killed)
    keys = keys[(keys["key"] == "dmlbench.key") & (keys["lifecycle_stage"] == "active")]
    assert keys["value"].is_unique and len(keys) == len(_mlflow_runs(clean).query("key == 'dmlbench.key'"))


def test_two_workers_share_one_sweep(tmp_path, data_root, sweep):
    """Two processes on one storage and one tracking store: every slot run once, the same tables as one worker."""
    path = _protocol_file(tmp_path)
    shared = [
        "--storage",
        f"sqlite:///{tmp_path / 'optuna.db'}",
        "--tracking-uri",
        str(tmp_path / "mlruns"),
        "--data-root",
        str(data_root),
        "--quiet",
    ]
    workers = [_cli(["run", str(path), "--results-dir", str(tmp_path / f"results-{w}"), *shared]) for w in "ab"]
    try:
        outputs = [w.communicate(timeout=300)[0] for w in workers]
    except subprocess.TimeoutExpired:  # a rare stall seen twice under heavy load: keep both workers' words
        for w in workers:
            w.kill()
        raise AssertionError(
            "a worker stalled; outputs:\n" + "\n---\n".join(w.communicate()[0] for w in workers)
        ) from None
    assert [w.returncode for w in workers] == [1, 1] and all(NO_RESULT in o for o in outputs), (
        outputs
    )  # the diverging cell
    # the share done is the sweep's across both workers: whoever records the last run sees all of it
    shares = [[int(s) for s in re.findall(r"\| (\d+)% of iterations", out)] for out in outputs]
    assert all(shares) and max(s[-1] for s in shares) == 100, outputs
    assert all(s == sorted(s) for s in shares), outputs
    with sqlite3.connect(tmp_path / "optuna.db") as db:
        counts = db.execute(
            "select s.study_name, count(*) from trials t join studies s using (study_id) "
            "where t.state in ('COMPLETE', 'FAIL', 'PRUNED') and t.trial_id not in "
            "(select trial_id from trial_system_attributes where key = 'dmlbench:surplus') "
            "group by s.study_name"
        ).fetchall()
    # 3 tuning studies, 2 final studies (one cell never retrains) and the floor's 2 seed slots
    assert sorted(n for _, n in counts) == [2] * 6 and sum(s.endswith(":floor") for s, _ in counts) == 1, counts
    runs = _mlflow_runs(tmp_path)
    keys = runs[(runs["key"] == "dmlbench.key") & (runs["lifecycle_stage"] == "active")]
    assert keys["value"].is_unique and len(keys) == 3 + 6 + 6 + 4 + 2  # with the 2 floor seeds
    a, b = read(tmp_path / "results-a" / "tiny"), read(tmp_path / "results-b" / "tiny")
    single = read(sweep[0] / "results" / "tiny")  # the same protocol run by one worker (in process)
    for name in ("trials", "finals"):
        pd.testing.assert_frame_equal(_without_timing(a[name]), _without_timing(b[name]))
        # with fewer trials than TPE's startup trials, parameters depend on the slot alone, not on timing
        pd.testing.assert_frame_equal(_without_timing(a[name]), _without_timing(single[name]))


def test_quiet_lines_carry_the_share_done_and_time_left() -> None:
    import io

    from bench.sweep.progress import Progress

    out = io.StringIO()
    p = Progress(n_cells=2, total_iterations=400, done_iterations=100, quiet=True, stream=out)
    p.start -= 30.0  # 30 s spent on this process's share so far
    p.run_started(100)
    p.iteration(50, 100, 0.5)
    p.run_finished()  # a run stopped early still spends its allotment
    p.trial("triplet+batch_hard", 0, 4, "COMPLETE", 0.5, "map_at_r", 100, 30.0)
    # 200 of 400 done; 100 iterations in 30 s, 200 left -> about a minute
    assert out.getvalue().rstrip().endswith("| 50% of iterations, ~0:01:00 left"), out.getvalue()
    p.skip(200)
    p.final("triplet+batch_hard", 0, "COMPLETE", {"map_at_r": 0.5}, "map_at_r", 1.0)
    assert out.getvalue().rstrip().endswith("| 100% of iterations, ~0:00:00 left")


def test_runs_another_worker_recorded_count_toward_the_share_and_pace() -> None:
    import io

    from bench.sweep.progress import Progress

    out = io.StringIO()
    p = Progress(n_cells=1, total_iterations=1000, done_iterations=0, quiet=True, stream=out)
    p.start -= 60.0
    p.run_started(100)
    p.run_finished()
    p.recorded(500)  # the store: this worker's 100 and another's 400
    p.recorded(300)  # a stale or partial read never takes the count back
    p.trial("contrastive+none", 0, 8, "COMPLETE", 0.5, "map_at_r", 100, 60.0)
    # 500 of 1000 spent in 60 s by the two workers together -> a minute left, not nine
    assert out.getvalue().rstrip().endswith("| 50% of iterations, ~0:01:00 left"), out.getvalue()


def test_redo_discards_one_cell_and_reruns_it_to_the_same_table(tmp_path, data_root):
    import optuna

    path = _protocol_file(tmp_path)
    run_protocol(path, _options(tmp_path, data_root))
    before = read(tmp_path / "results" / "tiny")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    studies = {s.study_name: s._study_id for s in optuna.get_all_study_summaries(storage)}
    runs = _mlflow_runs(tmp_path)
    keys = runs[runs["key"] == "dmlbench.key"]
    old_cell_runs = set(keys[keys["value"].str.contains("/triplet\\+none(?:/|$)")]["run_uuid"])
    assert len(old_cell_runs) == 1 + 2 * 2 + 2  # the cell run, 2 trials of one fold each, 2 final seeds

    with pytest.raises(BenchError, match="--redo: no cell 'nope' in tiny; cells: triplet\\+none"):
        run_protocol(path, _options(tmp_path, data_root, redo=("nope",)))
    run_protocol(path, _options(tmp_path, data_root, redo=("triplet+none",)))

    after_studies = {s.study_name: s._study_id for s in optuna.get_all_study_summaries(storage)}
    assert after_studies.keys() == studies.keys()
    for name, sid in studies.items():  # only the redone cell's two studies were created anew
        assert (after_studies[name] != sid) == (":triplet+none" in name), name
    runs = _mlflow_runs(tmp_path)
    stage = runs.drop_duplicates("run_uuid").set_index("run_uuid")["lifecycle_stage"]
    assert (stage[list(old_cell_runs)] == "deleted").all()
    keys = runs[(runs["key"] == "dmlbench.key")]
    active = keys[stage[keys["run_uuid"]].to_numpy() == "active"]
    assert active["value"].is_unique and len(active) == len(keys) - len(old_cell_runs)
    after = read(tmp_path / "results" / "tiny")
    for name in ("trials", "finals", "summary"):  # same seeds, same code: the same numbers
        pd.testing.assert_frame_equal(_without_timing(before[name]), _without_timing(after[name]))


def test_progress_off_a_terminal_is_plain_lines_with_periodic_updates(monkeypatch) -> None:
    """A log file or CI gets timestamped lines, never tqdm's carriage returns and escape codes."""
    import io

    from bench.sweep import progress

    out = io.StringIO()  # not a terminal
    p = progress.Progress(n_cells=1, total_iterations=200, quiet=False, stream=out)
    assert not p.bars
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    p.run_started(100)
    p.iteration(40, 100, 0.25)
    p.run_finished()
    p.trial("contrastive+none", 0, 2, "COMPLETE", 0.5, "map_at_r", 100, 1.0)
    p.close()
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text, repr(text)
    lines = text.splitlines()
    assert any("iteration 40/100 of this run, loss 0.2500" in line for line in lines), lines
    assert lines[-1].startswith("[") and "contrastive+none trial 1/2 COMPLETE" in lines[-1]
    quiet = io.StringIO()
    q = progress.Progress(n_cells=1, total_iterations=200, quiet=True, stream=quiet)
    q.run_started(100)
    q.iteration(40, 100, 0.25)  # quiet: the per-run lines alone
    assert quiet.getvalue() == ""
