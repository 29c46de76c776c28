"""A claims file read and validated: its schema, its claims as written, where its verdicts go, and a claim's
numbers on the metric's own scale.

Every problem is refused with one line naming the file and the key: a schema
violation, a NaN or infinite number (JSON Schema's bounds let `.nan` through),
a repeated claim id, or a number the metric cannot take (`scaled`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from bench.errors import BenchError
from bench.spec.safe_yaml import YamlRefused, load_yaml, read_text
from bench.stats import metric_range

DELTA = 0.01
KINDS = ("beats", "no_better", "within", "reaches", "spread", "against_reference")

_cell = {"type": "string", "minLength": 1}
_method = {  # what a cell must run for the claim to be about it: checked against the re-planned protocol
    "type": "object",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {
        "loss": _cell,
        "miner": _cell,
        "loss_params": {"type": "object"},
        "miner_params": {"type": "object"},
    },
}
_num = {"type": "number"}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["protocol", "claims"],
    "additionalProperties": False,
    "properties": {
        "protocol": {"type": "string", "minLength": 1},
        "results": {"type": "string"},
        "description": {"type": "string"},
        "metric": {"type": "string"},
        "equivalence": {"type": "number", "minimum": 0},
        "claims": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "source", "kind"],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,100}\\Z"},  # \Z: no final newline
                    "source": {"type": "string", "minLength": 1},
                    "statement": {"type": "string"},
                    "note": {"type": "string"},
                    "kind": {"enum": list(KINDS)},
                    "metric": {"type": "string"},
                    "a": _cell,
                    "b": _cell,
                    "cell": _cell,
                    "cells": {"type": "array", "items": _cell, "minItems": 2, "uniqueItems": True},
                    "points": {"type": "number", "exclusiveMinimum": 0},
                    "below": {"type": "number", "exclusiveMinimum": 0},
                    "margin": {"type": "number", "minimum": 0},
                    "value": _num,
                    "unit": {"enum": ["fraction", "percent"]},
                    "reference": {"type": "string"},
                    "expect": {"enum": ["above", "below"]},
                    "requires": {"type": "object", "minProperties": 1, "additionalProperties": _method},
                },
                "allOf": [
                    {
                        "if": {"properties": {"kind": {"enum": ["beats", "no_better"]}}},
                        "then": {"required": ["a", "b"]},
                    },
                    {"if": {"properties": {"kind": {"const": "within"}}}, "then": {"required": ["a", "b", "points"]}},
                    {"if": {"properties": {"kind": {"const": "reaches"}}}, "then": {"required": ["cell", "value"]}},
                    {"if": {"properties": {"kind": {"const": "spread"}}}, "then": {"required": ["cells", "below"]}},
                    {
                        "if": {"properties": {"kind": {"const": "against_reference"}}},
                        "then": {"required": ["cell", "value", "reference", "expect"]},
                    },
                ],
            },
        },
    },
}


@dataclass(frozen=True)
class ClaimsFile:
    """A parsed claims file: which protocol (and results directory) it speaks of, the default
    ``metric`` and ``equivalence`` margin, and its claims as written."""

    path: Path
    protocol: str
    results: str | None
    metric: str | None
    equivalence: float
    claims: list[dict[str, Any]]


def output_names(cf: ClaimsFile) -> tuple[str, str]:
    """The Markdown and JSON files a claims file's verdicts are written to, keyed by the claims file so that a
    second claims file on the same results never erases the first's: ``claims.md`` and ``claims.json`` for the
    protocol's own claims file (named after the protocol, ``protocols/claims/<protocol>.yaml``), else
    ``claims-<file stem>.md`` and ``.json``."""
    stem = cf.path.stem
    tail = "" if stem == cf.protocol else f"-{stem}"
    return f"claims{tail}.md", f"claims{tail}.json"


def _where(error: jsonschema.ValidationError) -> str:
    parts: list[str] = []
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else (f".{p}" if parts else str(p)))
    return "".join(parts) or "(top level)"


def parse(path: str | Path) -> ClaimsFile:
    """Read and validate a claims file; every problem names the file and the key."""
    path = Path(path)
    try:
        exists = path.exists()
    except OSError:  # a name too long for the file system
        exists = False
    if not exists:
        raise BenchError(f"claims file {str(path)[:200]} does not exist")
    try:
        doc, _ = load_yaml(read_text(path, "claims file"), str(path))  # the protocol's bounded, safe loader
    except YamlRefused as e:
        raise BenchError(f"{path}: not readable YAML ({str(e).removeprefix(str(path)).lstrip(':')})") from None
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc))
    if error is not None:
        raise BenchError(f"{path}: {_where(error)}: {error.message}")
    bad = _non_finite(doc)
    if bad:
        raise BenchError(f"{path}: {bad[0]}: expected a finite number, got {bad[1]}")
    ids = [c["id"] for c in doc["claims"]]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise BenchError(f"{path}: claim ids must be unique; repeated: {', '.join(dup)}")
    for i, claim in enumerate(doc["claims"]):
        _check_requires(path, i, claim)
    return ClaimsFile(
        path,
        doc["protocol"],
        doc.get("results"),
        doc.get("metric"),
        float(doc.get("equivalence", DELTA)),
        doc["claims"],
    )


def _check_requires(path: Path, i: int, claim: dict[str, Any]) -> None:
    """Each key of a claim's `requires` names one of its roles (`a`, `b`, `cell`) or a cell it names (a role's,
    or one of `cells`): a key naming anything else (a misspelt cell id) would be a requirement never checked,
    and the verdict would read as if it held."""
    roles = [r for r in ("a", "b", "cell") if r in claim]
    names = [str(claim[r]) for r in roles] + [str(c) for c in claim.get("cells", [])]
    for key in claim.get("requires", {}):
        if key not in roles and key not in names:
            raise BenchError(
                f"{path}: claims[{i}].requires: {key!r} is neither a role of claim {claim['id']!r} "
                f"({', '.join(roles) or 'none'}) nor a cell it names ({', '.join(names)})"
            )


def _non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """The first NaN or infinite number in a claims document: JSON Schema's bounds let `.nan` through."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "(top level)", value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key)
        if found:
            return found
    return None


def resolve_results_dir(cf: ClaimsFile, explicit: str | Path | None) -> Path:
    """Where the results are: the command line's choice, else the claims file's, else results/<protocol>."""
    if explicit is not None:
        return Path(explicit)
    if cf.results:
        return Path(cf.results)
    return Path("results") / cf.protocol


def unit_of(claim: dict[str, Any]) -> tuple[float, int, str]:
    """How a claim's numbers are shown: in its own unit, so that a claim written in percent reads its effect,
    interval and thresholds in percentage points. (scale from the metric's fraction, decimals, suffix)."""
    return (100.0, 2, " pp") if claim.get("unit") == "percent" else (1.0, 4, "")


_BOUNDS = ("points", "below", "margin", "equivalence")  # differences between two cells: at most the range's width


def scaled(cf: ClaimsFile, claim: dict[str, Any], key: str, metric: str) -> float:
    """A number of a claim on the metric's own scale: ``unit: percent`` divides every number of the claim
    (``value``, ``points``, ``below``, ``margin``) by 100. A number the metric cannot take is refused, so
    that ``points: 3`` on MAP@R (meant as 3 points, read as 3.0) is an error, never an always-true claim."""
    raw = float(claim[key])
    value = raw / 100.0 if claim.get("unit") == "percent" else raw
    low, high = metric_range(metric)
    where = f"{cf.path}: " + (f"claim {claim['id']}: " if "id" in claim else "")
    if key in _BOUNDS:
        if value > high - low:
            raise BenchError(
                f"{where}{key} {raw:g} is wider than {metric}'s whole range [{low:g}, {high:g}]: "
                f"write it on that scale ({raw / 100:g} for {raw:g} points), or add unit: percent"
            )
    elif not low <= value <= high:
        raise BenchError(
            f"{where}{key} {raw:g} lies outside {metric}'s range [{low:g}, {high:g}]: "
            f"write it on that scale, or add unit: percent if it is a percentage"
        )
    return value
