"""The protocol's hashes: sha256 of the canonical JSON of the validated document with every default filled in.

Reformatting, reordering keys or writing a default out keeps a hash; any
change of meaning, in the file or in a registry default it relies on, or of
the plugin code it names, gives a new one. Keys that change no result
(`HASH_EXCLUDED`) are in neither hash.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from bench import registry
from bench.protocol.types import NO_MINER


def protocol_hash(doc: dict[str, Any]) -> str:
    """sha256 of the document, and of the plugin code it uses: new plugin code is a new protocol.

    A protocol naming only built-in, PML and timm entries hashes its document
    alone (no ``plugins`` key): its hash depends on the file and bench's defaults.
    """
    plugins = plugin_fingerprints(doc)
    doc = _without_unhashed(doc)
    body = {"protocol": doc, "plugins": plugins} if plugins else doc
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


SHARED_EXCLUDED = ("grid", "description")
# keys that change no result, so neither hash covers them: how many workers decode the images, whether the
# final models are kept (bench.sweep.kept)
HASH_EXCLUDED = (("data", "loader"), ("final", "keep_models"))


def _without_unhashed(doc: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    for section, key in HASH_EXCLUDED:
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def shared_hash(doc: dict[str, Any]) -> str:
    """sha256 of what every cell of the protocol shares: the document without its grid (the cells, hashed
    one by one in `bench.plan.grid.cell_digest`) and without its description (words, not a setting), and
    the trunk's plugin code. The data loader's workers are left out as in `protocol_hash`.

    A change here is a new version of the whole sweep (every cell retrains); adding, removing or editing
    one cell leaves it, and so every other cell's records, as they were."""
    body = {k: v for k, v in _without_unhashed(doc).items() if k not in SHARED_EXCLUDED}
    trunk = plugin_fingerprints({"model": doc.get("model", {})})
    return hashlib.sha256(canonical_json({"shared": body, "plugins": trunk}).encode()).hexdigest()


def plugin_fingerprints(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    """``kind:name`` -> version and source sha256 of every plugin entry the document names."""
    used = [("trunk", doc.get("model", {}).get("trunk"))]
    used += [
        (kind, item.get("name"))
        for kind, section in (("loss", "losses"), ("miner", "miners"))
        for item in doc.get("grid", {}).get(section, [])
    ]
    out = {}
    for kind, name in used:
        if not isinstance(name, str) or name == NO_MINER:
            continue
        entry = registry.get(kind, name)
        if entry.plugin:
            # not where it was loaded from: a worker on another machine or folder must find the same hash
            out[f"{kind}:{name}"] = {"version": entry.version, "sha256": entry.source_hash}
    return out


def canonical_json(doc: Any) -> str:
    """Sorted keys, no spaces, integral floats as integers (``lr: 1`` and ``lr: 1.0`` mean the same)."""
    return json.dumps(_canonical(doc), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value
