"""One results directory, read once and checked, as every report needs it.

The reports never open `results/<protocol>/` files by name themselves:
`bench.sweep.tables` owns the file names and formats. This module adds what a
report must be sure of before it says anything: that the directory exists,
holds final runs, and that every row belongs to the protocol its manifest
names (rows of two protocol versions must never be pooled).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from bench.data.splits import fold_label
from bench.errors import BenchError
from bench.plan import plan, trained_cell
from bench.protocol import load_protocol, parse_protocol
from bench.stats import metric_range
from bench.sweep import tables

if TYPE_CHECKING:
    from bench.plan import Plan

# Columns of finals.csv that describe a run rather than measure it.
RUN_COLUMNS = {
    "protocol_hash",
    "cell",
    "loss",
    "miner",
    "label",
    "seed",
    "params",
    "train_fingerprint",
    "test_fingerprint",
    "folds_fingerprint",
    "iterations",
    "samples_seen",
    "wall_time_s",
    "status",
    "reason",
    "trials",
    "epochs",
    "num_queries",
    "runs",
    "episodes",
    "budget_iterations",
    "draw",
    "device",
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
    floor: pd.DataFrame | None = None  # the untrained trunk, one row per final seed (floor.csv)
    budget_check: pd.DataFrame | None = None  # the finals retrained at a multiple of the budget (budget_check.csv)
    # learned-metric cells' own floors (cell_floor.csv: trunk and metric untrained, ranked by the metric)
    cell_floor: pd.DataFrame | None = None

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
        """Split fingerprints flattened to names (`train`, `test`, `split`, `fold 0 train`, ...) -> digest."""
        fp = _first(self.manifest, "fingerprints", "split_fingerprints", default={}) or {}
        out: dict[str, str] = {}
        for key, value in fp.items() if isinstance(fp, dict) else []:
            if isinstance(value, list):
                for i, fold in enumerate(value):
                    items = fold.items() if isinstance(fold, dict) else [("", fold)]
                    for part, digest in items:
                        out[f"{fold_label(i)} {part}".strip()] = str(digest)
            elif isinstance(value, dict):
                out.update({f"{key} {k}": str(v) for k, v in value.items()})
            else:
                out[str(key)] = str(value)
        return out

    @property
    def asked_cells(self) -> list[str] | None:
        """The planned cells these results must hold, or None for every cell of the plan.

        One rule for `run`, `run --cells` and `merge`: a job of a split sweep (``run --cells``: its manifest
        lists ``planned_cells`` beside the ``cells`` it ran) answers for the cells it was asked for only, the
        others being other jobs'; a merged folder (``merged_from``) and a whole sweep answer for every planned
        cell. A cell these results must hold and do not is a cell without a result (exit 1).
        """
        m = self.manifest
        if isinstance(m.get("planned_cells"), list) and "merged_from" not in m and isinstance(m.get("cells"), list):
            return [str(c) for c in m["cells"]]
        return None

    @property
    def unreported(self) -> list[str]:
        """Cells of the whole grid with no final row, or refused by the budget audit.

        The grid is every planned cell, all jobs' under `run --cells` (the manifest's ``planned_cells``, else
        its ``cells``, else the re-planned protocol's). While one of them has no result the grid's best cell
        is unknown: it may be that one. A cell whose every trial failed in a finished sweep
        (`failed_every_trial`) has its result: it failed.
        """
        m = self.manifest
        listed = m.get("planned_cells") if isinstance(m.get("planned_cells"), list) else m.get("cells")
        if isinstance(listed, list):
            grid = [str(c) for c in listed]
        else:
            grid = [c.id for c in self.plan.cells] if self.plan is not None else []
        known = {trained_cell(c) for c in self.reported_cells} | set(self.failed_every_trial)
        return [c for c in dict.fromkeys([*grid, *self.refused]) if c not in known]

    @property
    def failed_every_trial(self) -> list[str]:
        """Cells of a finished sweep whose every tuning trial failed: a summary row with no seed and no final
        row (mid-sweep such a cell may still be tuning)."""
        s = self.summary
        if not self.manifest.get("finished") or s is None or not {"cell", "n_seeds"} <= set(s.columns):
            return []
        rows = {trained_cell(c) for c in self.finals["cell"].astype(str)} if "cell" in self.finals else set()
        return [
            c for c in dict.fromkeys(s.loc[s["n_seeds"] == 0, "cell"].astype(str).map(trained_cell)) if c not in rows
        ]

    @property
    def refused(self) -> dict[str, str]:
        """Cells the runner's budget audit refused: never reported beside the others."""
        r = self.manifest.get("refused") or {}
        return {str(k): str(v) for k, v in r.items()} if isinstance(r, dict) else {}

    def refusal(self, cell: str) -> str | None:
        """Why the budget audit refused the cell this row reports (a row of final.mode folds reports its trained
        cell: `bench.plan.trained_cell`), or None."""
        return self.refused.get(trained_cell(cell))

    def unrefused(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``frame`` whose cell the budget audit did not refuse."""
        return frame[~frame["cell"].astype(str).map(trained_cell).isin(self.refused)]

    @property
    def complete(self) -> pd.DataFrame:
        """Final runs that finished (a failed seed has no metrics to average)."""
        f = self.finals
        if "state" in f:
            f = f[f["state"].astype(str) == "COMPLETE"]
        return self.unrefused(f)

    @property
    def cells(self) -> list[str]:
        return list(dict.fromkeys(self.complete["cell"].astype(str)))

    @property
    def metrics(self) -> list[str]:
        """Test metrics in table order: the primary first, then the rest as the manifest lists them."""
        listed = self.manifest.get("metrics")
        if isinstance(listed, list) and listed:
            cols = [str(m) for m in listed if str(m) in self.finals]
        else:
            cols = [
                c
                for c in self.finals.columns
                if c not in RUN_COLUMNS and not c.startswith("val_") and pd.api.types.is_numeric_dtype(self.finals[c])
            ]
        if self.primary in cols:
            cols.remove(self.primary)
            cols.insert(0, self.primary)
        return cols

    @property
    def draws(self) -> bool:
        """Whether the sweep repeated its tuning (tuning.repeats > 1): its final rows carry a ``draw``."""
        return "draw" in self.finals.columns

    def values(self, cell: str, metric: str) -> np.ndarray:
        """Per-seed values of one metric for one cell, in seed order; under tuning.repeats each tuning draw's
        mean over its seeds, in draw order: the units every interval and test is over."""
        rows = self.rows(cell)
        if metric not in rows:
            raise BenchError(f"{self.root}: no metric {metric!r} in the final runs (have: {', '.join(self.metrics)})")
        if self.draws:
            return rows.groupby("draw", sort=True)[metric].mean().to_numpy(dtype=float)
        return rows[metric].to_numpy(dtype=float)

    def rows(self, cell: str) -> pd.DataFrame:
        """The completed final runs of one cell, in seed order (by draw, then seed, under tuning.repeats)."""
        rows = self.complete[self.complete["cell"].astype(str) == cell]
        order = [c for c in ("draw", "seed") if c in rows]
        return rows.sort_values(order) if order else rows

    def seeds(self, cell: str) -> list[Any]:
        """The final seeds of a cell, in the order `values` returns their values; under tuning.repeats the
        draws (``"draw <r>"``: paired between cells draw by draw, never with the floor's seeds)."""
        rows = self.rows(cell)
        if self.draws:
            return [f"draw {int(d)}" for d in sorted(rows["draw"].unique())]
        return [int(s) for s in rows["seed"]] if "seed" in rows else []

    def failed(self, cell: str) -> pd.DataFrame:
        """The final runs of one cell that did not finish (state other than COMPLETE): shown, never averaged."""
        f = self.finals[self.finals["cell"].astype(str) == cell]
        return f[f["state"].astype(str) != "COMPLETE"] if "state" in f else f.iloc[:0]

    @property
    def reported_cells(self) -> list[str]:
        """Every cell with final rows the audit did not refuse, including cells whose every seed failed."""
        return list(dict.fromkeys(self.unrefused(self.finals)["cell"].astype(str)))

    def floor_values(self, metric: str, cell: str | None = None) -> tuple[np.ndarray, list[int]]:
        """Per-seed floor values of one metric and their seeds, in seed order (empty when no floor was run):
        the cell's own floor where ``cell`` has one (a learned-metric cell), else the untrained trunk's."""
        f = self.floor
        own = self.cell_floor
        if cell is not None and own is not None and "cell" in own and (own["cell"].astype(str) == cell).any():
            f = own[own["cell"].astype(str) == cell]
        if f is None or f.empty or metric not in f:
            return np.array([]), []
        f = f.sort_values("seed") if "seed" in f else f
        seeds = [int(s) for s in f["seed"]] if "seed" in f else []
        return f[metric].to_numpy(dtype=float), seeds

    @property
    def cell_keys(self) -> dict[str, str]:
        """cell -> the key its records were read under (`bench.plan.cell_key`); empty for results from
        before cells had keys."""
        keys = self.manifest.get("cell_keys")
        return {str(k): str(v) for k, v in keys.items()} if isinstance(keys, dict) else {}

    def same_cell(self, plan: Plan, cell: str) -> bool:
        """Whether ``plan``'s cell of this name is the cell these results ran: the same cell key (the data
        part aside: the plan is not bound to data). Without recorded keys, whether the plan is of this hash."""
        if not self.cell_keys:
            return plan.protocol.hash == self.protocol_hash
        try:
            digest = plan.cell(cell).digest[:12]
        except KeyError:
            return False
        return self.cell_keys.get(trained_cell(cell), "").split(".")[0] == digest

    @cached_property
    def plan(self) -> Plan | None:
        """The protocol's plan, re-planned from the protocol the manifest names, or None.

        The manifest's protocol text is used first; else the file it names, looked up as given, then beside
        the repository holding the results, used when its hash is the results' hash or, for results with
        cell keys, when its shared settings are the results' (another version of the same experiment, with
        cells added or removed since: `same_cell` tells which of its cells are the ones that ran). An edited
        protocol would otherwise describe cells that were never run.
        """
        text = self.manifest.get("protocol_text")
        candidates: list[Any] = []
        if isinstance(text, str) and text.strip():
            candidates.append(lambda: parse_protocol(text, "manifest"))
        name = self.manifest.get("protocol_file")
        if isinstance(name, str) and name:
            for base in (Path.cwd(), *self.root.resolve().parents):
                path = base / name
                if path.is_file():
                    candidates.append(lambda path=path: load_protocol(path))
        for make in candidates:
            try:
                protocol = make()
            except (BenchError, OSError):
                continue
            shared = self.manifest.get("shared_hash")
            if protocol.hash == self.protocol_hash or (shared and self.cell_keys and protocol.shared_hash == shared):
                return plan(protocol)
        return None

    def artifact(self, cell: str, name: str) -> Path | None:
        """An artifact file of a cell (names: `bench.sweep.tables`), or None when the run wrote none. Under
        final.mode folds the trained cell's pair distances and 2-D embedding are its concatenated models', so a
        ``:separate`` row has only the cell's Optuna history."""
        trained = trained_cell(cell)
        if trained != cell and cell.endswith(":separate") and name != tables.HISTORY:
            return None
        path = tables.cell_dir(self.root, trained) / name
        return path if path.is_file() else None

    def require_cell(self, cell: str, what: str = "") -> None:
        """A BenchError naming the cells there are when ``cell`` is not one; ``what`` prefixes the message."""
        if cell not in self.cells:
            where = f"{what}: " if what else ""
            raise BenchError(f"{where}no cell {cell!r} in {self.root} (cells: {', '.join(self.cells)})")


def _first(d: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in d and d[k] not in (None, ""):
            return d[k]
    return default


def load(root: str | Path, complete: bool = True) -> Results:
    """Read (through `bench.sweep.tables`) and check a results directory; any problem is one `BenchError` line.

    ``complete``: a finished sweep's tables must hold every cell's final seeds (`bench.sweep.tables.check_complete`);
    `regress` turns it off and reports missing cells and seeds itself, cell by cell."""
    root = Path(root)
    try:
        exists = root.exists()
    except OSError as e:  # a name too long for the file system
        raise BenchError(f"results directory {str(root)[:200]}...: {e.strerror}") from None
    if not exists:
        raise BenchError(f"results directory {root} does not exist")
    if not root.is_dir():
        raise BenchError(f"{root} is not a directory (expected results/<protocol>/)")
    if not (root / tables.MANIFEST).is_file():
        raise BenchError(f"{root} is not a results directory: no {tables.MANIFEST} (run `dmlbench run` first)")
    try:
        read = tables.read(root)
    except (OSError, ValueError) as e:
        raise BenchError(f"{root}: unreadable results table ({e})") from None
    manifest, finals = read["manifest"], read["finals"]
    if not isinstance(manifest, dict):
        raise BenchError(f"{root / tables.MANIFEST}: expected a JSON object")
    finals_path = root / tables.FINALS
    if finals.empty:
        raise BenchError(f"{root} holds no final runs yet ({tables.FINALS} missing or empty)")
    if "cell" not in finals:
        raise BenchError(f"{finals_path}: no 'cell' column; not a dmlbench finals table")
    if complete:
        tables.check_complete(root, manifest, finals, read["summary"])
    res = Results(
        root,
        manifest,
        finals,
        read["trials"],
        read["summary"],
        finals_path,
        _floor(root, read),
        _budget_check(root, read),
        _cell_floor(root, read),
    )
    _check_hashes(res)
    _check_rows(res)
    _check_ranges(res)
    if not res.cells:
        raise BenchError(f"{root} holds no completed, budget-audited final runs")
    return res


def _cell_floor(root: Path, read: dict[str, Any]) -> pd.DataFrame | None:
    """cell_floor.csv (learned-metric cells' own floors) when present, of the manifest's protocol hash."""
    floor = read.get("cell_floor")
    if floor is None or floor.empty:
        return None
    expected = str(_first(read["manifest"], "protocol_hash", "hash", default=""))
    if expected and "protocol_hash" in floor and set(floor["protocol_hash"].astype(str)) != {expected}:
        raise BenchError(f"{root / 'cell_floor.csv'}: rows of another protocol hash than the manifest's")
    return floor


def _floor(root: Path, read: dict[str, Any]) -> pd.DataFrame | None:
    """floor.csv through `bench.sweep.tables.read` where it returns it, else read here (older readers, older runs)."""
    floor = read.get("floor")
    if floor is None:
        path = root / "floor.csv"
        try:
            floor = pd.read_csv(path) if path.is_file() else None
        except (OSError, ValueError) as e:
            raise BenchError(f"{path}: unreadable floor table ({e})") from None
    if floor is None or floor.empty:
        return None
    expected = str(_first(read["manifest"], "protocol_hash", "hash", default=""))
    if expected and "protocol_hash" in floor and set(floor["protocol_hash"].astype(str)) != {expected}:
        raise BenchError(f"{root / 'floor.csv'}: rows of another protocol hash than the manifest's")
    return floor


def _budget_check(root: Path, read: dict[str, Any]) -> pd.DataFrame | None:
    """budget_check.csv's rows (None when no budget check ran); rows of another protocol version are refused,
    as the floor's are: a change measured against other finals means nothing."""
    frame = read.get("budget_check")
    if frame is None or frame.empty:
        return None
    expected = str(_first(read["manifest"], "protocol_hash", "hash", default=""))
    if expected and "protocol_hash" in frame and set(frame["protocol_hash"].astype(str)) != {expected}:
        raise BenchError(f"{root / 'budget_check.csv'}: rows of another protocol hash than the manifest's")
    for column in ("cell", "seed", "multiple"):
        if column not in frame:
            raise BenchError(f"{root / 'budget_check.csv'}: no {column!r} column; not a budget check table")
    return frame


def _check_rows(res: Results) -> None:
    """What the reports take on trust from the files: cell ids (they become paths), integer seeds, the primary."""
    for cell in res.finals["cell"].unique():
        try:
            tables.check_cell_id(cell)
        except BenchError as e:
            raise BenchError(f"{res.finals_file}: {e}") from None
    if "seed" in res.finals:
        seeds = pd.to_numeric(res.finals["seed"], errors="coerce")
        if seeds.isna().any() or not (seeds == seeds.round()).all():
            bad = res.finals["seed"][seeds.isna() | (seeds != seeds.round())].iloc[0]
            raise BenchError(f"{res.finals_file}: seed {bad!r} is not an integer")
    primary = _first(res.manifest, "primary_metric", "primary", default="map_at_r")
    if not isinstance(primary, str) or primary not in res.finals:
        raise BenchError(
            f"{res.root / tables.MANIFEST}: the primary metric {str(primary)[:80]!r} is not a column of {tables.FINALS}"
        )


def _check_ranges(res: Results) -> None:
    """Every metric of a completed final seed is a number inside its range (NaN is allowed: a metric
    that could not be computed is shown as such and ranked last). A value of 1e308 or -5 is damage,
    and one such row would rank its cell first."""
    done = res.complete
    for metric in res.metrics:
        if metric not in done:
            continue
        low, high = metric_range(metric)
        values = pd.to_numeric(done[metric], errors="coerce")
        bad = done[(values < low) | (values > high) | (values.isna() & done[metric].notna())]
        if len(bad):
            row = bad.iloc[0]
            raise BenchError(
                f"{res.finals_file}: cell {row['cell']} seed {row.get('seed', '?')}: {metric} = "
                f"{_shown(row[metric])} is not a number in [{low:g}, {high:g}]: the table was edited or damaged"
            )


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


def _shown(value: Any) -> str:
    """A table's value as the file has it: a number plainly (5.0, not np.float64(5.0)), a string quoted."""
    return repr(value.item() if hasattr(value, "item") else value)
