"""Real servers for the fault tests and scripts/fault_matrix.py: a PostgreSQL cluster that can be stopped and
started again on the same port, and an MLflow tracking server that can be killed and restarted.

Everything listens on 127.0.0.1 only. PostgreSQL comes from Debian's binaries (tests/stores/test_postgres.py installs
them when missing); as root it runs as the `postgres` user, since PostgreSQL refuses root.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.stores.mlflow_template import seed_new_store

DATABASES = ("optuna", "mlflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin() -> Path | None:
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    return Path(max(found, key=lambda p: int(Path(p).parts[-3]))).parent if found else None


class Postgres:
    """A private cluster in a new folder under /tmp with the databases `DATABASES`; ``stop()`` and ``start()`` keep the port.

    ``password``: when given, the superuser has it and connections must give it (scram), so a test can
    check that the password never shows; otherwise trust authentication."""

    def __init__(self, password: str | None = None) -> None:
        bindir = pg_bin()
        if bindir is None:
            raise RuntimeError("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin")
        # a folder of its own under /tmp: the `postgres` user cannot enter a test's private (0700) folders
        home = Path(tempfile.mkdtemp(prefix="dmlbench-pg-"))
        self.bindir, self.home, self.password = bindir, home, password
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(home, "postgres", "postgres")
        self.data = home / "data"
        self.port = 0
        self.running = False
        args = ["-D", str(self.data), "-U", "postgres", "--no-locale", "-E", "UTF8", "--no-sync"]
        if password:
            pwfile = home / "pw"
            pwfile.write_text(password + "\n")
            if self.as_user:
                shutil.chown(pwfile, "postgres", "postgres")
            args += ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
        else:
            args += ["--auth=trust"]
        self._pg(str(bindir / "initdb"), *args)
        if password:
            (home / "pw").unlink()
        for _ in range(5):  # another process may take the free port before the server binds it
            self.port = free_port()
            if self.start(check=False):
                break
        else:
            raise RuntimeError(f"PostgreSQL did not start: {self.log()[-2000:]}")
        import psycopg2

        con = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", password=password)
        con.autocommit = True
        with con.cursor() as cur:
            for name in DATABASES:
                cur.execute(f"create database {name}")
        con.close()

    def _pg(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.as_user, *args], cwd=self.home, capture_output=True, text=True, timeout=120, check=check
        )

    def log(self) -> str:
        path = self.home / "log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, check: bool = True) -> bool:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.home} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        done = self._pg(
            str(self.bindir / "pg_ctl"),
            "start",
            "-D",
            str(self.data),
            "-w",
            "-t",
            "60",
            "-l",
            str(self.home / "log"),
            "-o",
            options,
            check=False,
        )
        self.running = done.returncode == 0
        if check and not self.running:
            raise RuntimeError(f"PostgreSQL did not start again: {done.stderr}{self.log()[-2000:]}")
        return self.running

    def stop(self, mode: str = "fast") -> None:
        """``fast``: connections are terminated (what a restart does); ``immediate``: as a crash."""
        self._pg(str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w", check=False)
        self.running = False

    def create(self, *names: str) -> None:
        """New empty databases (one pair per fault case)."""
        import psycopg2

        con = psycopg2.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", password=self.password
        )
        con.autocommit = True
        with con.cursor() as cur:
            for name in names:
                cur.execute(f"create database {name}")
        con.close()

    def url(self, database: str) -> str:
        """The database's URL without a password (it comes from PGPASSWORD, as in the README's recipe)."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def env(self) -> dict[str, str]:
        return {"PGPASSWORD": self.password} if self.password else {}

    def close(self) -> None:
        if self.running:
            self.stop("immediate")
        shutil.rmtree(self.home, ignore_errors=True)


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with a SQLite backend under ``home``; ``kill()`` and ``start()`` keep the port.

    ``auth``: (user, password) runs MLflow's basic-auth app, the admin created from
    MLFLOW_AUTH_ADMIN_PASSWORD (an environment variable, never the command line)."""

    def __init__(self, home: Path, auth: tuple[str, str] | None = None, extra_path: str | None = None) -> None:
        self.home, self.auth, self.extra_path = home, auth, extra_path
        home.mkdir(parents=True, exist_ok=True)
        seed_new_store(home / "mlflow.db")  # what dmlbench does for a new SQLite store: spares the migrations
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.home / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.home / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        return [*cmd, "--app-name", "basic-auth"] if self.auth else cmd

    def start(self, timeout: float = 90) -> None:
        env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING"}
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI"):
            env.pop(key, None)
        if self.extra_path:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (self.extra_path, env.get("PYTHONPATH", "")) if p)
        if self.auth:
            config = self.home / "basic_auth.ini"
            config.write_text(
                "[mlflow]\ndefault_permission = READ\n"
                f"database_uri = sqlite:///{self.home / 'basic_auth.db'}\n"
                f"admin_username = {self.auth[0]}\n"
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                # a successful password check kept a minute: the app's PBKDF2 check costs 0.5-1 s a request here
                "auth_cache_ttl_seconds = 60\n"
            )
            env["MLFLOW_AUTH_CONFIG_PATH"] = str(config)
            env["MLFLOW_AUTH_ADMIN_PASSWORD"] = self.auth[1]
            env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = "csrf-key-" + os.urandom(8).hex()  # CSRF, from the environment
        self.log = open(self.home / "server.log", "ab")
        self.proc = subprocess.Popen(
            self.command(), cwd=self.home, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        import requests

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}: {self.read_log()[-3000:]}")
            try:
                if requests.get(self.uri + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not answer in {timeout} s: {self.read_log()[-3000:]}")

    def read_log(self) -> str:
        path = self.home / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the server's whole process group (uvicorn or gunicorn and its workers)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def close(self) -> None:
        self.kill()
