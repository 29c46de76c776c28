"""The floor: the untrained trunk, scored like a final seed, so a results table shows what training added.

With common random numbers (bench.sweep.tuning._seeds) final seed ``s`` gives
every cell the same initial trunk, so the floor of seed ``s`` is that
trunk before its first step, scored on the test data by the same
evaluation call the final seeds use (`bench.evaluation.score_model`). It
depends on the protocol's shared settings and data alone, not on any cell
(its rows and MLflow runs are keyed by `Protocol.shared_key`, so adding or
removing a cell keeps them); recomputing it is cheap (embedding Omniglot's
evaluation set takes about 8 s), so `update_floor` keeps the rows already
in ``floor.csv`` for this shared key and computes only the missing seeds:
resumable and idempotent.
"""

from __future__ import annotations

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
    return {
        "protocol_hash": protocol.hash,
        "shared_key": protocol.shared_key,
        "seed": seed,
        **{m: float(scores[m]) for m in metrics},
    }


def update_floor(protocol: Protocol, prepared: Prepared, results: Path) -> pd.DataFrame:
    """floor.csv with one row per final seed: rows of this shared key kept (named with this protocol's hash),
    missing seeds computed."""
    columns = ["protocol_hash", "shared_key", "seed", *tables.metric_names(protocol.doc)]
    path = results / tables.FLOOR
    old = pd.read_csv(path, dtype=tables.KEY_DTYPES) if path.exists() else pd.DataFrame(columns=columns)
    keep = (
        old[(old["shared_key"] == protocol.shared_key) & old["seed"].isin(protocol.final_seeds)].assign(
            protocol_hash=protocol.hash
        )
        if list(old.columns) == columns
        else pd.DataFrame(columns=columns)
    )
    done = {int(s) for s in keep["seed"]}
    rows = [
        *keep.to_dict("records"),
        *(floor_row(protocol, prepared, s) for s in protocol.final_seeds if s not in done),
    ]
    frame = pd.DataFrame(sorted(rows, key=lambda r: protocol.final_seeds.index(int(r["seed"]))), columns=columns)
    write_with(path, lambda f: frame.to_csv(f, index=False))
    return frame
