"""Faults of the servers and disks a sweep depends on (issue 22), with the real parts: a PostgreSQL cluster stopped
and started again, an `mlflow server` SIGKILLed and restarted, an authenticated MLflow server, a full filesystem.

What each test holds to: a store that comes back within the retry window is waited for and the call succeeds
with nothing recorded twice; one that does not stops the worker with one line and exit 75; a full disk is one
line naming the path with nothing half-written left; no credential reaches a log, record, tag or error line.
The whole matrix, with several workers and faults at random moments, is scripts/fault_matrix.py; the
multi-worker cases here are marked `faults` and left out of the default run (pyproject.toml).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import _faults as F
import pytest
from _servers import MlflowServer, Postgres, pg_bin
from _sweeps import sweep, sweep_base  # noqa: F401

from bench.errors import BenchError
from bench.stores import retry
from bench.stores.optuna import open_storage

pytestmark = pytest.mark.slow


@pytest.fixture()
def window(monkeypatch):
    """A short retry window for the test (seconds)."""

    def set_window(seconds: float) -> None:
        monkeypatch.setenv(retry.WINDOW_ENV, str(seconds))

    return set_window


@pytest.fixture(scope="module")
def pg() -> Postgres:
    pytest.importorskip("psycopg2", reason="psycopg2-binary (the dev extra) is needed for PostgreSQL")
    if pg_bin() is None:
        from test_postgres import _install

        why = _install()
        if pg_bin() is None:
            pytest.skip(why or "PostgreSQL binaries not found")
    server = Postgres(password="pg-secret-Zq81")
    yield server
    server.close()


def _restart_later(stop: callable, start: callable, after: float) -> threading.Thread:
    def go() -> None:
        stop()
        time.sleep(after)
        start()

    thread = threading.Thread(target=go)
    thread.start()
    return thread


# --------------------------------------------------------------------------- PostgreSQL (the Optuna storage)


def test_postgres_restart_within_the_window_is_waited_for(pg, window, monkeypatch, caplog):
    """A storage call made while the server restarts (stop, 4 s, start) waits and succeeds: nothing lost."""
    import optuna

    monkeypatch.setenv("PGPASSWORD", pg.password)
    window(60)
    storage = open_storage(pg.url("optuna"))
    study = optuna.create_study(storage=storage, study_name="restart")
    study.enqueue_trial({"x": 1.0})
    thread = _restart_later(lambda: pg.stop("fast"), pg.start, 4)
    time.sleep(1)  # the server is down now
    began = time.monotonic()
    trial = study.ask()  # several storage calls, each retried until the server is back
    study.tell(trial, 0.5)
    thread.join()
    assert time.monotonic() - began >= 2  # it did wait for the server
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE"]
    assert "is not answering" in caplog.text and "answers again" in caplog.text
    assert pg.password not in caplog.text


def test_postgres_gone_longer_than_the_window_stops_in_one_line(pg, window, monkeypatch):
    """Past the window: StoreUnavailableError (exit 75), one line naming the storage, no password; later calls to
    the same storage fail at once; the records made before are there when the server is back."""
    import optuna

    monkeypatch.setenv("PGPASSWORD", pg.password)
    window(3)
    url = pg.url("optuna").replace("postgres@", f"postgres:{pg.password}@")  # a password in the URL: redacted
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name="gone")
    study.tell(study.ask(), 1.0)
    pg.stop("fast")
    try:
        began = time.monotonic()
        with pytest.raises(retry.StoreUnavailableError) as raised:
            study.get_trials()
        assert 3 <= time.monotonic() - began < 30
        message = str(raised.value)
        assert raised.value.exit_code == 75 and isinstance(raised.value, BenchError)
        assert "\n" not in message and "Optuna storage" in message and "rerun the same command" in message
        assert pg.password not in message and "***" in message
        began = time.monotonic()
        with pytest.raises(retry.StoreUnavailableError):  # given up on: no second wait
            study.get_trials()
        assert time.monotonic() - began < 1
    finally:
        pg.start()
    fresh = open_storage(url)
    assert len(optuna.load_study(study_name="gone", storage=fresh).get_trials()) == 1


def test_a_refused_call_is_not_retried(pg, window, monkeypatch):
    """Only unreachability waits: an error the server answers with (here: no such study) raises at once."""
    import optuna

    monkeypatch.setenv("PGPASSWORD", pg.password)
    window(60)
    storage = open_storage(pg.url("optuna"))
    began = time.monotonic()
    with pytest.raises(KeyError):
        optuna.load_study(study_name="never-made", storage=storage)
    assert time.monotonic() - began < 5


def test_store_retry_option_and_variable_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv(retry.WINDOW_ENV, "soon")
    with pytest.raises(BenchError, match="DMLBENCH_STORE_RETRY_S"):
        retry.window_s()
    monkeypatch.setenv(retry.WINDOW_ENV, "0")
    assert retry.window_s() == 0
    monkeypatch.delenv(retry.WINDOW_ENV)
    assert retry.window_s() == retry.DEFAULT_WINDOW_S
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", str(tmp_path / "x.yaml"), "--store-retry", "-1"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(F.REPO)},
    )
    assert done.returncode == 2 and "--store-retry" in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- the MLflow tracking server


@pytest.fixture()
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path / "mlflow-server")
    yield server
    server.close()


def test_mlflow_server_killed_and_restarted_is_waited_for(mlflow_server, window, monkeypatch):
    """SIGKILL the server; the writer's next calls wait for it and go on, and the run found by key is the same
    one: nothing recorded twice."""
    from bench.cli import bound_connections
    from bench.stores.mlflow_runs import MlflowWriter

    bound_connections()
    window(90)
    writer = MlflowWriter(mlflow_server.uri, "dmlbench/faults")
    run_id = writer.create("trial 0", {"dmlbench.key": "k/trial0"})
    writer.log(run_id, metrics={"a": 1.0})
    thread = _restart_later(mlflow_server.kill, mlflow_server.start, 3)
    time.sleep(0.5)
    writer.log(run_id, params={"p": 1}, metrics={"a": 2.0, "b": 3.0})  # a already logged: kept, not twice
    writer.end(run_id, "COMPLETE")
    thread.join()
    run = writer.client.get_run(run_id)
    assert run.data.metrics == {"a": 1.0, "b": 3.0} and run.data.params == {"p": "1"}
    assert run.info.status == "FINISHED"
    assert len(writer.client.get_metric_history(run_id, "a")) == 1


def test_mlflow_server_down_at_the_start_is_one_line_in_seconds(tmp_path, data_root):
    """Decided: a tracking server that does not answer when a worker starts is refused at once (exit 2): a
    mistyped host looks the same, and nothing is recorded yet. Mid-sweep it is waited for (test above)."""
    from _servers import free_port

    protocol = F.write_protocol(tmp_path)
    began = time.monotonic()
    w = F.start(
        F.run_args(
            protocol,
            f"sqlite:///{tmp_path / 'optuna.db'}",
            f"http://127.0.0.1:{free_port()}",
            tmp_path / "results",
            data_root,
        ),
        tmp_path / "worker.log",
        cwd=tmp_path,
    )
    code = w.wait(120)
    lines = w.output().strip().splitlines()
    assert code == 2 and len(lines) == 1 and "cannot reach MLflow tracking server" in lines[0], w.output()
    # start-up (imports, data, pre-flight) plus one connect timeout; far from the 300 s retry window
    assert time.monotonic() - began < 150


# --------------------------------------------------------------------------- who may write to the records


def _auth_deps() -> str | None:
    """Where MLflow's basic-auth app finds Flask-WTF: installed (the dev extra), or $DMLBENCH_AUTH_DEPS."""
    if importlib.util.find_spec("flask_wtf") is not None:
        return None
    extra = os.environ.get("DMLBENCH_AUTH_DEPS")
    if extra and (Path(extra) / "flask_wtf").is_dir():
        return extra
    pytest.skip("MLflow's basic-auth app needs Flask-WTF (pip install 'mlflow[auth]', in the dev extra)")


def test_sweep_against_authenticated_mlflow_and_postgres_leaks_no_password(pg, tmp_path, data_root):
    """The README's careful recipe: MLflow's basic-auth app (admin password from MLFLOW_AUTH_ADMIN_PASSWORD),
    PostgreSQL with a password (PGPASSWORD), credentials only in the environment. The sweep completes, an
    unauthenticated worker is refused in one line, and neither password appears in any log, table, manifest,
    MLflow tag or parameter, Optuna attribute, or process command line."""
    import optuna
    from mlflow.tracking import MlflowClient

    mlflow_password = "mlflow-secret-Kp27"
    server = MlflowServer(tmp_path / "server", auth=("admin", mlflow_password), extra_path=_auth_deps())
    try:
        pg.create("optuna_auth")
        storage = pg.url("optuna_auth")
        env = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": mlflow_password, **pg.env()}
        protocol = F.write_protocol(tmp_path, iterations=10, trials=1, seeds=1)
        results = tmp_path / "results"
        args = F.run_args(protocol, storage, server.uri, results, data_root)
        w = F.start(args, tmp_path / "worker.log", cwd=tmp_path, env=env)
        cmdline = Path(f"/proc/{w.proc.pid}/cmdline").read_bytes().decode(errors="replace")
        code = w.wait(600)
        assert code == 0, w.output()
        assert mlflow_password not in cmdline and pg.password not in cmdline

        # without credentials: refused in one line, exit 2, nothing recorded
        anon = F.start(args, tmp_path / "anon.log", cwd=tmp_path, env=pg.env())
        assert anon.wait(300) == 2, anon.output()
        lines = anon.output().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dmlbench: error:"), anon.output()

        texts = [w.output(), anon.output(), server.read_log()]
        texts += [p.read_text(errors="replace") for p in results.rglob("*") if p.is_file() and p.suffix != ".npz"]
        os.environ.update({k: v for k, v in env.items() if k.startswith("MLFLOW_")})
        try:
            client = MlflowClient(tracking_uri=server.uri)
            exp = client.get_experiment_by_name("dmlbench/faults")
            runs = client.search_runs([exp.experiment_id], max_results=1000)
        finally:
            for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                os.environ.pop(k, None)
        assert runs
        texts += [repr(r.data.tags) + repr(r.data.params) + repr(r.info) for r in runs]
        os.environ["PGPASSWORD"] = pg.password
        try:
            for name in optuna.get_all_study_names(storage=storage):
                study = optuna.load_study(study_name=name, storage=storage)
                texts.append(repr(study.user_attrs))
                texts += [repr(t.user_attrs) + repr(t.system_attrs) + repr(t.params) for t in study.get_trials()]
        finally:
            os.environ.pop("PGPASSWORD", None)
        for text in texts:
            assert mlflow_password not in text and pg.password not in text
    finally:
        server.close()


# --------------------------------------------------------------------------- a full disk


def _small_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode == 0


def test_full_disk_while_writing_tables_is_one_line_and_leaves_nothing_half_written(sweep, tmp_path):
    """`leaderboard` writing into a full filesystem (a real tmpfs when mount is allowed, else a file-size limit):
    exit 2, one line naming the file, no temp file left, the previous page intact; with room, it is written."""
    results = tmp_path / "mnt" / "results"
    mounted = _small_tmpfs(tmp_path / "mnt", "128k")
    try:
        shutil.copytree(sweep, results, ignore=shutil.ignore_patterns("*.npz", "leaderboard.*"))
        (results / "leaderboard.md").write_text("previous page\n")
        filler = tmp_path / "mnt" / "filler"
        if mounted:
            F.fill(filler)
        cmd = [sys.executable, "-m", "bench", "leaderboard", str(results)]
        env = {**os.environ, "PYTHONPATH": str(F.REPO)}

        def small_files() -> None:
            import resource

            resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

        done = subprocess.run(
            cmd, capture_output=True, text=True, env=env, preexec_fn=None if mounted else small_files, timeout=300
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr
        assert len(lines) == 1 and lines[0].startswith("dmlbench: error: ") and str(results) in lines[0], lines
        assert "Traceback" not in done.stderr
        assert not [p for p in results.rglob("*.tmp")]
        assert (results / "leaderboard.md").read_text() == "previous page\n"
        if mounted:
            filler.unlink()
        again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert again.returncode == 0, again.stderr
        assert (results / "leaderboard.md").read_text().startswith("#")
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(tmp_path / "mnt")])


def test_full_disk_for_the_cache_is_one_notice_and_the_data_are_used(tmp_path, monkeypatch, caplog):
    """A cache that cannot be written costs speed, not correctness: one notice naming the file, no temp file."""
    import numpy as np

    from bench.data.cache import cached_arrays

    cache = tmp_path / "cache"
    mounted = _small_tmpfs(cache, "64k")
    monkeypatch.setenv("DMLBENCH_CACHE", str(cache))
    try:
        big = {"x": np.arange(200_000, dtype=np.float32)}  # 800 kB: larger than the filesystem
        if mounted:
            got = cached_arrays("full", {"k": 1}, lambda: big)
        else:
            import resource

            old = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (65536, old[1]))
            try:
                got = cached_arrays("full", {"k": 1}, lambda: big)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, old)
        assert np.array_equal(got["x"], big["x"])
        notices = [r.getMessage() for r in caplog.records if "cache not written" in r.getMessage()]
        assert len(notices) == 1 and str(cache) in notices[0] and "\n" not in notices[0]
        assert list(cache.iterdir()) == []
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(cache)])


# --------------------------------------------------------------------------- several workers (marked: minutes)


@pytest.mark.faults
def test_two_workers_go_on_through_a_postgres_restart(pg, tmp_path, data_root):
    """Two workers, PostgreSQL stopped for 10 s at a moment inside the sweep and started again: both finish
    (exit 0), every slot once in Optuna, every key once in MLflow, the tables of an undisturbed run."""
    pg.create("optuna_two", "mlflow_two")
    storage, tracking = pg.url("optuna_two"), pg.url("mlflow_two")
    protocol = F.write_protocol(tmp_path, iterations=20)
    ref = tmp_path / "ref"
    one = F.start(
        F.run_args(protocol, f"sqlite:///{ref / 'optuna.db'}", str(ref / "mlruns"), ref / "results", data_root),
        tmp_path / "ref.log",
        cwd=tmp_path,
    )
    workers = [
        F.start(
            F.run_args(protocol, storage, tracking, tmp_path / f"results-{i}", data_root),
            tmp_path / f"w{i}.log",
            cwd=tmp_path,
            env=pg.env(),
        )
        for i in range(2)
    ]
    assert F.wait_for(lambda: any("trial" in w.output() for w in workers), 300), [w.output() for w in workers]
    pg.stop("fast")
    time.sleep(10)
    pg.start()
    for w in workers:
        code = w.wait(600)
        assert code == 0 and F.clean_exit(code, w.output()) is None, w.output()
    assert one.wait(600) == 0, one.output()
    os.environ["PGPASSWORD"] = pg.password
    try:
        assert F.optuna_once(storage) == []
        assert F.mlflow_once(tracking) == []
    finally:
        os.environ.pop("PGPASSWORD", None)
    reference = F.tables(ref / "results")
    for i in range(2):
        assert F.differences(reference, F.tables(tmp_path / f"results-{i}")) == []
