"""Leaderboards that grow: a cell's records are keyed by its own key, so adding, removing or redefining one cell
retrains that cell only, while a changed shared setting retrains everything (real runner, real stores)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import optuna
import pandas as pd
import pytest

from bench.cli import main
from bench.plan import cell_key, plan
from bench.protocol import parse_protocol
from bench.sweep.runner import run_protocol
from bench.sweep.worker import Options

PROTOCOL = """\
name: grow
description: DESCRIPTION
seed: 1
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 12
  test_classes: 6
  image_size: 12
  validation: {folds: 3, use: 1}
model: {trunk: mlp, trunk_params: {hidden: [16]}, embedding_dim: 8, normalize: true}
training: {optimizer: adam, lr: LR, P: 4, K: 4, iterations: 8}
evaluation: {metrics: [precision_at_1, map_at_r], primary: map_at_r}
tuning: {trials: 1, startup_trials: 1}
final: {seeds: 2}
grid:
  losses:
LOSSES
  miners: [{name: none}, {name: batch_hard}, {name: batch_all}]
"""
TRIPLET = "    - {name: triplet, miners: [batch_hard]}"
TRIPLETS = "    - {name: triplet, miners: [batch_hard, batch_all]}"
CONTRASTIVE = "    - {name: contrastive, miners: [none]}"
CONTRASTIVE_NARROW = (
    "    - {name: contrastive, miners: [none], search_space: {neg_margin: {type: float, low: 0.5, high: 1.0}}}"
)
VERSIONS = {  # each step of the story, in order
    "a": (TRIPLET, CONTRASTIVE),
    "b": (TRIPLETS, CONTRASTIVE),  # triplet+batch_all added (its loss's `miners` list grew)
    "c": (TRIPLETS,),  # contrastive+none removed
    "b2": (TRIPLETS, CONTRASTIVE),  # ... and put back: its records were kept
    "e": (TRIPLETS, CONTRASTIVE_NARROW),  # contrastive's search space changed
}
OLD = ["triplet+batch_hard", "contrastive+none"]
ADDED = "triplet+batch_all"
RUNS_PER_CELL = 5  # the cell's run, 1 trial, its fold, 2 final seeds
RUN_ONLY = ["wall_time_s", "git_commit", "git_dirty"]  # of the run, not of the result: may differ between runs


def text(losses: tuple[str, ...], lr: str = "1.0e-3", description: str = "a") -> str:
    return PROTOCOL.replace("LOSSES", "\n".join(losses)).replace("LR", lr).replace("DESCRIPTION", description)


def _runs(root: Path) -> dict[str, str]:
    """dmlbench.key -> run id of every active MLflow run."""
    with sqlite3.connect(root / "mlruns" / "mlflow.db") as db:
        rows = db.execute(
            "select t.value, r.run_uuid from runs r join tags t on t.run_uuid = r.run_uuid "
            "where t.key = 'dmlbench.key' and r.lifecycle_stage = 'active'"
        ).fetchall()
    return dict(rows)


def _studies(root: Path) -> dict[str, int]:
    """study name -> number of trials in it (stale and surplus ones included)."""
    url = f"sqlite:///{root / 'optuna.db'}"
    return {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(url)}


def _rows(results: Path, name: str, cells: list[str]) -> pd.DataFrame:
    frame = pd.read_csv(results / name, dtype={"cell_key": str, "shared_key": str})
    if "cell" in frame:
        frame = frame[frame["cell"].isin(cells)].sort_values(["cell", *(["seed"] if "seed" in frame else [])])
    return frame.drop(columns=["protocol_hash"], errors="ignore").reset_index(drop=True)


@pytest.fixture(scope="module")
def story(tmp_path_factory, data_root):
    """The protocol run through every version of VERSIONS, then with another learning rate; after each step a
    copy of the results folder, the MLflow runs and the Optuna studies."""
    root = tmp_path_factory.mktemp("grow")
    options = Options(
        storage=f"sqlite:///{root / 'optuna.db'}",
        tracking_uri=str(root / "mlruns"),
        results_dir=root / "results",
        data_root=str(data_root),
        quiet=True,
    )
    steps = {}
    for step, losses in [*VERSIONS.items(), ("d", VERSIONS["e"])]:
        path = root / f"{step}.yaml"
        path.write_text(text(losses, lr="2.0e-3" if step == "d" else "1.0e-3", description=step.rstrip("2")))
        run_protocol(path, options)
        snap = root / "snap" / step
        shutil.copytree(root / "results" / "grow", snap)
        steps[step] = {"path": path, "results": snap, "runs": _runs(root), "studies": _studies(root)}
    return root, steps


def test_keys_depend_on_the_cell_and_the_shared_settings_only():
    a, b = parse_protocol(text(VERSIONS["a"])), parse_protocol(text(VERSIONS["b"]))
    e, d = parse_protocol(text(VERSIONS["e"])), parse_protocol(text(VERSIONS["a"], lr="2.0e-3"))
    words = parse_protocol(text(VERSIONS["a"], description="other words"))
    assert a.hash != b.hash and a.shared_hash == b.shared_hash == e.shared_hash == words.shared_hash
    assert d.shared_hash != a.shared_hash and a.shared_key == a.shared_hash[:12]

    def keys(p):
        return {c.id: cell_key(p, c) for c in plan(p).cells}

    ka, kb, ke, kd = keys(a), keys(b), keys(e), keys(d)
    assert set(kb) == {*OLD, ADDED} and all(kb[c] == ka[c] for c in OLD)  # a cell added changes no other key
    assert ke["triplet+batch_hard"] == kb["triplet+batch_hard"] and ke["contrastive+none"] != kb["contrastive+none"]
    assert not set(kd.values()) & set(ka.values())  # a shared setting changes every key
    bound = a.with_data("f" * 64)
    assert cell_key(bound, plan(bound).cells[0]) == ka["triplet+batch_hard"] + ".ffffffff"


@pytest.mark.slow
def test_adding_a_cell_trains_that_cell_only(story):
    _, s = story
    a, b = s["a"], s["b"]
    for table in ("trials.csv", "finals.csv"):  # the rows of the cells already there: their records, as they were
        pd.testing.assert_frame_equal(_rows(a["results"], table, OLD), _rows(b["results"], table, OLD))
    finals = pd.read_csv(b["results"] / "finals.csv")
    assert (
        set(finals["cell"]) == {*OLD, ADDED}
        and (finals["protocol_hash"] == parse_protocol(b["path"].read_text()).hash).all()
    )
    pd.testing.assert_frame_equal(_rows(a["results"], "floor.csv", []), _rows(b["results"], "floor.csv", []))
    # the MLflow runs of A are all still there, unchanged, and B added the new cell's runs only
    assert a["runs"].items() <= b["runs"].items()
    new = set(b["runs"]) - set(a["runs"])
    assert len(new) == RUNS_PER_CELL and all(f"/{ADDED}" in k for k in new), new
    # no trial added to the old cells' studies; two new studies for the new cell
    assert {n: c for n, c in b["studies"].items() if n in a["studies"]} == a["studies"]
    assert sorted(set(b["studies"]) - set(a["studies"])) == [
        f"grow:{json.loads((b['results'] / 'manifest.json').read_text())['cell_keys'][ADDED]}:{ADDED}{end}"
        for end in ("", ":final")
    ]
    ma, mb = (json.loads((x["results"] / "manifest.json").read_text()) for x in (a, b))
    assert ma["shared_key"] == mb["shared_key"] and ma["protocol_hash"] != mb["protocol_hash"]
    assert {c: mb["cell_keys"][c] for c in OLD} == ma["cell_keys"] and mb["cells"] == [
        "triplet+batch_hard",
        ADDED,
        "contrastive+none",
    ]


@pytest.mark.slow
def test_removing_a_cell_drops_its_rows_and_keeps_its_records(story):
    root, s = story
    b, c, b2 = s["b"], s["c"], s["b2"]
    kept = ["triplet+batch_hard", ADDED]
    for table in ("trials.csv", "finals.csv", "summary.csv"):
        assert "contrastive+none" not in set(pd.read_csv(c["results"] / table)["cell"])
        assert _rows(c["results"], table, kept).equals(_rows(b["results"], table, kept))
    assert json.loads((c["results"] / "manifest.json").read_text())["cells"] == kept
    assert c["runs"] == b["runs"] and c["studies"] == b["studies"]  # nothing trained, nothing deleted
    # put back, the cell is read from the records it kept: the tables are B's again, nothing trained
    assert b2["runs"] == b["runs"] and b2["studies"] == b["studies"]
    for table in ("trials.csv", "finals.csv", "summary.csv", "floor.csv"):
        assert (b2["results"] / table).read_text() == (b["results"] / table).read_text(), table


@pytest.mark.slow
def test_a_changed_search_space_retrains_that_cell_and_a_shared_setting_everything(story):
    root, s = story
    b, e, d = s["b2"], s["e"], s["d"]
    same = ["triplet+batch_hard", ADDED]
    pd.testing.assert_frame_equal(_rows(b["results"], "finals.csv", same), _rows(e["results"], "finals.csv", same))
    new = set(e["runs"]) - set(b["runs"])
    assert len(new) == RUNS_PER_CELL and all("/contrastive+none" in k for k in new)
    # another learning rate: the results are moved aside and every cell and the floor are trained again
    assert (root / "results" / f"grow@{parse_protocol(e['path'].read_text()).hash12}").is_dir()
    new = set(d["runs"]) - set(e["runs"])
    assert len(new) == 3 * RUNS_PER_CELL + 2 and sum("/floor/" in k for k in new) == 2
    md, me = (json.loads((x["results"] / "manifest.json").read_text()) for x in (d, e))
    assert md["shared_key"] != me["shared_key"] and not set(md["cell_keys"].values()) & set(me["cell_keys"].values())


def _regress(baseline: Path, current: Path, out: Path) -> tuple[int, dict]:
    code = main(["regress", "--baseline", str(baseline), "--current", str(current), "--json", str(out)])
    return code, json.loads(out.read_text()) if code != 2 else {}


@pytest.mark.slow
def test_regress_compares_the_cells_two_versions_share(story, tmp_path, capsys):
    _, s = story
    out = tmp_path / "r.json"
    code, doc = _regress(s["a"]["results"], s["b"]["results"], out)  # a cell added: reported, not a failure
    assert code == 0 and doc["added"] == [ADDED] and doc["dropped"] == []
    status = {c["cell"]: c["status"] for c in doc["cells"]}
    assert status == {"triplet+batch_hard": "same", "contrastive+none": "same", ADDED: "new"}
    assert f"added in the current version (not compared): {ADDED}" in capsys.readouterr().out
    code, doc = _regress(s["b"]["results"], s["c"]["results"], out)  # a cell removed: a failure naming it
    assert code == 1 and doc["dropped"] == ["contrastive+none"] and doc["regressions"] == ["contrastive+none"]
    assert {c["cell"]: c["status"] for c in doc["cells"]}["contrastive+none"] == "dropped"
    assert "dropped from the current version: contrastive+none" in capsys.readouterr().out
    code, doc = _regress(s["b"]["results"], s["e"]["results"], out)  # redefined: the old cell is dropped
    assert code == 1 and doc["dropped"] == doc["added"] == ["contrastive+none"] == doc["regressions"]
    assert "dropped from the current version: contrastive+none (redefined)" in capsys.readouterr().out
    # other shared settings: another experiment, refused in one line
    assert main(["regress", "--baseline", str(s["e"]["results"]), "--current", str(s["d"]["results"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other shared settings" in err[0], err


@pytest.mark.slow
def test_claims_check_requires_against_a_version_that_shares_the_cell(story, tmp_path, capsys):
    from bench.reports import claims, source

    _, s = story
    results = tmp_path / "grow"
    shutil.copytree(s["b"]["results"], results)
    manifest = json.loads((results / "manifest.json").read_text())
    del manifest["protocol_text"]  # found through the file it names: version e, which redefined contrastive
    manifest["protocol_file"] = str(s["e"]["path"])
    (results / "manifest.json").write_text(json.dumps(manifest))
    res = source.load(results)
    assert res.plan is not None and res.plan.protocol.hash == parse_protocol(s["e"]["path"].read_text()).hash
    assert res.same_cell(res.plan, "triplet+batch_hard") and not res.same_cell(res.plan, "contrastive+none")
    assert claims.versions(res)["added"] == claims.versions(res)["dropped"] == ["contrastive+none"]
    claims_file = tmp_path / "grow.yaml"  # the protocol's own claims file: claims.md and claims.json
    claims_file.write_text(
        "protocol: grow\nclaims:\n"
        "  - {id: c, kind: reaches, cell: contrastive+none, value: 0.1, source: s,"
        " requires: {cell: {loss: contrastive}}}\n"
    )
    assert main(["claims", str(claims_file), "--results", str(results), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "drops cells of these results (claims on them are not testable): contrastive+none" in printed
    verdict = json.loads((tmp_path / "claims.json").read_text())["verdicts"][0]
    assert verdict["verdict"] == "not testable"
    # the collapsed-cell rule may speak first on so short a training; else the redefinition is the reason
    assert "otherwise than the run did" in verdict["reason"] or "floor" in verdict["reason"], verdict["reason"]
    # the manifest's own protocol text is the version that ran: no version line, the cell is the same
    shutil.copy(s["b"]["results"] / "manifest.json", results / "manifest.json")
    assert claims.versions(source.load(results)) is None


def _job(root: Path, name: str, protocol: Path, cells: str, data_root: Path) -> Path:
    """`dmlbench run --cells` into its own results folder, Optuna storage and MLflow store."""
    job = root / name
    argv = ["run", str(protocol), "--cells", cells, "--results-dir", str(job / "results")]
    argv += ["--storage", f"sqlite:///{job / 'optuna.db'}", "--tracking-uri", str(job / "mlruns")]
    assert main([*argv, "--data-root", str(data_root), "--threads", "1", "--quiet"]) == 0
    return job / "results"


@pytest.mark.slow
def test_merge_of_jobs_with_their_own_stores_equals_one_sweep(story, tmp_path, data_root, capsys):
    _, s = story
    protocol = s["b2"]["path"]  # all three cells; its tables: one sweep's (built over versions a and b)
    first = _job(tmp_path, "j1", protocol, "triplet+batch_hard,contrastive+none", data_root)
    second = _job(tmp_path, "j2", protocol, ADDED, data_root)
    assert json.loads((first / "grow" / "manifest.json").read_text())["cells"] == [
        "triplet+batch_hard",
        "contrastive+none",
    ]
    merged = tmp_path / "merged"
    assert main(["merge", str(merged), str(first), str(second)]) == 0
    for table in ("trials.csv", "finals.csv", "summary.csv", "floor.csv"):
        one, joined = (
            pd.read_csv(d / table).drop(columns=RUN_ONLY, errors="ignore") for d in (s["b2"]["results"], merged)
        )
        pd.testing.assert_frame_equal(one, joined, check_exact=True, obj=table)
    manifest = json.loads((merged / "manifest.json").read_text())
    single = json.loads((s["b2"]["results"] / "manifest.json").read_text())
    assert manifest["cells"] == single["cells"] and manifest["cell_keys"] == single["cell_keys"]
    assert manifest["not_run"] == {} and len(manifest["merged_from"]) == 2
    assert {p.name for p in (merged / "artifacts").iterdir()} == set(single["cells"])
    assert main(["leaderboard", str(merged), "--quiet"]) == 0
    capsys.readouterr()
    # a planned cell no job ran: tables of the rest, the cell named, exit 1
    assert main(["merge", str(tmp_path / "part"), str(first)]) == 1
    assert json.loads((tmp_path / "part" / "manifest.json").read_text())["not_run"] == {ADDED: "no merged job ran it"}
    assert ADDED in capsys.readouterr().err
    # refusals: one line, exit 2, nothing written
    for jobs, words in (
        ([first, s["b2"]["results"]], "was run by two jobs"),  # the one sweep holds j1's cells too
        ([second, s["d"]["results"]], "differ in shared_hash"),  # another learning rate: another experiment
        ([merged, second], "exists and is not an empty folder"),
    ):
        out = tmp_path / "refused"
        assert (
            main(["merge", str(out if words != "exists and is not an empty folder" else merged), *map(str, jobs)]) == 2
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not out.exists()


@pytest.mark.slow
def test_the_mlflow_leaderboard_of_a_grown_version_reads_the_cells_it_kept(story, tmp_path):
    """Version B's runs in MLflow are those of its new cell; its other cells were recorded under version A.
    Read by cell key, the leaderboard from MLflow holds all three, with A's numbers."""
    from bench.reports import mlflow_source

    root, s = story
    version = parse_protocol(s["b"]["path"].read_text()).hash
    res = mlflow_source.load("grow", tmp_path / "lb", tracking_uri=str(root / "mlruns"), protocol_hash=version[:12])
    assert sorted(res.cells) == sorted([*OLD, ADDED])
    table = pd.read_csv(s["b"]["results"] / "finals.csv")
    for cell in res.cells:
        want = table[table["cell"] == cell].sort_values("seed")["map_at_r"].to_numpy()
        assert res.values(cell, "map_at_r") == pytest.approx(want), cell
    assert len(res.floor) == 2  # the floor, recorded once under the shared key
