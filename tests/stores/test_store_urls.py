"""Store URLs read one way (bench/stores/urls.py): paths, query strings, in-memory databases, redaction, timeouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.stores import urls
from bench.stores.urls import (
    CONNECT_TIMEOUT_S,
    default_url,
    parse,
    redact,
    sqlite_path,
    sqlite_url,
    with_connect_timeout,
)


def test_a_query_string_is_not_part_of_the_file(tmp_path: Path) -> None:
    u = parse(f"sqlite:///{tmp_path}/optuna.db?timeout=60")
    assert u.is_sqlite and u.path == tmp_path.resolve() / "optuna.db" and u.query == "timeout=60"
    assert sqlite_path(f"sqlite:///{tmp_path}/optuna.db?timeout=60&x=1") == tmp_path.resolve() / "optuna.db"


def test_a_relative_path_is_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert sqlite_path("sqlite:///runs/optuna.db") == tmp_path.resolve() / "runs" / "optuna.db"
    assert sqlite_path("sqlite:///./runs/../runs/optuna.db") == tmp_path.resolve() / "runs" / "optuna.db"
    assert sqlite_url("runs/x.db") == f"sqlite:///{tmp_path.resolve()}/runs/x.db"


def test_four_slashes_are_an_absolute_path() -> None:
    assert sqlite_path("sqlite:////abs/dir/o.db") == Path("/abs/dir/o.db")
    assert sqlite_url("/abs/dir/o.db") == "sqlite:////abs/dir/o.db"
    assert sqlite_path(sqlite_url("/abs/dir/o.db")) == Path("/abs/dir/o.db")  # the two read each other


def test_a_tilde_is_the_home_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert sqlite_path("sqlite:///~/stores/mlflow.db") == tmp_path.resolve() / "stores" / "mlflow.db"
    assert sqlite_url("~/o.db") == f"sqlite:///{tmp_path.resolve()}/o.db"


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///:memory:?cache=shared"])
def test_an_in_memory_database_has_no_file(url: str) -> None:
    u = parse(url)
    assert u.is_sqlite and u.path is None and sqlite_path(url) is None


def test_schemes_lose_their_driver_and_case() -> None:
    assert parse("sqlite+pysqlite:///x.db").scheme == "sqlite"
    pg = parse("PostgreSQL+psycopg2://u:p@db.example:5432/optuna?sslmode=require")
    assert pg.scheme == "postgresql" and pg.is_server_db and pg.path is None and pg.query == "sslmode=require"
    assert parse("https://mlflow.example").is_http and not parse("https://mlflow.example").is_server_db
    assert sqlite_path("postgresql://u@h/db") is None


@pytest.mark.parametrize("text", ["runs/optuna.db", "/abs/o.db", "~/o.db", "sqlite:/x", ""])
def test_a_text_without_scheme_slashes_is_a_plain_path(text: str) -> None:
    u = parse(text)
    assert u.scheme == "" and u.path is None and u.query == ""


def test_default_url_is_under_runs_and_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_url("optuna.db") == f"sqlite:///{tmp_path.resolve()}/{urls.DEFAULT_DIR}/optuna.db"
    assert (tmp_path / urls.DEFAULT_DIR).is_dir()
    assert default_url("mlflow.db", tmp_path / "elsewhere") == f"sqlite:///{tmp_path.resolve()}/elsewhere/mlflow.db"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://alice:s3cret@db.example:5432/optuna", "postgresql://alice:***@db.example:5432/optuna"),
        (
            "postgresql+psycopg2://alice:s3cret@db/optuna?sslmode=require",
            "postgresql+psycopg2://alice:***@db/optuna?sslmode=require",
        ),
        ("mysql://alice:s3cret@db/optuna", "mysql://alice:***@db/optuna"),
        ("https://alice:s3cret@mlflow.example", "https://alice:***@mlflow.example"),
        ("http://alice:s3cret@mlflow.example:5000/", "http://alice:***@mlflow.example:5000/"),
        ("postgresql://alice:s3@cret@db/optuna", "postgresql://alice:***@db/optuna"),  # an '@' in the password
    ],
)
def test_redact_hides_passwords(url: str, shown: str) -> None:
    assert redact(url) == shown and "s3" not in redact(url) and "cret" not in redact(url)


@pytest.mark.parametrize(
    "url", ["postgresql://alice@db/optuna", "https://mlflow.example", "sqlite:///runs/o.db", "runs/o.db", "sqlite://"]
)
def test_redact_leaves_a_url_without_password_alone(url: str) -> None:
    assert redact(url) == url


def test_with_connect_timeout_bounds_database_servers_only() -> None:
    assert with_connect_timeout("postgresql://u@h/db") == f"postgresql://u@h/db?connect_timeout={CONNECT_TIMEOUT_S}"
    assert (
        with_connect_timeout("postgresql+psycopg2://u@h/db?sslmode=require")
        == f"postgresql+psycopg2://u@h/db?sslmode=require&connect_timeout={CONNECT_TIMEOUT_S}"
    )
    assert with_connect_timeout("mysql://u@h/db").endswith(f"?connect_timeout={CONNECT_TIMEOUT_S}")
    for url in ("sqlite:///runs/o.db", "https://mlflow.example", "runs/o.db"):
        assert with_connect_timeout(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/db?connect_timeout=30",
        "postgresql://u@h/db?sslmode=require&connect_timeout=30",
        "postgres://u@h/db?CONNECT_TIMEOUT=30",
    ],
)
def test_with_connect_timeout_keeps_the_users_own(url: str) -> None:
    assert with_connect_timeout(url) == url


def test_with_connect_timeout_is_added_once() -> None:
    once = with_connect_timeout("postgresql://u@h/db")
    assert with_connect_timeout(once) == once and once.count("connect_timeout") == 1
    # a parameter that merely ends in the name is not the user's timeout
    assert with_connect_timeout("postgresql://u@h/db?xconnect_timeout=1").count("connect_timeout=") == 2
