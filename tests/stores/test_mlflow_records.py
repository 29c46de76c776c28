"""MLflow runs by key: a key two workers create at once ends as one run, even when the inserts interleave badly."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bench.protocol import load_protocol
from bench.stores.mlflow_runs import SETTLE_S, MlflowRecords

ROOT = Path(__file__).resolve().parents[2]


def test_a_shared_key_stamped_first_but_inserted_last_ends_as_one_run(tmp_path, monkeypatch):
    """The PostgreSQL flake: worker B stamps its run's start time first, but its insert lands after worker A
    has inserted and looked. Both must keep the same run (the older by start time), and the other is deleted."""
    protocol = load_protocol(ROOT / "protocols" / "omniglot-smoke.yaml")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    early, late = MlflowRecords(protocol, uri, {}), MlflowRecords(protocol, uri, {})
    store = late.client._tracking_client.store  # the SQL store (one per URI, shared by both clients)
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
    kept["a"] = early.run(early.key(None, "floor", 0), "floor seed 0", shared=True)
    b.join()

    runs = early._find(f"{protocol.shared_key}/floor/0")
    assert [r.info.run_id for r in runs] == [kept["a"]] == [kept["b"]]


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
