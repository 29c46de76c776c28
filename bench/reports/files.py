"""Writing report files: whole or not at all, so a reader never sees half a page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.atomic import atomic_file
from bench.errors import BenchError


def write_text(path: Path, text: str) -> None:
    """Atomic write (temp file in the same folder, then rename); a folder problem is one line."""
    path = Path(path)
    try:
        with atomic_file(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise BenchError(f"cannot write {path}: {e.strerror or e}") from None


def write_json(path: Path, data: Any) -> None:
    """Indented JSON, atomically; NaN is refused (strict JSON), other objects are written as strings."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False, default=str) + "\n")
