"""Looking names up, and adding plugins' entries: `get`, `names`, `entries` and `register`.

A name is looked up in the built-in table, then among entries added in this
process (by `register`, or cached on a first lookup), then as ``pml:<Class>``
or ``timm:<model>``, then among installed entry points, whose code is
imported only on that first lookup.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, Literal

from bench import plugins
from bench.errors import BenchError
from bench.registry import _builtin  # its table read as `_builtin.ENTRIES`, so a test may extend it
from bench.registry._dynamic import pml_entry, timm_entry
from bench.registry._entry import KINDS, TUPLE_KINDS, TUPLES_ATTRIBUTE, Entry, ServedBatch

_REGISTERED: dict[tuple[str, str], Entry] = {}  # entries from `register` (plugins), by (kind, name)
_PLUGIN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")  # no ":" ("pml:" is PML's); safe in an MLflow tag key


def register(
    kind: str,
    name: str,
    *,
    tuples: str = "",
    summary: str = "",
    counterpart: str = "",
    search_space: dict[str, dict[str, Any]] | None = None,
    needs: tuple[str, ...] = (),
    scope: Literal["batch", "dataset"] = "batch",
    supplies: tuple[str, ...] = (),
    batch: ServedBatch | None = None,
    embeds_per_step: Callable[[dict[str, Any], float], float] | None = None,
    min_classes: int = 2,
    min_per_class: int = 2,
    reference: Any = None,
) -> Callable[[Any], Any]:
    """Add a loss, miner or trunk to the registry without editing bench/: decorate its class or factory.

    The fields are those of `Entry` (what the planner and validator need);
    ``tuples`` is what a loss consumes or a miner produces (`TUPLE_KINDS`): a
    loss that ignores ``indices_tuple`` (learns from the labels alone, as a
    proxy loss does) declares ``"proxy"``, which `incompatibility` pairs with
    no miner, so it runs only with ``none``;
    the class must be importable by its module and name, which an installed
    package or a ``--plugin`` file is. A name taken by another entry is refused.
    """
    if kind not in KINDS:
        raise BenchError(f"register: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not isinstance(name, str) or not _PLUGIN_NAME.match(name):
        raise BenchError(f"register: {kind} name {name!r} must be a letter then letters, digits, '_', '.' or '-'")
    if kind != "trunk" and not tuples:
        raise BenchError(f"register: {kind} {name!r} must declare tuples= ({', '.join(TUPLE_KINDS)})")

    def decorate(obj: Any) -> Any:
        origin = plugins.current_origin(obj.__module__)
        entry = Entry(
            name,
            kind,
            f"{obj.__module__}:{obj.__qualname__}",
            summary or (obj.__doc__ or "").strip().split("\n")[0],
            counterpart,
            tuples,
            dict(search_space or {}),
            tuple(needs),
            scope=scope,
            supplies=tuple(supplies),
            batch=batch,
            embeds_per_step=embeds_per_step,
            min_classes=min_classes,
            min_per_class=min_per_class,
            source=origin.source,
            version=origin.version,
            source_hash=plugins.file_sha256(obj),
            reference=reference,
        )
        _check_search_space(entry, obj)
        old = _builtin.BY_KEY.get((kind, name)) or _REGISTERED.get((kind, name))
        if old is not None and old.target != entry.target:
            raise BenchError(
                f"register: {kind} {name!r} is already {old.target} ({old.source}); {entry.target} cannot take the name"
            )
        _REGISTERED[(kind, name)] = entry
        return obj

    return decorate


def _check_search_space(entry: Entry, obj: Any) -> None:
    """A search space may only name parameters the class takes: a name it lacks would fail every trial of
    every sweep that uses the method, after the budget was spent, so it is refused when it is registered."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: nothing to check against
        return
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return  # takes any keyword: the class decides at build time
    taken = {n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    unknown = sorted(set(entry.search_space) - taken)
    if unknown:
        raise BenchError(
            f"register: {entry.kind} {entry.name!r}: search_space names {', '.join(map(repr, unknown))}, "
            f"which {entry.target} does not take (its parameters: {', '.join(sorted(taken)) or 'none'})"
        )


def names(kind: str) -> list[str]:
    """The known names of one kind: built-ins in table order, then registered and installed plugins."""
    out = [e.name for e in _builtin.ENTRIES if e.kind == kind]
    out += [n for k, n in _REGISTERED if k == kind and n not in out]
    return out + sorted(n for n in plugins.entry_points(kind) if n not in out)


def entries(kind: str | None = None) -> list[Entry]:
    """Every entry (of ``kind``), installed plugins imported: for listing and cross-checking."""
    for k in [kind] if kind else KINDS:
        for name in plugins.entry_points(k):
            if (k, name) not in _builtin.BY_KEY:
                get(k, name)
    return [e for e in (*_builtin.ENTRIES, *_REGISTERED.values()) if not kind or e.kind == kind]


def loaded_plugins() -> list[Entry]:
    """The plugin entries registered in this process so far (installed ones only once looked up)."""
    return [e for e in _REGISTERED.values() if e.plugin]


def get(kind: str, name: str) -> Entry:
    """The entry of a name; an unknown name is a BenchError listing the known ones.

    Looked up in the built-in table, then among registered plugins, then as
    a PML class (``pml:ClassName``), then among installed entry points, which
    are imported here, on their first lookup.
    """
    entry = _builtin.BY_KEY.get((kind, name)) or _REGISTERED.get((kind, name))
    if entry is not None:
        return entry
    if name.startswith("pml:") and kind in ("loss", "miner"):
        entry = pml_entry(kind, name)
        _REGISTERED[(kind, name)] = entry
        return entry
    if name.startswith("timm:") and kind == "trunk":
        return timm_entry(name)
    ep = plugins.entry_points(kind).get(name) if kind in plugins.GROUPS else None
    if ep is not None:
        obj = plugins.load_entry_point(kind, ep)
        entry = _REGISTERED.get((kind, name))
        if entry is None:
            entry = _entry_point_entry(kind, name, ep, obj)
            _REGISTERED[(kind, name)] = entry
        return entry
    dynamic = "timm:<timm model name>" if kind == "trunk" else "pml:<PML class name>"
    raise BenchError(
        f"unknown {kind} {name!r}: expected one of {', '.join(names(kind))}, or {dynamic} "
        "(a plugin's name needs its package installed or `dmlbench --plugin FILE` before the command)"
    )


def _entry_point_entry(kind: str, name: str, ep: Any, obj: Any) -> Entry:
    """The entry of an installed entry point that names its class (or factory) itself, without `register`.

    As with pytest's or MLflow's entry points, the object named is the
    method, under the entry point's name; its parameters come from its
    signature (``num_classes``/``embedding_size`` are supplied at build time,
    as for PML's classes). What a signature cannot say: a loss's or miner's
    tuple kind, read from its class attribute ``tuples`` (refused, in one
    line saying what to add, when absent); a search space, tuples' sizes and
    the rest stay with `register`.
    """
    where = f"plugin {ep.value!r} ({plugins.GROUPS[kind]} entry point {name!r})"
    if not _PLUGIN_NAME.match(name):
        raise BenchError(f"{where}: the name {name!r} must be a letter then letters, digits, '_', '.' or '-'")
    if not callable(obj):
        raise BenchError(
            f"{where} names a {type(obj).__name__}, not a {kind} class: name the class, or "
            f"decorate it with bench.registry.register({kind!r}, {name!r}, ...)"
        )
    tuples = ""
    if kind != "trunk":
        tuples = getattr(obj, TUPLES_ATTRIBUTE, "")
        verb = "consumes" if kind == "loss" else "produces"
        if not tuples:
            raise BenchError(
                f"{where}: say which tuples the {kind} {verb}: add a class attribute "
                f'{TUPLES_ATTRIBUTE} = "pairs" (or {", ".join(TUPLE_KINDS[1:])}) to {ep.attr}, or '
                f"decorate it with bench.registry.register({kind!r}, {name!r}, tuples=...)"
            )
        if tuples not in TUPLE_KINDS:
            raise BenchError(
                f"{where}: {ep.attr}.{TUPLES_ATTRIBUTE} is {tuples!r}: expected one of {', '.join(TUPLE_KINDS)}"
            )
    try:
        taken = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        taken = {}  # type: ignore[assignment]
    needs = tuple(n for n in ("num_classes", "embedding_size") if kind != "trunk" and n in taken)
    package, version = plugins.entry_point_package(ep)
    summary = (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
    return Entry(
        name,
        kind,
        f"{ep.module}:{ep.attr}",
        summary,
        "",
        str(tuples),
        needs=needs,
        source=f"entry point {package}",
        version=version,
        source_hash=plugins.file_sha256(obj),
    )
