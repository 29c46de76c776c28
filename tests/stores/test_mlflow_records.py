"""MLflow runs by key: a key two workers create at once ends as one run, even when the inserts interleave badly."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from bench.protocol import load_protocol
from bench.stores.mlflow_runs import SETTLE_S, MlflowRecords

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mlflow_server(tmp_path):
    from tests._servers import MlflowServer

    server = MlflowServer(tmp_path / "mlflow-server")
    yield server
    server.close()


def stamped_first_inserted_last(uri: str, monkeypatch) -> tuple[list[str], dict[str, str], float]:
    """Worker B stamps a shared run's start time first, but its insert waits; worker A stamps later and looks
    while B's insert still waits. Returns the runs of the key, the run each kept, and A's seconds."""
    protocol = load_protocol(ROOT / "protocols" / "omniglot-smoke.yaml")
    early, late = MlflowRecords(protocol, uri, {}), MlflowRecords(protocol, uri, {})
    store = late.client._tracking_client.store  # one store object per URI, shared by both clients
    insert = store.create_run

    def slow_insert(*args, **kwargs):  # B's insert waits after the client stamped its start time
        if threading.current_thread().name == "stamped-first":
            time.sleep(SETTLE_S / 2)
        return insert(*args, **kwargs)

    monkeypatch.setattr(store, "create_run", slow_insert)
    kept: dict[str, str] = {}
    b = threading.Thread(
        target=lambda: kept.update(b=late.run(late.key(None, "floor", 0), "floor seed 0", shared=True)),
        name="stamped-first",
    )
    b.start()
    time.sleep(SETTLE_S / 10)  # A stamps later, inserts first, and looks while B's insert still waits
    start = time.perf_counter()
    kept["a"] = early.run(early.key(None, "floor", 0), "floor seed 0", shared=True)
    took = time.perf_counter() - start
    b.join()
    return [r.info.run_id for r in early._find(f"{protocol.shared_key}/floor/0")], kept, took


def test_a_shared_key_stamped_first_but_inserted_last_ends_as_one_run_on_sqlite(tmp_path, monkeypatch):
    """On a local SQLite store the shared key is found or created under the store's lock: A waits for B's
    insert and finds B's run, one run in all, and nobody sleeps the settle time."""
    runs, kept, took = stamped_first_inserted_last(f"sqlite:///{tmp_path / 'mlflow.db'}", monkeypatch)
    assert runs == [kept["a"]] == [kept["b"]]
    assert took < SETTLE_S  # B's insert (SETTLE_S / 2), not a settle on top


def test_a_shared_key_stamped_first_but_inserted_last_ends_as_one_run_on_a_server(mlflow_server, monkeypatch):
    """The PostgreSQL flake, on a store no file lock reaches (a tracking server): both look again after the
    settle time, keep the same run (the older by start time), and the other is deleted."""
    runs, kept, took = stamped_first_inserted_last(mlflow_server.uri, monkeypatch)
    assert runs == [kept["a"]] == [kept["b"]]
    assert took >= SETTLE_S


def test_two_workers_logging_a_shared_runs_parameters_at_once_both_succeed(tmp_path, monkeypatch):
    """MLflow reads a run's parameters, then inserts the new ones: worker B's insert between worker A's read
    and A's insert breaks the unique (run, key) (seen in the two-worker test). A retries on what is missing,
    which is nothing, as both log the same values."""
    protocol = load_protocol(ROOT / "protocols" / "omniglot-smoke.yaml")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    a, b = MlflowRecords(protocol, uri, {}), MlflowRecords(protocol, uri, {})
    run_id = a.run("cell", "cell")
    params = {"loss": "triplet", "search_space": {"margin": [0.01, 1.0]}}
    store = a.client._tracking_client.store  # one SQL store per URI, shared by both clients
    read_run, insert_params = store._get_run, store._log_params
    interleaved: list[bool] = []

    def a_inserts(run_uuid, new):
        def read_then_b_logs(*args, **kwargs):
            run = read_run(*args, **kwargs)
            if not interleaved:
                list(run.params)  # A has seen no parameters
                interleaved.append(True)
                monkeypatch.setattr(store, "_get_run", read_run)
                b.log(run_id, params=params)
            return run

        monkeypatch.setattr(store, "_get_run", read_then_b_logs)
        try:
            return insert_params(run_uuid, new)
        finally:
            monkeypatch.setattr(store, "_get_run", read_run)

    monkeypatch.setattr(store, "_log_params", a_inserts)
    a.log(run_id, params=params, metrics={"x": 1.0})
    assert interleaved
    data = b.client.get_run(run_id).data
    assert data.params == {"loss": "triplet", "search_space.margin": "[0.01, 1.0]"} and data.metrics == {"x": 1.0}
