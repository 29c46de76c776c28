"""The floor: the untrained trunk, scored like a final seed, so a results table shows what training added.

With common random numbers (bench.sweep.seeds) final seed ``s`` gives
every cell the same initial trunk, so the floor of seed ``s`` is that
trunk before its first step, scored on the test data by the same
evaluation call the final seeds use (`bench.evaluation.score_model`). It
depends on the protocol's shared settings and data alone, not on any cell
(its rows and MLflow runs are keyed by `Protocol.shared_key`, so adding or
removing a cell keeps them); recomputing it is cheap (embedding Omniglot's
evaluation set takes about 8 s), so `update_floor` keeps the rows already
in ``floor.csv`` for this shared key and computes only the missing seeds:
resumable and idempotent.

A cell ranked by its own learned metric (`bench.evaluation.pair_scorer_of`)
has its own floor, in ``cell_floor.csv``: the same untrained trunk with the
cell's untrained metric, both built as `bench.training.train` builds them
for that seed (`bench.cell.build_cell`: the metric's weights are drawn right
after the trunk's), scored the same way (ranked by ``g``, the embedding
ranking beside it). Reports compare such a cell with its own floor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from bench.atomic import write_with
from bench.cell import build_cell, build_methods, classes_of, planned_classes, protocol_trunk
from bench.evaluation import clusters_on_test, kept_embeddings, pair_scorer_of, score_model
from bench.plan import cell_key
from bench.protocol import Protocol
from bench.sweep import tables
from bench.sweep.prepare import Prepared
from bench.sweep.records import metric_names
from bench.sweep.seeds import final_seed
from bench.sweep.tuning import final_config
from bench.training import seed_everything


def initial_trunk(protocol: Protocol, seed: int, in_shape: tuple[int, ...]) -> Any:
    """The trunk final seed ``seed`` starts from: seeded and built exactly as bench.training.train does."""
    seed_everything(final_seed(protocol.seed, seed))  # the training loop's own seeding, so the two cannot drift
    return protocol_trunk(protocol.spec.model, in_shape).to(protocol.spec.training.device).eval()


class _Untrained:
    """The untrained trunks this process scored, by (shared key, seed), and their raw test embeddings: the floor
    of seed ``s`` and every learned-metric cell's own floor of ``s`` start from the same trunk (common random
    numbers), so the test set is embedded once a seed in a worker, not once a floor row. A trunk is reused only
    if its weights equal the one just built (`same`). Kept while the test embeddings of all seeds stay within
    `LIMIT_VALUES` floats (a protocol without learned-metric cells reuses nothing, and holds at most that)."""

    LIMIT_VALUES = 1 << 24  # 64 MB of float32: Omniglot's 13,180 x 64 is 0.8 M values a seed

    def __init__(self) -> None:
        self.data: Any = None  # the test images the store is for (held: its id stays its own)
        self.store: dict[Any, Any] = {}  # `kept_embeddings`' store: (model id, batch, device) -> (model, raw)
        self.trunks: dict[tuple[str, int], Any] = {}

    def scoring(self, protocol: Protocol, prepared: Prepared, seed: int, trunk: Any) -> tuple[Any, Any]:
        """The trunk to score for this seed (the kept one if its weights are ``trunk``'s) and the context that
        keeps or reuses its test embeddings."""
        x = getattr(prepared.test, "x", None)  # a query/gallery test side is scored apart (not kept)
        size = len(x) * protocol.spec.model.embedding_dim * len(protocol.final_seeds) if x is not None else 0
        if x is None or size > self.LIMIT_VALUES:
            return trunk, contextlib.nullcontext()
        if self.data is not x:
            self.data, self.store, self.trunks = x, {}, {}
        key = (protocol.shared_key, seed)
        kept = self.trunks.get(key)
        if kept is not None and same(kept, trunk):
            trunk = kept
        else:
            self.trunks[key] = trunk
        return trunk, kept_embeddings(x, self.store)


def same(a: Any, b: Any) -> bool:
    """Whether two modules hold equal parameters and buffers, name by name."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


_UNTRAINED = _Untrained()


def _scored_untrained(
    protocol: Protocol, prepared: Prepared, seed: int, trunk: Any, device: str, metric: Any = None
) -> dict[str, float]:
    """Final seed ``seed``'s untrained ``trunk`` scored as its final is (ranked by ``metric``, a learned
    metric's scorer, if given), its test embedding shared with the other floors of that seed (`_Untrained`)."""
    trunk, keeping = _UNTRAINED.scoring(protocol, prepared, seed, trunk)
    with keeping:
        return score_model(
            protocol.spec,
            trunk,
            prepared.test,
            clustering=clusters_on_test(protocol.spec),
            lake_runs=prepared.lake_runs,
            device=device,
            seed=final_seed(protocol.seed, seed),
            metric=metric,
        )


def floor_row(protocol: Protocol, prepared: Prepared, seed: int) -> dict[str, Any]:
    """One row of floor.csv: the protocol version, the seed, every metric of the finals table."""
    metrics = metric_names(protocol.spec.evaluation)
    trunk = initial_trunk(protocol, seed, tuple(prepared.train.x.shape[1:]))
    scores = _scored_untrained(protocol, prepared, seed, trunk, protocol.spec.training.device)
    return {
        "protocol_hash": protocol.hash,
        "shared_key": protocol.shared_key,
        "seed": seed,
        **{m: float(scores[m]) for m in metrics},
    }


def learned_metric_cells(protocol: Protocol, cells: Any) -> list[Any]:
    """The cells whose loss ranks by a learned metric (built with the cell's fixed parameters to ask it)."""
    spec = protocol.spec

    def learned(cell: Any) -> bool:
        with torch.random.fork_rng(devices=[]):  # asking draws the metric's weights: leave the RNG as it was
            loss, _ = build_methods(
                cell.loss,
                cell.loss_params,
                None,
                {},
                num_classes=planned_classes(spec.training.P),
                embedding_dim=spec.model.embedding_dim,
            )
        return pair_scorer_of(loss) is not None

    return [c for c in cells if learned(c)]


def cell_floor_row(protocol: Protocol, prepared: Prepared, cell: Any, seed: int) -> dict[str, Any]:
    """One row of cell_floor.csv: the cell's untrained trunk and metric of final seed ``seed``, scored."""
    config = final_config(protocol, cell, {}, seed)  # the searched values do not touch the initial weights
    seed_everything(config.seed)
    in_shape, num_classes = tuple(prepared.train.x.shape[1:]), classes_of(prepared.train.y)
    trunk, loss, _ = build_cell(config, in_shape, num_classes, torch.device(config.device))
    scores = _scored_untrained(protocol, prepared, seed, trunk.eval(), config.device, pair_scorer_of(loss))
    metrics = metric_names(protocol.spec.evaluation)
    return {
        "protocol_hash": protocol.hash,
        "cell_key": cell_key(protocol, cell),
        "cell": cell.id,
        "seed": seed,
        **{m: float(scores[m]) for m in metrics},
    }


def update_cell_floor(
    protocol: Protocol,
    prepared: Prepared,
    results: Path,
    cells: Any,
    rows: Mapping[tuple[str, int], dict[str, Any]] | None = None,
) -> pd.DataFrame:
    """cell_floor.csv: a row per learned-metric cell and final seed, kept or computed as `update_floor`; a row
    is kept while its cell's key is the cell's key now (`bench.plan.cell_key`: the shared settings, the data
    and the cell's own definition), so adding another cell recomputes nothing. Missing rows are taken from
    ``rows`` ((cell, seed): row, as `cell_floor_row` makes them: computed by the sweep's workers, each by one)
    or computed here."""
    given = dict(rows or {})
    columns = ["protocol_hash", "cell_key", "cell", "seed", *metric_names(protocol.spec.evaluation)]
    path = results / tables.CELL_FLOOR
    learned = learned_metric_cells(protocol, cells)
    keys = {c.id: cell_key(protocol, c) for c in learned}
    old = pd.read_csv(path, dtype=tables.KEY_DTYPES) if path.exists() else pd.DataFrame(columns=columns)
    keep = (
        old[old["seed"].isin(protocol.final_seeds)].assign(protocol_hash=protocol.hash)
        if list(old.columns) == columns
        else pd.DataFrame(columns=columns)
    )
    current = pd.Series([keys.get(str(c)) == k for c, k in zip(keep["cell"], keep["cell_key"])], dtype=bool)
    keep = keep.loc[current.to_numpy()]
    done = {(str(c), int(s)) for c, s in zip(keep["cell"], keep["seed"])}
    out = [
        *keep.to_dict("records"),
        *(
            _named(given.get((c.id, s)), protocol) or cell_floor_row(protocol, prepared, c, s)
            for c in learned
            for s in protocol.final_seeds
            if (c.id, s) not in done
        ),
    ]
    order = {c.id: i for i, c in enumerate(learned)}
    out.sort(key=lambda r: (order[str(r["cell"])], protocol.final_seeds.index(int(r["seed"]))))
    frame = pd.DataFrame(out, columns=columns)
    if learned or path.exists():
        write_with(path, lambda f: frame.to_csv(f, index=False))
    return frame


def _named(row: dict[str, Any] | None, protocol: Protocol) -> dict[str, Any] | None:
    """A row a worker stored (under an earlier version of the protocol, when only cells were added since)
    named with this protocol's hash, as kept rows are."""
    return None if row is None else {**row, "protocol_hash": protocol.hash}


def update_floor(
    protocol: Protocol, prepared: Prepared, results: Path, rows: Mapping[int, dict[str, Any]] | None = None
) -> pd.DataFrame:
    """floor.csv with one row per final seed: rows of this shared key kept (named with this protocol's hash),
    missing seeds taken from ``rows`` (seed: row, as `floor_row` makes them: computed by the sweep's workers,
    each seed by one) or computed here."""
    given = dict(rows or {})
    columns = ["protocol_hash", "shared_key", "seed", *metric_names(protocol.spec.evaluation)]
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
    out = [
        *keep.to_dict("records"),
        *(
            _named(given.get(s), protocol) or floor_row(protocol, prepared, s)
            for s in protocol.final_seeds
            if s not in done
        ),
    ]
    frame = pd.DataFrame(sorted(out, key=lambda r: protocol.final_seeds.index(int(r["seed"]))), columns=columns)
    write_with(path, lambda f: frame.to_csv(f, index=False))
    return frame
