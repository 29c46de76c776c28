"""Building an entry: its parameters checked against its constructor, its build-time context supplied."""

from __future__ import annotations

from typing import Any

from bench.errors import BenchError
from bench.registry._entry import Entry
from bench.registry._lookup import get


def check_params(entry: Entry, params: dict[str, Any]) -> None:
    """Refuse unknown parameter names before building, naming the allowed ones."""
    allowed = entry.parameters()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BenchError(
            f"{entry.kind} {entry.name!r} has no parameter {', '.join(map(repr, unknown))}: "
            f"expected some of {', '.join(allowed) or '(none)'}"
        )


def build(kind: str, name: str, params: dict[str, Any], context: dict[str, Any] | None = None) -> Any:
    """The ``kind`` entry ``name`` built with ``params`` and the context values it needs (``entry.needs``);
    unknown parameters and a constructor's ValueError or TypeError are a BenchError naming the entry."""
    entry = get(kind, name)
    check_params(entry, params)
    context = context or {}
    missing = [n for n in entry.needs if n not in context]
    if missing:
        raise BenchError(f"{kind} {name!r} needs {', '.join(missing)} to be built")
    try:
        return entry.resolve()(**params, **{n: context[n] for n in entry.needs})
    except (ValueError, TypeError) as e:
        raise BenchError(f"{kind} {name!r}: {e}") from e


def build_loss(name: str, context: dict[str, Any] | None = None, **params: Any) -> Any:
    """A module called as ``loss(embeddings, labels, indices_tuple=None)``."""
    return build("loss", name, params, context)


def build_miner(name: str, context: dict[str, Any] | None = None, **params: Any) -> Any:
    """A callable ``miner(embeddings, labels)`` returning an index tuple (see bench.tuples)."""
    return build("miner", name, params, context)


def build_trunk(name: str, **params: Any) -> Any:
    """A trunk module; ``in_shape`` and ``embedding_dim`` come with ``params``."""
    return build("trunk", name, params)
