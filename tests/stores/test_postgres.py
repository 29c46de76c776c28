"""The same sweep on PostgreSQL: two worker processes share a real server for Optuna and MLflow.

The fixture starts a private cluster from Debian's `postgresql` binaries
(installed here when missing and possible, else the test is skipped), on a
free port of 127.0.0.1 with trust authentication, and removes it afterwards.
PostgreSQL refuses to run as root: as root the server runs as `postgres`.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from _shared import RUNNER_TINY as TINY
from _shared import cli as _cli
from _shared import sweep_options as _options

from bench.stores.urls import redact
from bench.sweep.runner import run_protocol
from bench.sweep.tables import TIMING_COLUMNS, read
from bench.sweep.tuning import ATTR_SURPLUS, held

pytestmark = pytest.mark.slow

DATABASES = ("optuna", "mlflow")  # two: Optuna's and MLflow's Alembic both keep a table `alembic_version`


def _pg_bin() -> Path | None:
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    return Path(max(found, key=lambda p: int(Path(p).parts[-3]))).parent if found else None


def _install() -> str | None:
    """Install Debian's `postgresql` (as `make test`'s scripts/system-deps.sh does); why not, if it cannot."""
    if shutil.which("apt-get") is None:
        return "PostgreSQL is not installed and there is no apt-get to install it"
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if sudo and shutil.which("sudo") is None:
        return "PostgreSQL is not installed and installing it needs root"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [
        *sudo,
        "apt-get",
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "-o",
        "DPkg::Lock::Timeout=300",
        "postgresql",
    ]
    for cmd in (install, [*sudo, "apt-get", "update", "-qq"], install):  # update only when the first try fails
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode == 0 and cmd is install and _pg_bin() is not None:
            return None
    last = (done.stderr or done.stdout).strip().splitlines()
    return f"cannot install postgresql: {last[-1] if last else f'exit {done.returncode}'}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A private PostgreSQL server; yields `postgresql+psycopg2://postgres@127.0.0.1:<port>/` (add a database)."""
    psycopg2 = pytest.importorskip("psycopg2", reason="psycopg2-binary (the dev extra) is needed for PostgreSQL")
    bindir = _pg_bin()
    if bindir is None:
        why = _install()
        bindir = _pg_bin()
        if bindir is None:
            pytest.skip(why or "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin")
    as_user: list[str] = []
    if os.geteuid() == 0:  # "root" execution of the PostgreSQL server is not permitted
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as another user")
        as_user = ["runuser", "-u", "postgres", "--"]
    home = Path(tempfile.mkdtemp(prefix="dmlbench-pg-"))
    if as_user:
        shutil.chown(home, "postgres", "postgres")
    data = home / "data"

    def pg(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*as_user, *args], cwd=home, capture_output=True, text=True, timeout=120, check=check)

    started = False
    try:
        pg(
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-locale",
            "-E",
            "UTF8",
            "--no-sync",
        )
        for attempt in range(5):  # another process may take the free port before the server binds it
            port = _free_port()
            options = (
                f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={home} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            done = pg(
                str(bindir / "pg_ctl"),
                "start",
                "-D",
                str(data),
                "-w",
                "-t",
                "60",
                "-l",
                str(home / "log"),
                "-o",
                options,
                check=False,
            )
            if done.returncode == 0:
                started = True
                break
        if not started:
            log = (home / "log").read_text() if (home / "log").exists() else ""
            pytest.fail(f"PostgreSQL did not start: {done.stdout}{done.stderr}{log[-2000:]}")
        con = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
        con.autocommit = True
        with con.cursor() as cur:
            for name in DATABASES:
                cur.execute(f"create database {name}")
        con.close()
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/"
    finally:
        if started:
            pg(str(bindir / "pg_ctl"), "stop", "-D", str(data), "-m", "immediate", "-w", check=False)
        shutil.rmtree(home, ignore_errors=True)


def _without_timing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns])


def _mlflow_keys(uri: str) -> list[str]:
    """The `dmlbench.key` of every active run of the tiny protocol's experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dmlbench/tiny")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    assert len(runs) < 1000
    return [r.data.tags["dmlbench.key"] for r in runs if r.info.lifecycle_stage == "active"]


def test_two_workers_share_one_sweep_on_postgresql(postgres, tmp_path, data_root):
    """Two processes, Optuna and MLflow on PostgreSQL: every slot run once, the tables of one worker on SQLite."""
    import optuna

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.replace("ITERATIONS", "20"))
    storage, tracking = postgres + DATABASES[0], postgres + DATABASES[1]
    shared = ["--storage", storage, "--tracking-uri", tracking, "--data-root", str(data_root), "--quiet"]
    # the working directory is where MLflow puts artifacts of an experiment created on a database server
    workers = [
        _cli(["run", str(path), "--results-dir", str(tmp_path / f"results-{w}"), *shared], cwd=tmp_path) for w in "ab"
    ]
    single = tmp_path / "single"  # the same protocol, one worker, SQLite (in process, alongside the two)
    single.mkdir()
    run_protocol(path, _options(single, data_root))
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    no_result = "1 of 3 planned cell(s) have no result (contrastive-diverging+none: "
    assert [w.returncode for w in workers] == [1, 1] and all(no_result in o for o in outputs), outputs

    # every trial and final seed recorded exactly once in the Optuna storage
    studies = optuna.get_all_study_names(storage=storage)
    # tuning and finals for 3 cells (one cell never retrains: its finals stay empty) and the floor's seed slots
    assert len(studies) == 7 and sum(n.endswith(":floor") for n in studies) == 1, studies
    per_study = {}
    for name in studies:
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        finished = [t for t in trials if t.state.is_finished() and ATTR_SURPLUS not in t.system_attrs]
        slots = sorted(t.user_attrs["slot"] for t in finished)
        assert slots == sorted(set(slots)), (name, slots)  # no slot run twice, by two workers or otherwise
        assert set(held(trials, 2)) == set(slots)
        per_study[name] = len(slots)
    assert sorted(per_study.values()) == [0, 2, 2, 2, 2, 2, 2], per_study

    # one MLflow run per key, the same keys as one worker on SQLite
    keys = _mlflow_keys(tracking)
    assert len(keys) == len(set(keys)) == 3 + 6 + 6 + 4 + 2  # with the 2 floor seeds
    assert sorted(keys) == sorted(_mlflow_keys(f"sqlite:///{single / 'mlruns' / 'mlflow.db'}"))
    # MLflow's default artifact root for a database store: ./mlruns of the worker that created the experiment
    assert len(list((tmp_path / "mlruns").rglob("tiny.yaml"))) == 3  # the protocol, once per cell run

    # the same tables from either worker, and as from one worker on SQLite
    a, b = read(tmp_path / "results-a" / "tiny"), read(tmp_path / "results-b" / "tiny")
    reference = read(single / "results" / "tiny")
    for name in ("trials", "finals", "summary"):
        pd.testing.assert_frame_equal(_without_timing(a[name]), _without_timing(b[name]))
        # with fewer trials than TPE's startup trials, parameters depend on the slot alone, not on timing
        pd.testing.assert_frame_equal(_without_timing(a[name]), _without_timing(reference[name]))
    assert a["manifest"]["finished"] and b["manifest"]["finished"]
    assert a["manifest"]["storage"] == redact(storage)
