"""scripts/stores_pack.py: a chunk's records come back from a lent machine whole, in parts small enough to be
returned, and are refused where they would replace records written here meanwhile; a checkpoint restores the
records elsewhere (a running sweep's: tests/test_long_run.py). Real stores:
an MLflow SQLite store whose experiment keeps its artifacts in an absolute folder outside it (a run carried from
elsewhere), and an Optuna SQLite storage."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

import optuna
import pytest
from _shared import load_script
from mlflow.tracking import MlflowClient


def _script():  # type: ignore[no-untyped-def]
    return load_script("scripts/stores_pack.py")


def _trials(stores: Path) -> int:
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{stores / 'optuna.db'}")
    return len(study.trials)


def _step(stores: Path, artifact: str, size: int = 10) -> str:
    """One unit of a sweep's work: an Optuna trial, an MLflow run with an artifact, a results table line."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{stores / 'optuna.db'}", load_if_exists=True)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    client = MlflowClient(tracking_uri=f"sqlite:///{stores / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("e")
    run = client.create_run(experiment.experiment_id)
    (stores / "payload").write_bytes(os.urandom(size))  # incompressible, so the parts' sizes are known
    client.log_artifact(run.info.run_id, str(stores / "payload"), artifact)
    (stores / "payload").unlink()
    with (stores / "results" / "sweep" / "trials.csv").open("a") as f:
        f.write(f"{run.info.run_id}\n")
    return run.info.run_id


@pytest.fixture()
def carried(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A run's stores here (one unit done, its artifacts in an absolute folder) and the copy carried away."""
    here, artifacts = tmp_path / "here", tmp_path / "artifacts"
    (here / "results" / "sweep").mkdir(parents=True)
    MlflowClient(tracking_uri=f"sqlite:///{here / 'mlflow.db'}").create_experiment(
        "e", artifact_location=artifacts.as_uri()
    )
    first = _step(here, "old")
    away = tmp_path / "away"
    shutil.copytree(here, away)
    return here, away, artifacts, first


def test_a_chunk_comes_back_whole_in_parts(carried, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    here, away, artifacts, first = carried
    script = _script()
    assert script.main(["stamp", str(away)]) == 0
    kept_here = tmp_path / "artifacts-here"
    artifacts.rename(kept_here)  # the lent machine has none of the run's earlier artifacts
    new = [_step(away, "new", size=700_000) for _ in range(3)]
    out = tmp_path / "out"
    assert script.main(["pack", str(away), str(out), "--part-mib", "1"]) == 0
    parts = sorted(out.glob("stores.tgz.*"))
    assert len(parts) >= 2 and all(p.stat().st_size <= 1 << 20 for p in parts)
    held = parts[1].read_bytes()
    parts[1].unlink()  # a part that did not come back: named, nothing written
    assert script.main(["unpack", str(out), str(here)]) == 2
    assert _trials(here) == 1
    parts[1].write_bytes(held)
    shutil.rmtree(artifacts)
    kept_here.rename(artifacts)
    assert _trials(here) == 1
    assert script.main(["unpack", str(out), str(here)]) == 0
    assert _trials(here) == 4  # the carried-away trials are here now
    # read without MLflow's client, whose store this process keeps open on the replaced file
    with sqlite3.connect(here / "mlflow.db") as con:
        runs = dict(con.execute("SELECT run_uuid, artifact_uri FROM runs").fetchall())
    assert sorted(runs) == sorted([first, *new])
    for run_id, uri in runs.items():  # every run's artifact, the earlier one included
        assert len(list(Path(unquote(urlparse(uri).path)).rglob("payload"))) == 1, run_id
    assert (here / "results" / "sweep" / "trials.csv").read_text().split() == [first, *new]
    assert not (here / ".carried.json").exists()


def test_unpack_refuses_where_the_stores_here_moved_on(carried, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    here, away, _artifacts, _first = carried
    script = _script()
    script.main(["stamp", str(away)])
    _step(away, "new")
    out = tmp_path / "out"
    assert script.main(["pack", str(away), str(out)]) == 0
    _step(here, "meanwhile")  # a worker here went on after the stores were carried
    before = (here / "optuna.db").read_bytes()
    assert script.main(["unpack", str(out), str(here)]) == 2
    assert "not the database that was carried" in capsys.readouterr().err
    assert (here / "optuna.db").read_bytes() == before and _trials(here) == 2


def test_a_pack_too_large_to_come_back_writes_nothing(carried, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    _here, away, _artifacts, _first = carried
    script = _script()
    script.main(["stamp", str(away)])
    _step(away, "new", size=3_000_000)
    out = tmp_path / "out"
    assert script.main(["pack", str(away), str(out), "--part-mib", "1", "--max-files", "2"]) == 3
    assert "run shorter chunks" in capsys.readouterr().err
    assert not out.exists()
    assert script.main(["pack", str(tmp_path / "nowhere"), str(out)]) == 2


def _artifact_names(artifacts: Path) -> list[str]:
    return sorted(p.name for p in artifacts.rglob("*") if p.is_file())


def test_a_checkpoint_restores_the_records_but_the_kept_models(carried, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    here, _away, artifacts, _first = carried
    script = _script()
    _step(here, "second")
    reader = sqlite3.connect(here / "optuna.db")  # a worker holding the storage open does not stop a checkpoint
    reader.execute("SELECT COUNT(*) FROM trials").fetchone()
    out = tmp_path / "checkpoint"
    assert script.main(["checkpoint", str(here), str(out)]) == 0
    reader.close()
    summary = json.loads((out / "checkpoint.json").read_text())
    assert summary["trials"] == {"COMPLETE": 2} and summary["kept_files_left_out"] == 0
    (here / "w1.log").write_text("a worker's log\n")  # neither a record nor a table
    kept = next(artifacts.rglob("payload"))  # now a final seed's kept model (bench.sweep.kept), which no step reads
    kept.rename(kept.with_name("final_model.pt"))
    assert script.main(["checkpoint", str(here), str(out), "--part-mib", "0.001"]) == 0
    assert json.loads((out / "checkpoint.json").read_text())["kept_files_left_out"] == 1
    parts = sorted(out.glob("stores.tgz.*"))
    assert len(parts) > 1 and all(p.stat().st_size <= 1049 for p in parts)
    assert script.main(["checkpoint", str(here), str(out)]) == 0  # a refresh leaves no part of the last one
    assert [p.name for p in out.glob("stores.tgz.*")] == ["stores.tgz.00"]
    shutil.rmtree(artifacts)  # another machine: nothing of the run but the checkpoint
    there = tmp_path / "there"
    assert script.main(["unpack", str(out), str(there)]) == 0
    assert _trials(there) == 2 and (there / "results" / "sweep" / "trials.csv").read_text().count("\n") == 2
    assert not (there / "w1.log").exists()  # only the stores' databases, results and artifacts
    assert _artifact_names(artifacts) == ["payload"]  # the other run's artifact, back where its record says
    assert script.main(["unpack", str(out), str(there)]) == 0  # the same databases there: restored again
    _step(there, "later")
    assert script.main(["unpack", str(out), str(there)]) == 2  # a store that went on is never replaced
    assert _trials(there) == 3
    assert script.main(["behind", str(there), str(out)]) == 0  # ahead of the checkpoint: nothing lacking


def test_behind_names_a_folder_that_holds_no_checkpoint(carried, capsys) -> None:  # type: ignore[no-untyped-def]
    here, _away, _artifacts, _first = carried
    capsys.readouterr()
    assert _script().main(["behind", str(here), str(here)]) == 2  # the stores given as the checkpoint too
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a checkpoint" in err[0], err


def test_a_checkpoint_waits_for_a_writer_then_refuses(carried, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    here, _away, _artifacts, _first = carried
    script = _script()
    script.LOCK_TRIES, script.LOCK_WAIT_S = 2, 0.1
    writer = sqlite3.connect(here / "optuna.db", isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")  # a worker stopped mid-commit holds the database
    out = tmp_path / "checkpoint"
    assert script.main(["checkpoint", str(here), str(out)]) == 2
    assert "stayed locked" in capsys.readouterr().err and not out.exists()
    writer.execute("ROLLBACK")
    writer.close()
    (tmp_path / "empty").mkdir()
    assert script.main(["checkpoint", str(tmp_path / "empty"), str(out)]) == 2
    assert "not a sweep's stores" in capsys.readouterr().err


def test_same_tells_stores_that_ran_nothing_since_the_checkpoint(carried, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    here, _away, _artifacts, _first = carried
    script, out, there = _script(), tmp_path / "checkpoint", tmp_path / "there"
    assert script.main(["checkpoint", str(here), str(out)]) == 0
    # the databases it copied differ in bytes from these but hold the same records: the same stores
    assert script.main(["same", str(here), str(out)]) == 0
    assert script.main(["unpack", str(out), str(there)]) == 0
    assert script.main(["same", str(there), str(out)]) == 0
    capsys.readouterr()
    (there / "results" / "sweep" / "extra.csv").write_text("a table the checkpoint lacks\n")
    assert script.main(["same", str(there), str(out)]) == 1
    assert capsys.readouterr().out.strip().endswith("results/sweep/extra.csv: not in the checkpoint")
    (there / "results" / "sweep" / "extra.csv").unlink()
    _step(there, "later")
    assert script.main(["same", str(there), str(out)]) == 1
    assert "not the checkpoint's" in capsys.readouterr().out
    assert script.main(["same", str(there), str(there)]) == 2  # a folder that is no checkpoint


def test_unpack_without_states_keeps_this_machines_own(carried, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    here, away, _artifacts, _first = carried
    script = _script()
    assert script.main(["stamp", str(away)]) == 0
    _step(away, "new")
    states = Path("results") / "sweep" / "resume" / "cell"
    (away / states).mkdir(parents=True)
    (away / states / "budget-a.pt").write_bytes(b"the lent device's unfinished run")
    (away / states / "budget-b.pt").write_bytes(b"another it left unfinished")
    (here / states).mkdir(parents=True)
    (here / states / "budget-a.pt").write_bytes(b"this machine's state of the same run")
    out = tmp_path / "out"
    assert script.main(["pack", str(away), str(out)]) == 0
    other = tmp_path / "other"
    shutil.copytree(here, other)
    assert script.main(["unpack", "--no-states", str(out), str(here)]) == 0
    assert _trials(here) == 2  # the records came back
    assert (here / states / "budget-a.pt").read_bytes() == b"this machine's state of the same run"
    assert not (here / states / "budget-b.pt").exists()
    assert script.main(["unpack", str(out), str(other)]) == 0  # by default the states come back too
    assert (other / states / "budget-a.pt").read_bytes() == b"the lent device's unfinished run"
    assert (other / states / "budget-b.pt").exists()


def test_a_database_is_identified_by_its_records_not_the_order_a_library_reads_them(carried) -> None:  # type: ignore[no-untyped-def]
    # a lent machine's SQLite read the same database's rows in another order (its query planner's choice), so a
    # digest of the dump refused the records that came back; `reverse_unordered_selects` is that other order
    sp = _script()
    here = carried[0]
    path = here / "mlflow.db"

    def digest(reverse: bool) -> str:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            con.execute(f"PRAGMA reverse_unordered_selects = {int(reverse)}")
            assert sum(1 for _ in con.iterdump()) > 1
            return sp._records_digest(con)
        finally:
            con.close()

    def dump(reverse: bool) -> list[str]:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        con.execute(f"PRAGMA reverse_unordered_selects = {int(reverse)}")
        lines = list(con.iterdump())
        con.close()
        return lines

    assert dump(False) != dump(True)  # the dump follows the order the rows are read in
    assert digest(False) == digest(True) == sp._db_digest(path)
    before = sp._db_digest(path)
    _step(here, "more")  # one record more: another database
    assert sp._db_digest(path) != before
