"""MLflow runs by key: a key two workers create at once ends as one run, even when the inserts interleave badly."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bench.mlflow_runs import SETTLE_S, MlflowRecords
from bench.protocol import load_protocol

ROOT = Path(__file__).resolve().parent.parent


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
    b = threading.Thread(target=lambda: kept.update(b=late.run("floor/0", "floor seed 0", shared=True)),
                         name="stamped-first")
    b.start()
    time.sleep(SETTLE_S / 10)  # A stamps later, inserts first, and looks while B's insert still waits
    kept["a"] = early.run("floor/0", "floor seed 0", shared=True)
    b.join()

    runs = early._find(f"{protocol.hash12}/floor/0")
    assert [r.info.run_id for r in runs] == [kept["a"]] == [kept["b"]]
