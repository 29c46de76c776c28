"""The Optuna storage, opened one way: an RDB storage on any URL `bench.stores.urls` reads.

A SQLite file's folder is created and its connections wait for locks (60 s)
instead of failing at once; a database server is bounded by
``connect_timeout`` and its pooled connections are checked before use.
Workers starting at once on a new database race to create its tables: the
loser retries. Heartbeats and what to do with a trial whose heartbeat
stopped are the caller's (the sweep's trial slots pass theirs in); nothing
here knows what a trial is for.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

from bench.errors import BenchError
from bench.stores.urls import parse, redact, with_connect_timeout

__all__ = ["SQLITE_LOCK_WAIT_S", "open_storage"]

SQLITE_LOCK_WAIT_S = 60  # a SQLite writer waits this long for another's lock before failing


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
    for attempt in range(4):  # two workers starting at once on a new database race to create its tables
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            try:
                return optuna.storages.RDBStorage(
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
    raise AssertionError("unreachable")
