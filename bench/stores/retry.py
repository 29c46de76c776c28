"""A store that stops answering mid-sweep: wait for it within a bounded window, then stop in one line.

A sweep on a cluster talks to a PostgreSQL server (the Optuna storage, and
perhaps MLflow's database) and an MLflow tracking server. Either may go away
for a while (a restart, a fail-over, a network blip). The rules:

* At the start, a store that does not answer is refused in seconds
  (`bench.stores.tracking.check_reachable`, ``connect_timeout``): exit 2,
  since a mistyped host looks the same as a stopped one.
* Once a sweep has reached a store, a call that fails because the store is
  unreachable (a refused or dropped connection, a server shutting down, an
  HTTP 5xx or no answer from MLflow) is retried: first after 1 s, then
  doubling up to 10 s, until the **retry window** has passed since the
  outage began. The window is ``$DMLBENCH_STORE_RETRY_S`` seconds (default
  300; ``run --store-retry`` sets it): long enough for a server restart,
  short enough that a worker does not hold its node for a dead server.
* Past the window the call raises `StoreUnavailableError`: one line naming
  the store (password redacted) and the last error, exit code 75
  (``EX_TEMPFAIL``), and every later call to that store in this process fails
  at once (a worker stopping gives nothing back to a store that is gone).
  Records already made are kept; the same command resumes.
* Only unreachability is retried: a refused write (a constraint, a bad
  value, a full disk on a SQLite store) raises as before. SQLite stores are
  never wrapped: their lock waits are SQLite's own.

The retried operations are idempotent or made so by their caller (an MLflow
run is found by key before one is created, a metric already logged is not
logged again), and only the outermost retried call of a thread retries, so
nested calls do not multiply the window.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from bench.errors import BenchError

__all__ = [
    "DEFAULT_WINDOW_S",
    "EXIT_STORE_UNAVAILABLE",
    "WINDOW_ENV",
    "StoreUnavailableError",
    "Target",
    "call",
    "is_unreachable",
    "retried",
    "window_s",
]

log = logging.getLogger("dmlbench.stores")

WINDOW_ENV = "DMLBENCH_STORE_RETRY_S"
DEFAULT_WINDOW_S = 300.0
EXIT_STORE_UNAVAILABLE = 75  # sysexits' EX_TEMPFAIL: try again later (a scheduler may requeue on it)
FIRST_WAIT_S, LONGEST_WAIT_S = 1.0, 10.0

T = TypeVar("T")


class StoreUnavailableError(BenchError):
    """A store stopped answering for longer than the retry window: one line, exit 75, the same command resumes."""

    exit_code = EXIT_STORE_UNAVAILABLE


def window_s() -> float:
    """The retry window in seconds: ``$DMLBENCH_STORE_RETRY_S`` (0 turns retries off), else 300."""
    text = os.environ.get(WINDOW_ENV, "").strip()
    if not text:
        return DEFAULT_WINDOW_S
    try:
        value = float(text)
    except ValueError:
        raise BenchError(f"{WINDOW_ENV}={text!r}: expected a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise BenchError(f"{WINDOW_ENV}={text!r}: expected a finite number of seconds >= 0")
    return value


_UNREACHABLE_WORDS = (
    "connection refused",
    "could not connect",
    "server closed the connection",
    "terminating connection",
    "connection reset",
    "connection aborted",
    "connection timed out",
    "max retries exceeded",
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "ssl connection has been closed",
    "no connection to the server",
    "broken pipe",
    "remote end closed connection",
    "read timed out",
    "failed to establish a new connection",
)


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in seen and len(seen) < 20:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def is_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the store could not be reached (worth waiting for), not that it refused the call.

    Read from the exception's chain: SQLAlchemy's disconnection and operational errors of a server
    database, `requests`' connection errors and timeouts, MLflow's TEMPORARILY_UNAVAILABLE and HTTP 5xx
    answers, and the words PostgreSQL and urllib3 use for a dropped connection."""
    for e in _chain(error):
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        module = type(e).__module__ or ""
        name = type(e).__name__
        if module.startswith("sqlalchemy") and name in ("DisconnectionError", "InvalidatePoolError"):
            return True
        if module.startswith("sqlalchemy") and name in ("OperationalError", "InterfaceError"):
            if getattr(e, "connection_invalidated", False):
                return True
            text = str(e).lower()
            if any(w in text for w in _UNREACHABLE_WORDS):
                return True
        if module.startswith("requests") and name in ("ConnectionError", "Timeout", "ConnectTimeout", "ReadTimeout"):
            return True
        if module.startswith("mlflow"):
            if getattr(e, "error_code", None) == "TEMPORARILY_UNAVAILABLE":
                return True
            status = getattr(e, "get_http_status_code", None)
            if callable(status):
                try:
                    if int(status()) in (502, 503, 504):  # a proxy or a server starting: not an answer yet
                        return True
                except (TypeError, ValueError):
                    pass
            if any(w in str(e).lower() for w in _UNREACHABLE_WORDS):
                return True
        if module.startswith(("urllib3", "psycopg2", "http.client")) and any(
            w in str(e).lower() for w in _UNREACHABLE_WORDS
        ):
            return True
    return False


class Target:
    """One store as the retries see it: its name for messages (password already redacted) and whether it has
    already been given up on in this process."""

    def __init__(self, what: str, secrets: tuple[str, ...] = ()) -> None:
        self.what = what
        self.secrets = tuple(s for s in secrets if s)  # passwords to keep out of every message
        self.gave_up: str | None = None  # the message it was given up with

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def __repr__(self) -> str:
        return f"Target({self.what!r})"


_local = threading.local()


def _first_line(error: BaseException) -> str:
    """The first error of the chain that says something: Optuna's wrapper ("an exception is raised during the
    commit") and SQLAlchemy's empty pool errors say nothing of what happened."""
    for e in _chain(error):
        text = str(e).strip()
        if len(text) > 3 and type(e).__name__ != "StorageInternalError":
            return f"{type(e).__name__}: {text.splitlines()[0][:200]}"
    return type(error).__name__


def call(target: Target, fn: Callable[[], T]) -> T:
    """``fn()``, retried while ``target`` is unreachable, for at most the retry window (module docstring)."""
    if target.gave_up is not None:
        raise StoreUnavailableError(target.gave_up)
    if getattr(_local, "depth", 0):  # an outer call of this thread retries the whole operation
        return fn()
    _local.depth = 1
    try:
        began: float | None = None
        wait = FIRST_WAIT_S
        while True:
            try:
                result = fn()
            except Exception as e:
                if not is_unreachable(e):
                    raise
                now = time.monotonic()
                window = window_s()
                if began is None:
                    began = now
                    log.warning(
                        f"{target.what} is not answering ({target.scrub(_first_line(e))}); retrying for up to "
                        f"{window:g} s ({WINDOW_ENV})"
                    )
                if now - began >= window:
                    target.gave_up = (
                        f"{target.what} did not answer for {now - began:.0f} s (retry window {window:g} s, "
                        f"{WINDOW_ENV}; last error {target.scrub(_first_line(e))}): the records made so far are kept, "
                        "rerun the same command to resume"
                    )
                    raise StoreUnavailableError(target.gave_up) from None
                try:
                    time.sleep(min(wait, max(0.0, began + window - now)))
                except KeyboardInterrupt:  # stopping while waiting: clean-up calls must not wait again
                    target.gave_up = f"{target.what} was not answering when the process was interrupted"
                    raise
                wait = min(wait * 2, LONGEST_WAIT_S)
                continue
            if began is not None:
                log.warning(f"{target.what} answers again after {time.monotonic() - began:.0f} s")
            return result
    finally:
        _local.depth = 0


def retried(target_of: Callable[[Any], Target | None]) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A method decorator: the call goes through `call` with ``target_of(self)``'s target (None: no retries)."""

    def wrap(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def inner(self: Any, *args: Any, **kwargs: Any) -> T:
            target = target_of(self)
            if target is None:
                return method(self, *args, **kwargs)
            return call(target, lambda: method(self, *args, **kwargs))

        return inner

    return wrap
