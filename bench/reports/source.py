"""One results directory, read once and checked, as every report needs it.

The reports never open `results/<protocol>/` files by name themselves:
`bench.results` owns the file names and formats. This module adds what a
report must be sure of before it says anything: that the directory exists,
holds final runs, and that every row belongs to the protocol its manifest
names (rows of two protocol versions must never be pooled).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.errors import BenchError

# Columns of finals.csv that describe a run rather than measure it.
RUN_COLUMNS = {
    "protocol_hash", "cell", "loss", "miner", "label", "seed", "params", "train_fingerprint",
    "test_fingerprint", "folds_fingerprint", "iterations", "samples_seen", "wall_time_s", "status",
    "reason", "trials", "epochs", "num_queries", "runs", "episodes",
}


@dataclass(frozen=True)
class Results:
    """The tables of one protocol run, with the facts reports print about them."""

    root: Path
    manifest: dict[str, Any]
    finals: pd.DataFrame
    trials: pd.DataFrame | None = None
    summary: pd.DataFrame | None = None
    finals_file: Path | None = None

    @property
    def protocol(self) -> str:
        return str(_first(self.manifest, "protocol", "protocol_name", "name", default=self.root.name))

    @property
    def protocol_hash(self) -> str:
        return str(_first(self.manifest, "protocol_hash", "hash", default=""))

    @property
    def primary(self) -> str:
        return str(_first(self.manifest, "primary_metric", "primary", default="map_at_r"))

    @property
    def fingerprints(self) -> dict[str, str]:
        fp = _first(self.manifest, "split_fingerprints", "fingerprints", default={}) or {}
        out = {k: str(v) for k, v in fp.items()} if isinstance(fp, dict) else {}
        for key in ("train", "test", "folds"):
            flat = self.manifest.get(f"{key}_fingerprint")
            if flat and key not in out:
                out[key] = str(flat)
        return out

    @property
    def cells(self) -> list[str]:
        return list(dict.fromkeys(self.finals["cell"].astype(str)))

    @property
    def metrics(self) -> list[str]:
        """Test metrics in table order: the primary first, then the rest as written."""
        cols = [
            c for c in self.finals.columns
            if c not in RUN_COLUMNS and not c.startswith("val_") and pd.api.types.is_numeric_dtype(self.finals[c])
        ]
        if self.primary in cols:
            cols.remove(self.primary)
            cols.insert(0, self.primary)
        return cols

    def values(self, cell: str, metric: str) -> np.ndarray:
        """Per-seed values of one metric for one cell, in seed order."""
        rows = self.finals[self.finals["cell"].astype(str) == cell]
        if "seed" in rows:
            rows = rows.sort_values("seed")
        if metric not in rows:
            raise BenchError(f"{self.root}: no metric {metric!r} in the final runs (have: {', '.join(self.metrics)})")
        return rows[metric].to_numpy(dtype=float)

    def seeds(self, cell: str) -> list[int]:
        rows = self.finals[self.finals["cell"].astype(str) == cell]
        return sorted(int(s) for s in rows["seed"]) if "seed" in rows else []

    def artifact(self, cell: str, name: str) -> Path | None:
        path = self.root / "artifacts" / cell / name
        return path if path.is_file() else None

    def require_cell(self, cell: str, what: str = "") -> None:
        if cell not in self.cells:
            where = f"{what}: " if what else ""
            raise BenchError(
                f"{where}no cell {cell!r} in {self.root} (cells: {', '.join(self.cells)})"
            )


def _first(d: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in d and d[k] not in (None, ""):
            return d[k]
    return default


def load(root: str | Path) -> Results:
    """Read and check a results directory; any problem is one `BenchError` line."""
    root = Path(root)
    if not root.exists():
        raise BenchError(f"results directory {root} does not exist")
    if not root.is_dir():
        raise BenchError(f"{root} is not a directory (expected results/<protocol>/)")
    manifest_path = root / "manifest.json"
    finals_path = root / "finals.csv"
    if not manifest_path.is_file():
        raise BenchError(f"{root} is not a results directory: no manifest.json (run `dmlbench run` first)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as e:
        raise BenchError(f"{manifest_path}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise BenchError(f"{manifest_path}: expected a JSON object")
    finals = _read_csv(finals_path)
    if finals is None or finals.empty:
        raise BenchError(f"{root} holds no final runs yet (finals.csv missing or empty)")
    if "cell" not in finals:
        raise BenchError(f"{finals_path}: no 'cell' column; not a dmlbench finals table")
    res = Results(root, manifest, finals, _read_csv(root / "trials.csv"), _read_csv(root / "summary.csv"), finals_path)
    _check_hashes(res)
    return res


def _read_csv(path: Path) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (OSError, ValueError) as e:
        raise BenchError(f"{path}: unreadable table ({e})") from None


def _check_hashes(res: Results) -> None:
    if "protocol_hash" not in res.finals or not res.protocol_hash:
        return
    found = set(res.finals["protocol_hash"].astype(str))
    if found != {res.protocol_hash}:
        other = sorted(found - {res.protocol_hash})
        raise BenchError(
            f"{res.finals_file}: rows of protocol hash {', '.join(h[:12] for h in other)} "
            f"but the manifest says {res.protocol_hash[:12]}: tables of two protocol versions"
        )
