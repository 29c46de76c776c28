"""What `bench.sweep.runner.run_protocol` returns: the results tables themselves, not a path to them.

A caller in Python (a notebook, a test) wants the numbers; the files on disk
are the record that outlives the process. Both are the same tables:
this object is `bench.sweep.tables.read` of the directory the sweep wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench.sweep.tables import read


@dataclass(frozen=True)
class SweepResult:
    """The tables of a finished (or resumed) sweep.

    `finals`: one row per cell and final seed (test metrics, state, reason);
    `summary`: one row per cell (means and 95% intervals over seeds);
    `trials`: one row per tuning trial; `manifest`: protocol hash, split
    fingerprints, budget, code version; `path`: the results directory;
    `cells`: how many cells the plan holds; `wall_time_s`: this call's
    duration; `recorded_iterations` of the plan's `total_iterations`: what
    the stores already held when this call started (taken from the records,
    not trained again: all of them when a finished sweep is run again on
    the same stores). No cell is left out by the budget audit: `run_protocol`
    raises instead of returning such a sweep (the manifest's ``refused``
    names them).
    """

    path: Path
    finals: pd.DataFrame
    summary: pd.DataFrame
    trials: pd.DataFrame
    manifest: dict[str, Any]
    cells: int
    wall_time_s: float
    recorded_iterations: int = 0
    total_iterations: int = 0

    @classmethod
    def read(
        cls, path: str | Path, cells: int, wall_time_s: float, recorded_iterations: int = 0, total_iterations: int = 0
    ) -> SweepResult:
        """The tables as written in `path` (`bench.sweep.tables.read`)."""
        tables = read(path)
        return cls(
            Path(path),
            tables["finals"],
            tables["summary"],
            tables["trials"],
            tables["manifest"],
            cells,
            wall_time_s,
            recorded_iterations,
            total_iterations,
        )
