"""Store URLs, read one way: the Optuna storage and the MLflow tracking URI.

Every caller that needs to know what a URL points at asks here, so a query
string (``sqlite:///runs/optuna.db?timeout=60``), a ``~`` or a relative path
means the same thing everywhere, and no password reaches a log line,
manifest, tag or error message (`redact`).

* ``sqlite:///<path>``: a file; ``<path>`` is relative to the working
  directory unless absolute (``sqlite:////abs/file.db``), ``~`` expands.
  ``sqlite://`` and ``sqlite:///:memory:`` are in-memory databases.
* ``postgresql://``, ``mysql://``, ...: a database server (SQLAlchemy's
  form, ``user:password@host:port/name?query``).
* ``http://``, ``https://``: an MLflow tracking server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_DIR",
    "StoreURL",
    "default_url",
    "parse",
    "redact",
    "sqlite_path",
    "sqlite_url",
    "with_connect_timeout",
]

CONNECT_TIMEOUT_S = 5  # a database server that does not answer is refused in seconds, not after minutes of TCP retries
DEFAULT_DIR = "runs"  # where the default stores live, relative to the working directory
SERVER_SCHEMES = frozenset({"postgresql", "postgres", "mysql", "mssql", "oracle"})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class StoreURL:
    """A store URL taken apart: ``scheme`` without its driver (``postgresql+psycopg2`` -> ``postgresql``)."""

    text: str
    scheme: str  # "" for a plain path
    path: Path | None  # the file of a sqlite URL, resolved; None for a server or an in-memory database
    query: str  # what follows "?", "" when nothing does

    @property
    def is_sqlite(self) -> bool:
        return self.scheme == "sqlite"

    @property
    def is_server_db(self) -> bool:
        return self.scheme in SERVER_SCHEMES

    @property
    def is_http(self) -> bool:
        return self.scheme in ("http", "https")


def parse(url: str) -> StoreURL:
    """``url`` taken apart; a text without ``scheme://`` is a plain path (scheme "")."""
    m = _SCHEME.match(url)
    if m is None:
        return StoreURL(url, "", None, "")
    scheme = m.group(1).split("+", 1)[0].lower()
    rest, _, query = url[m.end() :].partition("?")
    path = None
    if scheme == "sqlite" and rest.startswith("/") and rest not in ("/", "/:memory:"):
        path = Path(rest[1:]).expanduser().resolve()
    return StoreURL(url, scheme, path, query)


def sqlite_path(url: str) -> Path | None:
    """The file behind a ``sqlite:///`` URL, resolved; None for other URLs and in-memory databases."""
    return parse(url).path


def sqlite_url(path: str | Path) -> str:
    """The ``sqlite:///`` URL of a file, absolute, so that it means the same from any working directory."""
    return f"sqlite:///{Path(path).expanduser().resolve()}"


def default_url(file: str, root: str | Path | None = None, *, create: bool = True) -> str:
    """``sqlite:///<root>/<file>``, ``root`` defaulting to ``./runs`` (created if missing, unless ``create`` is
    False: a check that must write nothing): the default stores."""
    directory = Path(root if root is not None else DEFAULT_DIR).expanduser().resolve()
    if create:
        directory.mkdir(parents=True, exist_ok=True)
    return sqlite_url(directory / file)


def redact(url: str) -> str:
    """The URL without its password, fit for logs, manifests, tags and error lines."""
    m = _SCHEME.match(url)
    if m is None:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def with_connect_timeout(url: str) -> str:
    """A PostgreSQL or MySQL URL with ``connect_timeout`` added unless the user set one.

    Both the Optuna and the MLflow stores open their database through
    SQLAlchemy, which passes URL query arguments to the driver: this is the
    one place both get their bound, so an unreachable port fails fast in both.
    """
    u = parse(url)
    given = {key.lower() for key, _ in parse_qsl(u.query, keep_blank_values=True)}
    if u.scheme not in ("postgresql", "postgres", "mysql") or "connect_timeout" in given:
        return url
    return f"{url}{'&' if '?' in url else '?'}connect_timeout={CONNECT_TIMEOUT_S}"
