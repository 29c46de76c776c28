"""A new local SQLite MLflow store is a copy of an empty one MLflow built once: the same store, in milliseconds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bench.stores.mlflow_runs import MlflowWriter
from bench.stores.mlflow_template import seed_new_store, template_path


def _schema(path: Path) -> list[str]:
    """The store's schema, a line each, sorted: MLflow's own builds list some indexes and constraints in
    another order from one build to the next."""
    with sqlite3.connect(path) as db:
        text = "\n".join(row[0] for row in db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL"))
    return sorted(line.strip().rstrip(",") for line in text.splitlines())


def _rows(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute(sql).fetchall()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("DMLBENCH_CACHE", str(folder))
    return folder


def test_a_store_from_the_template_is_the_store_mlflow_builds(tmp_path: Path, cache: Path) -> None:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'plain.db'}").search_experiments()  # MLflow's own build
    first = MlflowWriter(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "exp")
    template = template_path()
    assert template.is_file() and template.is_relative_to(cache)
    built = template.stat().st_mtime_ns
    second = MlflowWriter(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", "exp")
    assert template.stat().st_mtime_ns == built  # copied, not built again

    plain = _schema(tmp_path / "plain.db")
    revision = _rows(tmp_path / "plain.db", "SELECT version_num FROM alembic_version")
    for writer, folder in ((first, "a"), (second, "b")):
        store = tmp_path / folder / "mlflow.db"
        assert _schema(store) == plain
        assert _rows(store, "SELECT version_num FROM alembic_version") == revision
        # the default experiment is the opener's (MLflow adds it on opening), then dmlbench's beside the file
        names = _rows(store, "SELECT experiment_id, name FROM experiments ORDER BY experiment_id")
        assert names == [(0, "Default"), (1, "exp")]
        run = writer.client.create_run(writer.experiment_id)
        writer.client.log_metric(run.info.run_id, "map_at_r", 0.5)
        assert writer.client.get_run(run.info.run_id).data.metrics == {"map_at_r": 0.5}
        location = writer.client.get_experiment(writer.experiment_id).artifact_location
        assert location == (tmp_path / folder / "artifacts").as_uri()
    assert "Default" not in str(_rows(template, "SELECT name FROM experiments"))


def test_a_damaged_template_is_built_again_and_an_existing_store_is_left_alone(tmp_path: Path, cache: Path) -> None:
    template = template_path()
    template.parent.mkdir(parents=True)
    template.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)  # cut short
    writer = MlflowWriter(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp")
    assert len(_rows(template, "SELECT version_num FROM alembic_version")) == 1
    run = writer.client.create_run(writer.experiment_id).info.run_id

    before = (tmp_path / "mlflow.db").read_bytes()
    seed_new_store(tmp_path / "mlflow.db")
    assert (tmp_path / "mlflow.db").read_bytes() == before
    again = MlflowWriter(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp")
    assert again.experiment_id == writer.experiment_id and again.client.get_run(run).info.run_id == run


def test_without_a_writable_cache_mlflow_builds_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMLBENCH_CACHE", "/proc/no-cache-here")
    writer = MlflowWriter(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp")
    assert writer.client.get_experiment(writer.experiment_id).name == "exp"
    assert _rows(tmp_path / "mlflow.db", "SELECT count(*) FROM alembic_version") == [(1,)]
