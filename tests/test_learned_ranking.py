"""A learned-metric cell ranked by its own g: chunked scoring against a full-matrix loop, bounded blocks, its floor.

The references build the whole N x N matrix of g at once (fine for a few
dozen samples) and rank each row by a plain Python loop, ties by position;
the code under test scores chunks of query rows against every reference.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from bench.errors import BenchError
from bench.evaluation import EMBEDDING_PREFIX, evaluate, pair_scorer_of, ranked_by_metric
from bench.losses import pair_kernel
from bench.losses.learned_metric import LearnedMetric, PairScorer
from bench.metrics import query_gallery as qg
from bench.metrics.fewshot import OneShotRun, lake_runs_accuracy
from bench.registry import build_loss

PAIR_INPUTS = ("concat", "difference_product")
KS = (1, 2, 4, 50)
LABELS = [0] * 5 + [1] * 4 + [2] * 6 + [3] * 2 + [4] + [5] * 3 + [6] * 4  # a singleton class: never a query


def scorer(pair_input: str, dim: int = 6, seed: int = 0) -> PairScorer:
    torch.manual_seed(seed)
    metric = LearnedMetric(hidden=8, layers=2, pair_input=pair_input)
    metric.materialize(dim)
    return PairScorer(metric, normalize=True)


def data(n: int = len(LABELS), dim: int = 6, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g), torch.tensor(LABELS[:n] if n <= len(LABELS) else [i % 7 for i in range(n)])


def ref_ranking(full: torch.Tensor, qy: list[int], gy: list[int], same_set: bool, ks) -> dict[str, float]:
    """P@1, R-Precision, MAP@R, Recall@k from a full (query, gallery) matrix, one query at a time."""
    p1, rp, mapr, recall = [], [], [], {k: [] for k in ks}
    for i, row in enumerate(full.tolist()):
        order = sorted((v, j) for j, v in enumerate(row) if not (same_set and j == i))
        hits = [gy[j] == qy[i] for _, j in order]
        r = sum(hits)
        if r == 0:
            continue
        p1.append(float(hits[0]))
        rp.append(sum(hits[:r]) / r)
        mapr.append(sum(sum(hits[: t + 1]) / (t + 1) for t in range(r) if hits[t]) / r)
        first = hits.index(True) + 1
        for k in ks:
            recall[k].append(float(first <= k))
    out = {"precision_at_1": p1, "r_precision": rp, "map_at_r": mapr, **{f"recall_at_{k}": recall[k] for k in ks}}
    return {k: sum(v) / len(v) for k, v in out.items()}


@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
def test_chunked_g_scoring_equals_the_full_matrix_for_every_metric(pair_input: str) -> None:
    s = scorer(pair_input)
    x, y = data()
    prepared = s.prepare(x)
    full = s.metric.scores(prepared, prepared).detach()  # the whole N x N g at once
    want = ref_ranking(full, y.tolist(), y.tolist(), True, KS)
    assert 0 < want["map_at_r"] < 1 and 0 < want["recall_at_2"] < 1  # neither perfect nor empty
    assert len(set(full.flatten().tolist())) > full.numel() // 2 - len(full)  # no ties to hide an order
    for chunk in (1, 4, None):
        got = ranked_by_metric(s, x, y, KS, chunk_size=chunk)
        assert got == pytest.approx(want, abs=1e-12), chunk
    # query against a separate gallery
    q, qy = data(9, seed=2)
    qy = torch.tensor([0, 1, 2, 3, 4, 5, 6, 9, 1])  # class 9 is not in the gallery: skipped, counted
    full = s(s.prepare(q), prepared)
    want = ref_ranking(full, qy.tolist(), y.tolist(), False, KS)
    for chunk in (2, None):
        got = qg.query_gallery_metrics(
            s.prepare(q), qy, prepared, y, ks=KS, chunk_size=chunk, pair_score=s, pair_cost=s.cost(6)
        )
        assert got.pop("skipped_queries") == 1.0 and got.pop("num_queries") == 8.0
        assert got == pytest.approx(want, abs=1e-12)


def test_a_pair_score_that_is_the_distance_ranks_as_the_distance_every_metric_reid_included() -> None:
    """The plumbing of pair_score through every ranking, re-ID's mAP/CMC included: a scorer returning the
    squared Euclidean distance gives the Euclidean ranking's numbers."""
    x, y = data(40, seed=3)
    g, gy = data(60, seed=4)
    cams_q, cams_g = torch.arange(40) % 3, torch.arange(60) % 3

    def squared(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cdist(a.double(), b.double()).pow(2).float()

    plain = qg.query_gallery_metrics(x, y, g, gy, ks=(1, 3))
    learned = qg.query_gallery_metrics(x, y, g, gy, ks=(1, 3), pair_score=squared, chunk_size=7)
    assert learned == pytest.approx(plain, abs=1e-12)
    plain = qg.reid_metrics(x, y, cams_q, g, gy, cams_g, ks=(1, 3))
    learned = qg.reid_metrics(x, y, cams_q, g, gy, cams_g, ks=(1, 3), pair_score=squared, pair_cost=3)
    assert learned == pytest.approx(plain, abs=1e-12)


@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
def test_blocks_respect_the_memory_bound(pair_input: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Default chunks hold (ranking cost + the metric's per-pair cost) x rows x N within BLOCK_ELEMENTS:
    the metric is asked for row blocks, never the N x N matrix."""
    s = scorer(pair_input)
    x, y = data(60, seed=5)
    cost = qg.RANK_COST + s.cost(6)
    budget = cost * 60 * 7 + 5  # seven rows a chunk, whichever path scores g
    monkeypatch.setattr(qg, "BLOCK_ELEMENTS", budget)
    rows = budget // (cost * 60)
    assert rows == 7
    shapes: list[tuple[int, int]] = []

    def watched(q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        shapes.append((len(q), len(r)))
        return s(q, r)

    got = qg.query_gallery_metrics(
        s.prepare(x), y, s.prepare(x), y, query_ids=torch.arange(60), gallery_ids=torch.arange(60),
        pair_score=watched, pair_cost=s.cost(6),
    )  # fmt: skip
    assert max(q for q, _ in shapes) == rows and all(g == 60 for _, g in shapes)
    assert all(q * 60 * cost <= budget for q, _ in shapes)
    assert len(shapes) == math.ceil(60 / rows) and sum(q for q, _ in shapes) == 60
    assert got["map_at_r"] == pytest.approx(ranked_by_metric(s, x, y, (1, 2, 4, 8), chunk_size=60)["map_at_r"])
    # the compiled kernel holds two values a pair; the torch layout's bound is the network's width
    assert s.cost(6) == (pair_kernel.pair_cost(s.metric) if pair_kernel.applies(s.metric) else s.metric.pair_cost(6))
    monkeypatch.setattr(pair_kernel, "applies", lambda metric: False)
    assert s.cost(6) == (4 * 8 + 4 if pair_input == "concat" else 6 + 3 * 8 + 4)


class Watched:
    """A pair score that records the (rows, columns) it is asked for; ``symmetric`` as told."""

    def __init__(self, score, symmetric: bool) -> None:
        self.score, self.symmetric, self.shapes = score, symmetric, []

    def __call__(self, q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        self.shapes.append((len(q), len(r)))
        return self.score(q, r)


@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
@pytest.mark.parametrize("chunk", [1, 7, 13, 60])
def test_a_symmetric_score_of_a_set_against_itself_is_scored_for_one_triangle(pair_input: str, chunk: int) -> None:
    """A set ranked against itself under a symmetric g: each chunk of queries scores the columns from its
    own first row on, the rest comes from the chunks above; the numbers are the full matrix's."""
    s = scorer(pair_input)
    x, y = data(60, seed=5)
    prepared = s.prepare(x)
    want = ref_ranking(s.metric.scores(prepared, prepared).detach(), y.tolist(), y.tolist(), True, KS)
    watched = Watched(s, symmetric=True)
    ids = torch.arange(60)
    got = qg.query_gallery_metrics(
        prepared, y, prepared, y, ks=KS, query_ids=ids, gallery_ids=ids, chunk_size=chunk, pair_score=watched
    )
    got.pop("num_queries"), got.pop("skipped_queries")
    assert got == pytest.approx(want, abs=1e-12)
    starts = range(0, 60, chunk)
    assert watched.shapes == [(min(chunk, 60 - s0), 60 - s0) for s0 in starts]  # the columns from s0 on
    assert sum(q * r for q, r in watched.shapes) < 60 * 60 or chunk == 60


def test_the_triangle_is_not_taken_for_two_sets_an_asymmetric_score_or_a_set_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = scorer("concat")
    x, y = data(60, seed=5)
    prepared = s.prepare(x)
    full = [(7, 60)] * 8 + [(4, 60)]

    def shapes(query: torch.Tensor, gallery: torch.Tensor, symmetric: bool) -> list[tuple[int, int]]:
        watched = Watched(s, symmetric)
        qg.query_gallery_metrics(query, y, gallery, y, ks=KS, chunk_size=7, pair_score=watched)
        return watched.shapes

    assert shapes(prepared, prepared, False) == full  # not said to be symmetric
    assert shapes(prepared, prepared.clone(), True) == full  # equal values, but not one set
    monkeypatch.setattr(qg, "MIRROR_ELEMENTS", 60 * 60 // 4 - 1)  # what it would keep exceeds the bound
    assert shapes(prepared, prepared, True) == full
    monkeypatch.setattr(qg, "MIRROR_ELEMENTS", 60 * 60 // 4)
    assert shapes(prepared, prepared, True)[1] == (7, 53)


def test_the_triangle_ranks_re_id_as_the_full_matrix_junk_and_cameras_included() -> None:
    """re-ID's blocks leave junk columns out after scoring: a symmetric score of one set against itself
    gives the numbers of the full scoring."""
    x, y = data(50, seed=6)
    y = y.clone()
    y[::9] = -1  # junk
    cams = torch.arange(50) % 3
    ids = torch.arange(50)

    def squared(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cdist(a.double(), b.double()).pow(2).float()

    results = []
    for symmetric in (False, True):
        watched = Watched(squared, symmetric)
        results.append(
            qg.reid_metrics(x, y, cams, x, y, cams, ks=(1, 3), query_ids=ids, gallery_ids=ids, chunk_size=6,
                            pair_score=watched)
        )  # fmt: skip
        assert (watched.shapes[-1][1] < 50) is symmetric
    assert results[1] == pytest.approx(results[0], abs=1e-12) and 0 < results[0]["reid_map"] < 1


def test_pair_score_of_the_wrong_shape_or_not_finite_is_refused() -> None:
    x, y = data(10)
    with pytest.raises(BenchError, match=r"pair_score returned \(10, 9\), expected \(10, 10\)"):
        qg.query_gallery_metrics(x, y, x, y, pair_score=lambda a, b: torch.zeros(len(a), len(b) - 1))
    with pytest.raises(BenchError, match="NaN or inf"):
        qg.query_gallery_metrics(x, y, x, y, pair_score=lambda a, b: torch.full((len(a), len(b)), math.nan))


def test_lake_runs_ranked_by_g() -> None:
    s = scorer("difference_product", dim=4)
    g = torch.Generator().manual_seed(6)
    runs = [
        OneShotRun(torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g), torch.randperm(5, generator=g))
        for _ in range(3)
    ]
    got = lake_runs_accuracy(s.prepare, runs, pair_score=s)
    hits = 0
    for run in runs:
        full = s.metric.scores(s.prepare(run.test_x), s.prepare(run.train_x)).detach()
        for t, row in enumerate(full.tolist()):
            hits += min(range(5), key=lambda j: (row[j], j)) == int(run.answer[t])
    assert got["accuracy"] == pytest.approx(hits / 15)


def test_evaluate_ranks_by_g_with_the_embedding_ranking_beside_it() -> None:
    torch.manual_seed(7)
    trunk = nn.Linear(5, 6)
    x, y = data(len(LABELS), dim=5, seed=8)
    test = SimpleNamespace(x=x, y=y)
    s = scorer("concat", dim=6, seed=9)
    plain = evaluate(trunk, test, ks=KS, clustering=True, normalize=True)
    learned = evaluate(trunk, test, ks=KS, clustering=True, normalize=True, metric=s)
    with torch.no_grad():
        raw = trunk(x)
    assert {k: v for k, v in learned.items() if not k.startswith(EMBEDDING_PREFIX) and k not in ("nmi", "ami")} == (
        pytest.approx(ranked_by_metric(s, raw, y, KS), abs=1e-12)
    )
    ranking = {k: v for k, v in plain.items() if k not in ("nmi", "ami")}
    assert {k[len(EMBEDDING_PREFIX) :]: v for k, v in learned.items() if k.startswith(EMBEDDING_PREFIX)} == ranking
    assert learned["nmi"] == plain["nmi"]  # k-means clusters the embeddings in both
    assert learned["map_at_r"] != plain["map_at_r"]


def test_pair_scorer_of_a_loss() -> None:
    loss = build_loss("quadruplet", learned_metric=True, pair_input="difference_product")
    s = pair_scorer_of(loss)
    assert isinstance(s, PairScorer) and s.metric is loss.metric and s.normalize
    assert pair_scorer_of(build_loss("quadruplet")) is None and pair_scorer_of(build_loss("contrastive")) is None


TINY = """\
name: tiny-learned
seed: 3
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 12
  test_classes: 6
  image_size: 12
  validation: {folds: 3, use: 1, group_by: alphabet}
model: {trunk: mlp, trunk_params: {hidden: [32]}, embedding_dim: 8, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 4, K: 4, iterations: 3}
evaluation: {metrics: [precision_at_1, map_at_r, recall_at_k, lake_accuracy], primary: map_at_r, ks: [1, 2]}
tuning: {trials: 1}
final: {seeds: [0, 1]}
grid:
  losses:
    - {name: triplet, miners: [none]}
    - name: quadruplet
      label: quadruplet-dp
      params: {learned_metric: true, pair_input: difference_product}
      miners: [margohnm-w1]  # w2 is dead beside a fresh learned metric, as in the Omniglot protocols
  miners: [{name: none}, {name: margohnm, label: margohnm-w1, params: {w2: 0.5}}]
"""


@pytest.mark.slow
def test_cell_floor_is_the_cells_untrained_trunk_and_metric_scored_the_same_way(data_root, monkeypatch, tmp_path):
    """A learned-metric cell's floor: the trunk and metric `train` starts from for that seed (caught as the
    trainer builds them), ranked by g; its embedding ranking is the protocol floor's trunk."""
    import copy

    import pandas as pd

    from bench import training
    from bench.evaluation import score_model
    from bench.plan import cell_key, plan
    from bench.protocol import parse_protocol
    from bench.sweep import floor
    from bench.sweep.prepare import prepare
    from bench.sweep.records import metric_names
    from bench.sweep.tables import CELL_FLOOR
    from bench.sweep.tuning import final_config

    protocol = parse_protocol(TINY)
    prepared = prepare(protocol, str(data_root))
    learned = floor.learned_metric_cells(protocol, plan(protocol).cells)
    assert [c.id for c in learned] == ["quadruplet-dp+margohnm-w1"]
    cell = learned[0]
    row = floor.cell_floor_row(protocol, prepared, cell, 0)
    built = []
    real = training.build_cell

    def caught(*args, **kwargs):
        out = real(*args, **kwargs)
        built.append(copy.deepcopy(out[:2]))
        return out

    monkeypatch.setattr(training, "build_cell", caught)
    config = final_config(protocol, cell, {}, 0)
    training.train(config, prepared.train)
    monkeypatch.undo()
    trunk, loss = built[0]
    want = score_model(
        protocol.spec, trunk.eval(), prepared.test, clustering=False, lake_runs=prepared.lake_runs,
        metric=pair_scorer_of(loss),
    )  # fmt: skip
    metrics = metric_names(protocol.spec.evaluation)
    want_row = {"protocol_hash": protocol.hash, "cell_key": cell_key(protocol, cell), "cell": cell.id, "seed": 0}
    assert row == {**want_row, **{m: want[m] for m in metrics}}
    trunk_floor = floor.floor_row(protocol, prepared, 0)
    assert {m: want[EMBEDDING_PREFIX + m] for m in metrics} == pytest.approx({m: trunk_floor[m] for m in metrics})
    assert want["map_at_r"] != trunk_floor["map_at_r"]  # ranked by g, not by the embedding distance
    frame = floor.update_cell_floor(protocol, prepared, tmp_path, plan(protocol).cells)
    assert list(frame["cell"]) == [cell.id] * 2 and list(frame["seed"]) == [0, 1]
    assert frame.iloc[0].to_dict() == pytest.approx(row)
    assert pd.read_csv(tmp_path / CELL_FLOOR).equals(frame)
    calls = []
    monkeypatch.setattr(floor, "cell_floor_row", lambda *a: calls.append(a))
    assert floor.update_cell_floor(protocol, prepared, tmp_path, plan(protocol).cells).equals(frame) and not calls

    # tuning's checkpoints (the pruner's scores) and the final score rank by the same g
    from bench.sweep.tuning import train_and_score

    seen = []
    result = train_and_score(
        protocol, config, prepared.train, prepared.test, clustering=False,
        on_checkpoint=lambda it, model, metric: seen.append(metric), checkpoint_every=1,
    )  # fmt: skip
    assert len(seen) == 3 and all(isinstance(m, PairScorer) for m in seen)
    assert all(m.metric is result.metric.metric for m in seen)
    got = score_model(protocol.spec, result.model, prepared.test, clustering=False, metric=result.metric)
    assert got == result.metrics and "map_at_r" in got
    assert "embedding_map_at_r" in result.metrics
    triplet = next(c for c in plan(protocol).cells if c.loss == "triplet")
    seen.clear()
    plain = train_and_score(
        protocol, final_config(protocol, triplet, {}, 0), prepared.train, prepared.test, clustering=False,
        on_checkpoint=lambda it, model, metric: seen.append(metric), checkpoint_every=1,
    )  # fmt: skip
    assert seen == [None] * 3 and plain.metric is None and "embedding_map_at_r" not in plain.metrics


@pytest.mark.slow
def test_a_learned_cells_floor_reuses_the_test_embedding_of_the_floor_of_its_seed(data_root, monkeypatch):
    """The floor of seed s and a learned-metric cell's own floor of s start from one trunk: a worker that scored
    one embeds the test set no more for the other (either order), and every row is that of scoring it alone."""
    from bench import evaluation
    from bench.plan import plan
    from bench.protocol import parse_protocol
    from bench.sweep import floor
    from bench.sweep.prepare import prepare

    protocol = parse_protocol(TINY)
    prepared = prepare(protocol, str(data_root))
    (cell,) = floor.learned_metric_cells(protocol, plan(protocol).cells)
    embedded: list[int] = []
    real = evaluation._folded
    monkeypatch.setattr(
        evaluation, "_folded", lambda m, x, d: (embedded.append(1) if x is prepared.test.x else None, real(m, x, d))[1]
    )
    monkeypatch.setattr(floor._Untrained, "LIMIT_VALUES", 0)  # nothing kept: each row alone
    monkeypatch.setattr(floor, "_UNTRAINED", floor._Untrained())
    alone = [floor.floor_row(protocol, prepared, 0), floor.cell_floor_row(protocol, prepared, cell, 0)]
    alone += [floor.cell_floor_row(protocol, prepared, cell, 1), floor.floor_row(protocol, prepared, 1)]
    assert len(embedded) == 4
    monkeypatch.undo()
    monkeypatch.setattr(
        evaluation, "_folded", lambda m, x, d: (embedded.append(1) if x is prepared.test.x else None, real(m, x, d))[1]
    )
    monkeypatch.setattr(floor, "_UNTRAINED", floor._Untrained())
    embedded.clear()
    kept = [floor.floor_row(protocol, prepared, 0), floor.cell_floor_row(protocol, prepared, cell, 0)]
    assert len(embedded) == 1
    kept += [floor.cell_floor_row(protocol, prepared, cell, 1), floor.floor_row(protocol, prepared, 1)]
    assert len(embedded) == 2 and kept == alone


def test_reports_compare_a_learned_metric_cell_with_its_own_floor(tmp_path) -> None:
    import pandas as pd

    from bench.reports.source import Results

    finals = pd.DataFrame({"cell": ["a+none", "q+margohnm"], "seed": [0, 0], "map_at_r": [0.3, 0.2]})
    trunk = pd.DataFrame({"protocol_hash": ["h", "h"], "seed": [1, 0], "map_at_r": [0.11, 0.10]})
    own = pd.DataFrame(
        {"protocol_hash": ["h"] * 2, "cell": ["q+margohnm"] * 2, "seed": [0, 1], "map_at_r": [0.0, 0.01]}
    )
    res = Results(tmp_path, {"protocol_hash": "h"}, finals, floor=trunk, cell_floor=own)
    values, seeds = res.floor_values("map_at_r", "q+margohnm")
    assert list(values) == [0.0, 0.01] and seeds == [0, 1]
    values, seeds = res.floor_values("map_at_r", "a+none")  # a cell without its own floor: the trunk's
    assert list(values) == [0.10, 0.11] and seeds == [0, 1]
    assert list(res.floor_values("map_at_r")[0]) == [0.10, 0.11]  # the leaderboard's floor row


def test_train_command_ranks_a_learned_metric_run_by_g_and_its_floor_too(tmp_path, capsys) -> None:
    """`dmlbench train` with a learned metric: metrics and floor ranked by g, the embedding ranking beside
    them; the floor is the seed's initial trunk and metric, whatever the training did."""
    import json

    from _shared import write_folder

    from bench.cli import main

    pool = write_folder(tmp_path / "faces", ["ann", "bob", "cid", "dan", "eve", "fay"])
    common = [
        "train", "--data", f"folder:{pool}", "--split", "0.5", "--trunk", "mlp", "--embedding-dim", "8",
        "--size", "8", "--loss", "quadruplet", "--loss-param", "learned_metric=true",
        "--loss-param", "pair_input=difference_product", "--P", "3", "--K", "2", "--iterations", "3",
        "--threads", "1", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--quiet", "--format", "json",
    ]  # fmt: skip
    assert main([*common, "--lr", "0.5"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*common, "--lr", "1e-6"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert one["floor"] == two["floor"] and one["metrics"] != two["metrics"]
    assert {"map_at_r", "embedding_map_at_r"} <= set(one["metrics"]) and set(one["floor"]) == set(one["metrics"])


@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
@pytest.mark.parametrize("tile", [(3, 5), (1, 1), (1000, 7)])
def test_tiled_scoring_equals_the_row_layout_on_every_tile_shape(
    pair_input: str, tile: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`PairScorer` on the CPU scores (rows x columns) tiles, hidden unit first (`LearnedMetric.tile`): the
    same g as the (pairs x hidden) layout of `scores`, whatever the tiles' shape and the edges they leave."""
    import bench.losses.learned_metric as lm

    pairs, cols = tile
    monkeypatch.setattr(lm, "CPU_TILE_PAIRS", pairs * cols)
    monkeypatch.setattr(lm, "CPU_TILE_COLUMNS", cols)
    torch.manual_seed(3)
    metric = LearnedMetric(hidden=5, layers=4, pair_input=pair_input).double()
    metric.materialize(7, torch.zeros(1, dtype=torch.float64))
    s = PairScorer(metric, normalize=True)
    q, r = s.prepare(torch.randn(11, 7, dtype=torch.float64)), s.prepare(torch.randn(23, 7, dtype=torch.float64))
    with torch.no_grad():
        want = metric.scores(q, r)
        assert torch.allclose(metric.tile(q, r), want, rtol=0, atol=1e-12)
    got = s(q, r)
    assert got.dtype == torch.float32 and got.shape == (11, 23)
    assert torch.allclose(got, want.float(), rtol=0, atol=1e-6)
    assert s(q[:0], r).shape == (0, 23) and s(q, r[:0]).shape == (11, 0)
