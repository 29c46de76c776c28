"""Reading a protocol file: safe YAML, schema, then defaults, meaning and hash, into a `Protocol`.

A protocol names registry entries and numbers, never code: the YAML is read
with a safe loader (no tags, no objects) that also refuses duplicate keys,
which a plain loader would silently resolve to the last one. Every problem
is reported as ``FILE:LINE: key.path: what was expected``.

The steps, each in its module: the schema and finite numbers (here), the
data sources (`_checks`), defaults and one written form per meaning
(`_defaults`), what a schema cannot say (`_checks`, the grid's methods in
`_methods`), the hashes (`hashing`).
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import yaml

from bench.protocol._checks import check_data_sources, check_semantics
from bench.protocol._defaults import with_defaults
from bench.protocol._report import Reporter
from bench.protocol.hashing import protocol_hash, shared_hash
from bench.protocol.types import Protocol, ProtocolError
from bench.spec.safe_yaml import YamlRefused, load_yaml, read_text
from bench.spec.schema import SCHEMA, describe_error, error_path


def load_protocol(path: str | Path) -> Protocol:
    """Read, validate and normalise a protocol file; a ProtocolError lists what is wrong.

    Relative paths in it (``folder:``/``npz:`` data specs, a ``model.pretrained`` path) are relative to
    the file's folder, wherever the command runs from (`parse_protocol`)."""
    path = Path(path)
    return parse_protocol(read_text(path, "protocol"), str(path)[:200], base=path.expanduser().resolve().parent)


def parse_protocol(text: str, source: str = "<protocol>", base: str | Path | None = None) -> Protocol:
    """A protocol from YAML text, schema-checked, defaults filled in, then registry names and cross-field
    rules checked; every problem is one line naming ``source``, the line and the key path, all of them
    in one ProtocolError.

    The hash covers the paths as written (a checkout elsewhere keeps it); `doc` then holds them absolute
    (`resolve_paths`), joined to `base`: the protocol file's folder, or, for text without a file
    (``base`` None), the current directory at the time of parsing."""
    try:
        raw, node = load_yaml(text, source)
    except YamlRefused as e:
        raise ProtocolError([str(e)]) from None
    lines = _lines(node)
    report = Reporter(source, lines)
    if not isinstance(raw, dict):
        report.add(
            (),
            "expected a mapping of protocol sections, got " + ("an empty file" if raw is None else type(raw).__name__),
        )
        report.raise_if_any()
    _check_schema(raw, report)
    _check_finite(raw, (), report)
    report.raise_if_any()
    check_data_sources(raw["data"], report)
    report.raise_if_any()
    doc = with_defaults(raw)
    check_semantics(doc, report)
    report.raise_if_any()
    return Protocol(
        doc=resolve_paths(doc, Path.cwd() if base is None else Path(base)),
        hash=protocol_hash(doc),
        source=source,
        text=text,
        shared_hash=shared_hash(doc),
    )


def resolve_paths(doc: dict[str, Any], base: Path) -> dict[str, Any]:
    """The document with every path-valued key made absolute against ``base``: ``folder:``/``npz:`` specs of
    ``data.train`` and ``data.test`` (``data.pool`` is both by now; query and gallery too), and
    ``model.pretrained`` when it is a path (a ``/`` in it or a leading ``~``; a bare file name is looked up in
    torch hub's cache, `bench.models.weights.resolve`). What the data loaders, the trainer and the manifest
    receive; the hash is taken before, on the paths as written."""
    from bench.data import resolve_spec  # bench.data imports torch: only once a file is loaded

    out = copy.deepcopy(doc)
    data = out["data"]
    for key in ("train", "test"):
        value = data.get(key)
        if isinstance(value, str):
            data[key] = resolve_spec(value, base)
        elif isinstance(value, dict):
            data[key] = {
                side: resolve_spec(spec, base) if isinstance(spec, str) else spec for side, spec in value.items()
            }
    weights = out["model"].get("pretrained")
    if isinstance(weights, str) and ("/" in weights or "\\" in weights or weights.startswith("~")):
        path = Path(weights).expanduser()
        out["model"]["pretrained"] = os.path.normpath(path if path.is_absolute() else base / path)
    return out


def _lines(node: yaml.Node | None, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Key path -> 1-based line of every node, so errors can point into the file."""
    out = {} if out is None else out
    if node is None:
        return out
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = (*path, key_node.value if isinstance(key_node, yaml.ScalarNode) else "?")
            out[key] = key_node.start_mark.line + 1
            _lines(value_node, key, out)
            out[key] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), out)
    return out


def _check_schema(raw: dict[str, Any], report: Reporter) -> None:
    import jsonschema  # a quarter second: not paid by what imports `Protocol` for its type alone

    validator = jsonschema.Draft202012Validator(SCHEMA)
    errors = sorted(validator.iter_errors(raw), key=lambda e: [str(p) for p in error_path(e)])
    for error in errors:
        report.add(error_path(error), describe_error(error))


def _check_finite(value: Any, path: tuple, report: Reporter) -> None:
    """No nan or inf anywhere: the schema's bounds cannot see them (``nan > 0`` and ``nan <= 0`` are both
    false), and a learning rate, decay, step or parameter of nan or inf trains nothing while exit 0."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, (*path, key), report)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, (*path, i), report)
    elif isinstance(value, float) and not math.isfinite(value) and path not in report.paths:
        report.add(path, f"expected a finite number, got {value}")
