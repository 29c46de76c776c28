"""Writing report files: whole or not at all, so a reader never sees half a page."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.errors import BenchError


def write_text(path: Path, text: str) -> None:
    """Atomic write (temp file in the same folder, then rename); a folder problem is one line."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        raise BenchError(f"cannot write {path}: {e.strerror or e}") from None


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False, default=str) + "\n")
