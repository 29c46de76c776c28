"""The Optuna storage, opened one way: an RDB storage on any URL `bench.stores.urls` reads.

A SQLite file's folder is created and its connections wait for locks (60 s)
instead of failing at once; a database server is bounded by
``connect_timeout`` and its pooled connections are checked before use.
Workers starting at once on a new database race to create its tables: the
loser retries. Heartbeats and what to do with a trial whose heartbeat
stopped are the caller's (the sweep's trial slots pass theirs in); nothing
here knows what a trial is for.

A database server that stops answering once the storage is open (a
restart) is waited for: every storage call is retried within the window of
`bench.stores.retry` (``$DMLBENCH_STORE_RETRY_S``, 300 s by default), then
stops the process with one line and exit 75. Heartbeats are not retried
(a missed beat is the caller's to ignore); SQLite files are not wrapped.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from bench.errors import BenchError
from bench.stores import retry
from bench.stores.urls import parse, redact, with_connect_timeout

__all__ = ["NOT_RETRIED", "SQLITE_LOCK_WAIT_S", "open_storage"]

SQLITE_LOCK_WAIT_S = 60  # a SQLite writer waits this long for another's lock before failing


# storage methods that are not retried: heartbeats (a missed beat is ignored by the caller) and what does not
# talk to the database, or only while the storage is being opened
NOT_RETRIED = frozenset(
    {
        "record_heartbeat",
        "get_heartbeat_interval",
        "get_heartbeat_stale_trial_callback",
        "is_heartbeat_enabled",
        "remove_session",
        "upgrade",
        "get_current_version",
        "get_head_version",
        "get_all_versions",
        "check_table_schema_compatibility",
    }
)
# private methods Optuna's own cache layer (_CachedStorage) and heartbeat checks call on the storage directly
_PRIVATE_CALLED = frozenset(
    {"_create_new_trial", "_set_trial_param", "_get_best_trial_id", "_get_trials", "_get_stale_trial_ids"}
)
_RETRYING: list[type] = []


def _retrying_class() -> type:
    """``RDBStorage`` whose database calls go through `bench.stores.retry` (built once, on first use: Optuna is
    imported lazily). A subclass, not a wrapper, so Optuna still caches it and sees its heartbeat."""
    if _RETRYING:
        return _RETRYING[0]
    import optuna

    base = optuna.storages.RDBStorage
    names = {
        name
        for klass in base.__mro__
        if klass.__module__.startswith("optuna")
        for name, value in vars(klass).items()
        if callable(value) and (not name.startswith("_") or name in _PRIVATE_CALLED)
    } - NOT_RETRIED
    wrapped = {
        name: retry.retried(lambda self: getattr(self, "dmlbench_target", None))(getattr(base, name))
        for name in sorted(names)
        if hasattr(base, name) and not isinstance(base.__dict__.get(name), (staticmethod, classmethod))
    }
    _RETRYING.append(type("RetryingRDBStorage", (base,), wrapped))
    return _RETRYING[0]


def open_storage(
    url: str,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    stale_trial_callback: Callable[[Any, Any], None] | None = None,
) -> Any:
    """An ``optuna.storages.RDBStorage`` on ``url``; heartbeats only when ``heartbeat_interval`` is given.

    ``grace_period`` and ``stale_trial_callback`` are Optuna's: how long a
    trial may stay silent, and what is called with ``(study, frozen_trial)``
    once Optuna has failed such a trial as stale. A URL that cannot be
    opened is a `BenchError` naming it, password redacted.
    """
    import optuna

    url = with_connect_timeout(url)
    store = parse(url)
    engine_kwargs: dict[str, Any] = (
        {"connect_args": {"timeout": SQLITE_LOCK_WAIT_S}} if store.is_sqlite else {"pool_pre_ping": True}
    )
    if store.path is not None:
        store.path.parent.mkdir(parents=True, exist_ok=True)
    klass = _retrying_class() if store.is_server_db else optuna.storages.RDBStorage
    for attempt in range(4):  # two workers starting at once on a new database race to create its tables
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            try:
                storage = klass(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=stale_trial_callback,
                )
            except Exception as e:  # a URL that cannot be opened is the user's
                if attempt == 3 or "UNIQUE constraint" not in str(e) and "already exists" not in str(e):
                    raise BenchError(f"cannot open Optuna storage {redact(url)!r}: {str(e).splitlines()[0]}") from e
                time.sleep(1 + attempt)
                continue
        if store.is_server_db:
            storage.dmlbench_target = retry.Target(f"Optuna storage {redact(url)!r}", _secrets(url))
        return storage
    raise AssertionError("unreachable")


def _secrets(url: str) -> tuple[str, ...]:
    """The URL's password, to keep out of retry messages (a driver may quote its connection string)."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return ()
    return (password, unquote(password)) if password else ()
