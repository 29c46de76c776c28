"""docs/PROTOCOL.md names every key of the protocol schema, with the schema's defaults.

The schema grows with the code (a pruner option, a data field); a reference
that silently lacks the new key is how users end up reading the source. The
test walks `bench.spec.schema.SCHEMA` and compares.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from bench.spec import schema

DOC = (Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md").read_text()


def _rows(text: str) -> dict[str, list[str]]:
    """First cell's key(s) -> the row's cells, for every table row of ``text``."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            for key in re.findall(r"`([^`]+)`", cells[0]):
                rows[key] = cells
    return rows


# three parts, each with its own keys: the protocol's (dotted), a grid method's, a search distribution's
_TOP, _REST = DOC.split("\nA method (", 1)
_METHOD, _DISTRIBUTION = _REST.split("\nA distribution in", 1)
ROWS, METHOD_ROWS, DISTRIBUTION_ROWS = _rows(_TOP), _rows(_METHOD), _rows(_DISTRIBUTION)


def _keys(node: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of every property under ``node``, through oneOf alternatives that are mappings."""
    out = []
    alternatives = [node, *node.get("oneOf", []), *node.get("anyOf", [])]
    for alt in alternatives:
        for key, sub in alt.get("properties", {}).items():
            path = f"{prefix}{key}"
            out.append(path)
            out += _keys(sub, path + ".")
    return out


def _flow(value: Any) -> str:
    """A default as the document writes it: YAML flow style."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value or '""'
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    return repr(value)


def test_every_schema_key_is_documented() -> None:
    """Protocol keys by their dotted path; a method's and a distribution's keys in their own tables."""
    method = set(schema.METHOD["properties"])
    distribution = {k for alt in schema.DISTRIBUTION["oneOf"] for k in alt["properties"]}
    top = [k for k in _keys(schema.SCHEMA) if not k.startswith("grid.") or k.count(".") == 1]
    missing = (
        [k for k in top if k not in ROWS]
        + [f"method {k}" for k in method if k not in METHOD_ROWS]
        + [f"distribution {k}" for k in distribution if k not in DISTRIBUTION_ROWS]
    )
    assert not missing, f"docs/PROTOCOL.md lacks {missing}"
    assert len(top) > 60 and "name" in ROWS and "name" in METHOD_ROWS


DEFAULTS = {
    **schema.DEFAULTS,
    **schema.ABSENT_DEFAULTS,
    **{f"tuning.pruner.{k}": v for k, v in schema.PRUNER_DEFAULTS.items() if v is not None},
}


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_documented_defaults_are_the_schemas(key: str) -> None:
    """The default column of each key shows the value the loader fills in."""
    assert key in ROWS, f"docs/PROTOCOL.md lacks {key}"
    assert f"`{_flow(DEFAULTS[key])}`" == ROWS[key][2], (key, ROWS[key][2])
