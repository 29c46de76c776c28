"""The floor: the untrained trunk, scored like a final seed, so a results table shows what training added.

With common random numbers (bench.sweep.tuning._seeds) final seed ``s`` gives
every cell the same initial trunk, so the floor of seed ``s`` is that
trunk before its first step, scored on the test data by the same
evaluation call the final seeds use (`bench.evaluation.score_model`). It
depends on the protocol alone, not on any cell; recomputing it is cheap
(embedding Omniglot's evaluation set takes about 8 s), so `update_floor`
keeps the rows already in ``floor.csv`` for this protocol version and
computes only the missing seeds: resumable and idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from bench.atomic import write_with
from bench.evaluation import clusters_on_test, score_model
from bench.protocol import Protocol
from bench.sweep import tables
from bench.sweep.tuning import Prepared, final_seed


def initial_trunk(protocol: Protocol, seed: int, in_shape: tuple[int, ...]) -> Any:
    """The trunk final seed ``seed`` starts from: seeded and built exactly as bench.training.train does."""
    from bench.training import seed_everything  # the training loop's own seeding, so the two cannot drift
    from bench.trunks import protocol_trunk

    seed_everything(final_seed(protocol.seed, seed))
    return protocol_trunk(protocol.doc, in_shape).to(protocol.doc["training"]["device"]).eval()


def floor_row(protocol: Protocol, prepared: Prepared, seed: int) -> dict[str, Any]:
    """One row of floor.csv: the protocol version, the seed, every metric of the finals table."""
    metrics = tables.metric_names(protocol.doc)
    trunk = initial_trunk(protocol, seed, tuple(prepared.train.x.shape[1:]))
    scores = score_model(
        protocol,
        trunk,
        prepared.test,
        clustering=clusters_on_test(protocol),
        lake_runs=prepared.lake_runs,
        device=protocol.doc["training"]["device"],
        seed=final_seed(protocol.seed, seed),
    )
    return {"protocol_hash": protocol.hash, "seed": seed, **{m: float(scores[m]) for m in metrics}}


def update_floor(
    protocol: Protocol, prepared: Prepared, results: Path, rows: Mapping[int, dict[str, Any]] | None = None
) -> pd.DataFrame:
    """floor.csv with one row per final seed: rows of this protocol version kept, missing seeds taken from
    ``rows`` (seed: row, as `floor_row` makes them: computed by the sweep's workers, each seed by one) or
    computed here."""
    given = dict(rows or {})
    columns = ["protocol_hash", "seed", *tables.metric_names(protocol.doc)]
    path = results / tables.FLOOR
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=columns)
    keep = (
        old[(old["protocol_hash"] == protocol.hash) & old["seed"].isin(protocol.final_seeds)]
        if list(old.columns) == columns
        else pd.DataFrame(columns=columns)
    )
    done = {int(s) for s in keep["seed"]}
    out = [
        *keep.to_dict("records"),
        *(given.get(s) or floor_row(protocol, prepared, s) for s in protocol.final_seeds if s not in done),
    ]
    frame = pd.DataFrame(sorted(out, key=lambda r: protocol.final_seeds.index(int(r["seed"]))), columns=columns)
    write_with(path, lambda f: frame.to_csv(f, index=False))
    return frame
