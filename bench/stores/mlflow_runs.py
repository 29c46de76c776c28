"""Writing to MLflow, one way: `MlflowWriter` for any run, `MlflowRecords` for a sweep's runs found again by key.

`MlflowWriter` is what `dmlbench train` (bench/single_run.py) and sweeps both
write through, so every run gets the same treatment: the store is checked
reachable and opened under a lock on a local SQLite file, the experiment's
artifacts go beside that file, parameters are flattened (``loss_params.margin``),
parameter and tag values are cut to what MLflow accepts, infinite metrics
are kept as the largest double and non-numeric ones skipped, and a value
already logged is not logged twice. Provenance tags come from
bench/stores/provenance.py; where the store is, from bench/stores/tracking.py.

`MlflowRecords`: one experiment per protocol (``dmlbench/<name>``), a parent
run per cell, child runs per trial, per fold and per final seed. Each run
carries the tag ``dmlbench.key`` (``<cell key>/<cell>/trial3/fold0``: the cell's key, `bench.plan.cell_key`,
for every run of a cell; ``<shared key>/floor/0`` for the floor, which no cell owns) and is looked up by it
before one is created, so a resumed or shared sweep records nothing twice, and a cell keeps its runs when
other cells are added to or removed from the protocol.

A tracking server or database that stops answering once the experiment is
open is waited for within `bench.stores.retry`'s window (``log``, ``end``,
``artifact``, ``run``, ``cell_run`` and ``delete_cell`` are each retried whole,
and each is idempotent: a run is found by key before one is created, a
value already logged is skipped), then the process stops with one line and
exit 75. A local SQLite store is not retried.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from bench.atomic import locked
from bench.errors import BenchError
from bench.plan import Cell, cell_key
from bench.protocol import Protocol
from bench.stores import retry
from bench.stores.mlflow_template import seed_new_store
from bench.stores.tracking import check_reachable, search_all
from bench.stores.urls import parse, redact, sqlite_path

__all__ = ["MAX_VALUE_CHARS", "SETTLE_S", "MlflowRecords", "MlflowWriter", "flatten"]

# Longer than an MLflow insert takes between the client's start-time stamp and its commit (see MlflowRecords.run).
SETTLE_S = 1.0
MAX_VALUE_CHARS = 6000  # MLflow 3 refuses longer parameter values (and tag values past 8000)


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts as dotted keys (``loss_params.margin``); values as MLflow stores them, strings, cut to
    MAX_VALUE_CHARS."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            text = "{}" if isinstance(value, Mapping) else str(value)
            flat[name] = text[:MAX_VALUE_CHARS]
    return flat


def tag_values(tags: Mapping[str, Any] | None) -> dict[str, str]:
    """Tags as MLflow stores them: strings, cut to MAX_VALUE_CHARS."""
    return {k: str(v)[:MAX_VALUE_CHARS] for k, v in (tags or {}).items()}


@contextmanager
def _creation_lock(uri: str) -> Iterator[None]:
    """Workers on one machine open a local SQLite store one at a time. Two that create a new store at once
    both run MLflow's schema migrations, and on SQLite those rebuild tables through temporary ones: the
    second fails ("table _alembic_tmp_latest_metrics already exists") and leaves the store unusable for
    both, which a retry cannot mend. A server or database URI is the server's to serialise."""
    path = sqlite_path(uri)
    if path is None:
        yield
        return
    with locked(path.with_name(path.name + ".lock")):
        yield


_retried = retry.retried(lambda writer: getattr(writer, "target", None))


class MlflowWriter:
    """Runs of one MLflow experiment, written through one client; every run carries ``base_tags``."""

    def __init__(self, uri: str, experiment: str, base_tags: Mapping[str, Any] | None = None) -> None:
        self.uri, self.base_tags = uri, tag_values(base_tags)
        check_reachable(uri)  # not answering now: one line in seconds (a mistyped host looks the same)
        target = _target(uri)
        with _creation_lock(uri):
            if target is None:
                path = sqlite_path(uri)
                if path is not None:
                    seed_new_store(path)  # a new local store: a copy of an empty one, not MLflow's migrations
                self._open(uri, experiment)
            else:  # reached a moment ago: a server going away now is waited for, as later
                retry.call(target, lambda: self._open(uri, experiment))
        self.target = target

    def _open(self, uri: str, name: str) -> None:
        """The client and the experiment, created if new."""
        from mlflow.tracking import MlflowClient

        for attempt in range(4):  # workers starting at once on a new server-backed store race to create it
            try:
                self.client = MlflowClient(tracking_uri=uri)
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    self.experiment_id = self._create_experiment(name)
                else:
                    self.experiment_id = experiment.experiment_id
                break
            except Exception as e:
                if retry.is_unreachable(e):
                    raise  # the retry window's to wait for
                if attempt == 3:
                    raise BenchError(
                        f"cannot open MLflow tracking store {redact(uri)!r}: {str(e).splitlines()[0]}"
                    ) from e
                time.sleep(1 + attempt)

    def _create_experiment(self, name: str) -> str:
        """With a SQLite store, artifacts go beside the database, not into the current directory."""
        location = None
        path = sqlite_path(self.uri)
        if path is not None:
            location = path.parent.joinpath("artifacts").as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # another worker created it first
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def create(self, name: str, tags: Mapping[str, Any] | None = None, parent: str | None = None) -> str:
        """A new RUNNING run named ``name`` (a child of ``parent`` if given); its id."""
        all_tags = {**self.base_tags, **tag_values(tags), "mlflow.runName": name}
        if parent:
            all_tags["mlflow.parentRunId"] = parent
        return str(self.client.create_run(self.experiment_id, tags=all_tags, run_name=name).info.run_id)

    @contextmanager
    def recording(self, name: str, tags: Mapping[str, Any] | None = None, parent: str | None = None) -> Iterator[str]:
        """A new run for the block: FINISHED on a clean exit, KILLED on Ctrl-C, FAILED on any other exception."""
        run_id = self.create(name, tags, parent)
        try:
            yield run_id
        except KeyboardInterrupt:
            self.client.set_terminated(run_id, "KILLED")
            raise
        except BaseException:
            self.client.set_terminated(run_id, "FAILED")
            raise
        self.client.set_terminated(run_id, "FINISHED")

    @_retried
    def log(
        self,
        run_id: str,
        params: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
        step: int = 0,
    ) -> None:
        """Log what is not logged yet: a resumed run keeps one value per metric, not two.

        Parameters are flattened; metrics that are not numbers are skipped. Two workers sharing a run (a
        cell's parent, after `MlflowRecords.run`'s settle time) log its parameters at about the same moment;
        the second insert breaks MLflow's unique (run, key) and is retried once on what is still missing,
        which is then nothing, as both log the same values."""
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.exceptions import MlflowException

        for attempt in (0, 1):
            existing = self.client.get_run(run_id).data
            stamp = int(time.time() * 1000)
            m = [
                Metric(k, _finite(v), stamp, step)
                for k, v in (metrics or {}).items()
                if k not in existing.metrics and isinstance(v, (int, float)) and not isinstance(v, bool)
            ]
            p = [Param(k, v) for k, v in flatten(params or {}).items() if k not in existing.params]
            t = [RunTag(k, v) for k, v in tag_values(tags).items()]
            if not (m or p or t):
                return
            try:
                self.client.log_batch(run_id, metrics=m, params=p, tags=t)
                return
            except MlflowException:
                if attempt or not p:
                    raise

    @_retried
    def artifact(self, run_id: str, name: str, text: str | None = None, path: Path | None = None) -> None:
        """Attach a file, or ``text`` written to a file called ``name``, to a run."""
        if path is not None:
            self.client.log_artifact(run_id, str(path))
            return
        with tempfile.TemporaryDirectory() as tmp:
            file = Path(tmp) / name
            file.write_text(text or "")
            self.client.log_artifact(run_id, str(file))

    @_retried
    def end(self, run_id: str, state: str) -> None:
        """Close a run with an MLflow status, or the status of an Optuna state (PRUNED is a finished run)."""
        status = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED", "KILLED": "KILLED"}.get(state, state)
        self.client.set_terminated(run_id, status)


class MlflowRecords(MlflowWriter):
    """A protocol's runs, found or created by a deterministic key, so nothing is recorded twice."""

    def __init__(self, protocol: Protocol, uri: str, base_tags: Mapping[str, Any]) -> None:
        self.protocol = protocol
        super().__init__(uri, f"dmlbench/{protocol.name}", base_tags)

    def key(self, cell: Cell | None, *parts: Any) -> str:
        """A run's ``dmlbench.key``: ``<cell key>/<cell>/<parts>`` for a cell's runs, ``<shared key>/<parts>``
        for the runs of no cell (``cell`` None: the floor)."""
        head = f"{cell_key(self.protocol, cell)}/{cell.id}" if cell is not None else self.protocol.shared_key
        return "/".join([head, *map(str, parts)])

    @_retried
    def run(
        self, key: str, name: str, parent: str | None = None, tags: dict[str, Any] | None = None, shared: bool = False
    ) -> str:
        """The run with this key (made by `key`): the existing one (reopened) or a new one.

        A key that several workers may create at once (``shared``: a cell's parent run, a floor seed; trial
        and seed keys are claimed through Optuna first) is found or created under the store's lock where the
        store is a local SQLite file (the workers that share it are on this machine): one creates, the others
        find it. Elsewhere it is looked up again after a settle time, and every worker keeps the oldest run and
        deletes its own if newer. The wait matters there: MLflow stamps a run's start time in the client
        before the insert, so a worker that looked at once could miss a run stamped earlier but inserted later,
        and both would keep their own (seen on PostgreSQL). On SQLite the lock spares every shared run that
        second (a real two-worker omniglot-quick sweep slept ~22 s of its 30 s of records)."""
        local = shared and sqlite_path(self.uri) is not None
        with _creation_lock(self.uri) if local else nullcontext():
            found = self._find(key)
            if found:
                run_id = found[0].info.run_id
                if found[0].info.status != "RUNNING":
                    self.client.update_run(run_id, status="RUNNING")
                return run_id
            run_id = self.create(name, {**(tags or {}), "dmlbench.key": key}, parent)
            if shared and not local:
                time.sleep(SETTLE_S)
            found = self._find(key)
            if len(found) > 1 and found[0].info.run_id != run_id:
                self.client.delete_run(run_id)
                return str(found[0].info.run_id)
            return run_id

    @_retried
    def cell_run(self, cell: Cell) -> str:
        """A cell's parent run: its methods, fixed parameters and search space, and the protocol file."""
        run_id = self.run(
            self.key(cell),
            cell.id,
            tags={
                "cell": cell.id,
                "loss": cell.loss,
                "miner": cell.miner or "none",
                "kind": "cell",
                "dmlbench.cell_key": cell_key(self.protocol, cell),
            },
            shared=True,
        )
        self.log(
            run_id,
            params={
                "loss": cell.loss,
                "miner": cell.miner or "none",
                "loss_params": cell.loss_params,
                "miner_params": cell.miner_params,
                "search_space": json.dumps(cell.search_space, sort_keys=True),
            },
        )
        self.artifact(run_id, f"{self.protocol.name}.yaml", text=self.protocol.text)
        return run_id

    def _find(self, full_key: str) -> list[Any]:
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`dmlbench.key` = '{full_key}'", max_results=10
        )
        return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))

    @_retried
    def delete_cell(self, cell: Cell) -> int:
        """Delete the runs of one cell under its current key (the cell run, its trials, folds, seeds)."""
        prefix = self.key(cell)
        runs = search_all(
            self.client, self.experiment_id, f"tags.`dmlbench.key` LIKE '{cell_key(self.protocol, cell)}/%'"
        )
        doomed = [
            r.info.run_id
            for r in runs
            if (key := r.data.tags.get("dmlbench.key", "")) == prefix or key.startswith(prefix + "/")
        ]
        for run_id in doomed:
            self.client.delete_run(run_id)
        return len(doomed)


def _target(uri: str) -> retry.Target | None:
    """What the retries call a server store, with the secrets its messages must not show; None for a file."""
    store = parse(uri)
    if not (store.is_http or store.is_server_db):
        return None
    try:
        password = urlsplit(uri).password or ""
    except ValueError:
        password = ""
    secrets = (password, unquote(password), os.environ.get("MLFLOW_TRACKING_PASSWORD", ""))
    kind = "MLflow tracking server" if store.is_http else "MLflow tracking store"
    return retry.Target(f"{kind} {redact(uri)!r}", tuple(s for s in secrets if s))


def _finite(v: float) -> float:
    """MLflow refuses infinities: the largest double keeps the sign and the order."""
    v = float(v)
    return v if not math.isinf(v) else math.copysign(1e308, v)
