"""Query/gallery and re-ID metrics against plain loop references and PML, and the protocol wiring end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from bench.errors import BenchError
from bench.metrics.query_gallery import query_gallery_metrics, ranked_prefix, reid_metrics

# --------------------------------------------------------------------------- loop references


def _ranked(q: np.ndarray, g: np.ndarray, excluded: set[int]) -> list[int]:
    """Gallery positions by (squared distance, position), excluded ones removed: the stated order."""
    d = [float(((q.astype(np.float64) - row) ** 2).sum()) for row in g.astype(np.float64)]
    return [j for j in sorted(range(len(g)), key=lambda j: (d[j], j)) if j not in excluded]


def _loop_query_gallery(q, qy, g, gy, qid, gid, ks):
    first, rp, mr = [], [], []
    for i in range(len(q)):
        excluded = {j for j in range(len(g)) if qid is not None and qid[i] == gid[j]}
        order = _ranked(q[i], g, excluded)
        hits = [gy[j] == qy[i] for j in order]
        r = sum(hits)
        if r == 0:
            continue
        first.append(hits.index(True) + 1)
        rp.append(sum(hits[:r]) / r)
        mr.append(sum(sum(hits[: t + 1]) / (t + 1) for t in range(r) if hits[t]) / r)
    out = {
        "precision_at_1": np.mean([f == 1 for f in first]),
        "r_precision": np.mean(rp),
        "map_at_r": np.mean(mr),
        "num_queries": len(first),
        "skipped_queries": len(q) - len(first),
    }
    out.update({f"recall_at_{k}": np.mean([f <= k for f in first]) for k in ks})
    return out


def _loop_reid(q, qy, qc, g, gy, gc, ks, qid=None, gid=None):
    first, ap = [], []
    for i in range(len(q)):
        excluded = {
            j
            for j in range(len(g))
            if gy[j] == -1 or (gy[j] == qy[i] and gc[j] == qc[i]) or (qid is not None and qid[i] == gid[j])
        }
        order = _ranked(q[i], g, excluded)
        hits = [gy[j] == qy[i] and gy[j] != 0 for j in order]
        if not any(hits):
            continue
        first.append(hits.index(True) + 1)
        found = 0
        precisions = []
        for t, hit in enumerate(hits):
            if hit:
                found += 1
                precisions.append(found / (t + 1))
        ap.append(np.mean(precisions))
    out = {"reid_map": np.mean(ap), "num_queries": len(first), "skipped_queries": len(q) - len(first)}
    out.update({f"cmc_at_{k}": np.mean([f <= k for f in first]) for k in ks})
    return out


def _close(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for key in a:
        assert math.isclose(a[key], b[key], rel_tol=1e-9, abs_tol=1e-12), (key, a[key], b[key])


def _grid_embeddings(rng: np.random.Generator, n: int, d: int = 3) -> np.ndarray:
    """Integer coordinates from a small range: many exactly equal distances, i.e. ties to break."""
    return rng.integers(0, 3, size=(n, d)).astype(np.float32)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ties", [False, True])
def test_query_gallery_equals_loop(seed: int, ties: bool) -> None:
    rng = np.random.default_rng(seed)
    nq, ng = int(rng.integers(5, 30)), int(rng.integers(5, 40))
    make = (lambda n: _grid_embeddings(rng, n)) if ties else (lambda n: rng.normal(size=(n, 4)).astype(np.float32))
    q, g = make(nq), make(ng)
    qy, gy = rng.integers(0, 6, nq), rng.integers(0, 5, ng)  # class 5 only in queries: skipped queries
    ks = (1, 2, 5)
    got = query_gallery_metrics(q, qy, g, gy, ks=ks)
    _close(got, _loop_query_gallery(q, qy, g, gy, None, None, ks))
    for chunk in (1, 3, 7):
        _close(query_gallery_metrics(q, qy, g, gy, ks=ks, chunk_size=chunk), got)


@pytest.mark.parametrize("seed", range(4))
def test_the_query_itself_is_never_in_its_gallery(seed: int) -> None:
    """Query = gallery (one set): with ids, each query's own sample is removed, ties included."""
    rng = np.random.default_rng(10 + seed)
    x = _grid_embeddings(rng, 30) if seed % 2 else rng.normal(size=(30, 4)).astype(np.float32)
    y = rng.integers(0, 5, 30)
    ids = np.arange(30)
    got = query_gallery_metrics(x, y, x, y, ks=(1, 3), query_ids=ids, gallery_ids=ids, chunk_size=4)
    _close(got, _loop_query_gallery(x, y, x, y, ids, ids, (1, 3)))
    if seed % 2 == 0:  # distinct points: without the exclusion every query finds itself first
        assert got["precision_at_1"] < 1.0
        assert query_gallery_metrics(x, y, x, y, ks=(1,))["precision_at_1"] == 1.0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ties", [False, True])
def test_reid_equals_loop(seed: int, ties: bool) -> None:
    rng = np.random.default_rng(100 + seed)
    nq, ng = int(rng.integers(5, 25)), int(rng.integers(10, 60))
    make = (lambda n: _grid_embeddings(rng, n)) if ties else (lambda n: rng.normal(size=(n, 4)).astype(np.float32))
    q, g = make(nq), make(ng)
    qy = rng.integers(1, 7, nq)  # identity 6 has no gallery image: skipped queries
    gy = rng.integers(-1, 6, ng)  # -1 junk, 0 distractors
    qc, gc = rng.integers(0, 3, nq), rng.integers(0, 3, ng)
    ks = (1, 5, 10)
    got = reid_metrics(q, qy, qc, g, gy, gc, ks=ks)
    _close(got, _loop_reid(q, qy, qc, g, gy, gc, ks))
    for chunk in (1, 4):
        _close(reid_metrics(q, qy, qc, g, gy, gc, ks=ks, chunk_size=chunk), got)


def test_reid_rules_each_matter() -> None:
    """A hand-made case where each rule changes the result: same camera, junk, distractor."""
    q = np.zeros((1, 2), np.float32)
    g = np.array([[0.1, 0], [0.2, 0], [0.3, 0], [0.4, 0], [0.5, 0]], np.float32)
    gy = np.array([7, -1, 0, 7, 7])
    gc = np.array([1, 2, 2, 2, 2])  # the nearest is identity 7 seen by the query's camera 1: removed
    got = reid_metrics(q, [7], [1], g, gy, gc, ks=(1, 2))
    # valid ranking: distractor (0.3), 7 (0.4), 7 (0.5); the junk (0.2) is gone
    assert got["cmc_at_1"] == 0.0 and got["cmc_at_2"] == 1.0
    assert math.isclose(got["reid_map"], (1 / 2 + 2 / 3) / 2)
    other_camera = reid_metrics(q, [7], [3], g, gy, gc, ks=(1,))
    assert other_camera["cmc_at_1"] == 1.0 and math.isclose(
        other_camera["reid_map"], (1 + 2 / 3 + 3 / 4) / 3
    )  # ranks 1, 3, 4


def test_query_without_any_valid_match_is_skipped_and_all_skipped_is_an_error() -> None:
    q, g = np.zeros((2, 2), np.float32), np.ones((3, 2), np.float32)
    got = reid_metrics(q, [1, 2], [0, 0], g, [1, 1, 2], [0, 0, 1], ks=(1,))
    assert got["num_queries"] == 1 and got["skipped_queries"] == 1  # identity 1 only seen by its own camera
    with pytest.raises(BenchError, match="none of the 2 queries"):
        reid_metrics(q, [1, 1], [0, 0], g, [1, 1, 2], [0, 0, 1])
    with pytest.raises(BenchError, match="none of the 2 queries"):
        query_gallery_metrics(q, [5, 6], g, [1, 1, 2])


def test_bad_inputs_are_one_line() -> None:
    q, g = np.zeros((2, 2), np.float32), np.ones((3, 2), np.float32)
    with pytest.raises(BenchError, match="differ in size"):
        query_gallery_metrics(q, [0, 1], np.ones((3, 4)), [0, 1, 1])
    with pytest.raises(BenchError, match="for both query and gallery"):
        query_gallery_metrics(q, [0, 1], g, [0, 1, 1], query_ids=[0, 1])
    with pytest.raises(BenchError, match=r"gallery_cameras must have shape \(3,\)"):
        reid_metrics(q, [0, 1], [0, 0], g, [0, 1, 1], [0, 0])
    with pytest.raises(BenchError, match="unknown query/gallery metric"):
        query_gallery_metrics(q, [0, 1], g, [0, 1, 1], metrics=("nmi",))


def test_counted_and_sorted_first_ranks_agree_under_ties() -> None:
    """Recall@k counts the first correct rank, CMC reads it off a stable sort: one order, so equal ranks."""
    from bench.metrics.query_gallery import first_hit_rank, sorted_ranks

    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (200, 50), generator=g).float()
    scores[torch.rand(200, 50, generator=g) < 0.2] = float("inf")  # excluded items
    positive = (torch.rand(200, 50, generator=g) < 0.2) & torch.isfinite(scores)
    positive[:, 0] |= torch.isfinite(scores[:, 0])
    rows = positive.any(dim=1)
    counted = first_hit_rank(scores[rows], positive[rows])
    assert torch.equal(counted, sorted_ranks(scores[rows], positive[rows])[0])
    assert len(counted) > 150


def test_ranked_prefix_breaks_ties_by_position() -> None:
    scores = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0, 1.0]])
    assert ranked_prefix(scores, 3).tolist() == [[1, 4, 0]]
    assert ranked_prefix(scores, 6).tolist() == [[1, 4, 0, 2, 3, 5]]


def test_bounded_chunks_at_sop_scale_equal_unchunked_on_a_sample() -> None:
    """Default chunking over a gallery of 60,502 keeps blocks at BLOCK_ELEMENTS; a query sample checks the result."""
    from bench.metrics.query_gallery import RANK_COST, _Scorer

    torch.manual_seed(0)
    gallery = torch.randn(60_502, 16)
    labels = torch.randint(0, 11_316, (60_502,))
    scorer = _Scorer(gallery[:64], labels[:64], gallery, labels, None, None, None, None, "euclidean", None, None, None)
    from bench.metrics.retrieval import BLOCK_ELEMENTS

    assert scorer.rows(RANK_COST) * RANK_COST * 60_502 <= BLOCK_ELEMENTS and scorer.rows(RANK_COST) < 60_502
    ids = torch.arange(60_502)
    q = slice(0, 200)
    got = query_gallery_metrics(
        gallery[q], labels[q], gallery, labels, ks=(1, 10), query_ids=ids[q], gallery_ids=ids, chunk_size=50
    )
    whole = query_gallery_metrics(
        gallery[q], labels[q], gallery, labels, ks=(1, 10), query_ids=ids[q], gallery_ids=ids, chunk_size=200
    )
    _close(got, whole)


# --------------------------------------------------------------------------- PML


def _pml(query, qy, reference, ry, ref_includes_query, k):
    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import CustomKNN

    calc = AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r", "mean_average_precision"),
        k=k,
        device=torch.device("cpu"),
        knn_func=CustomKNN(LpDistance(normalize_embeddings=False)),
    )
    return calc.get_accuracy(
        torch.from_numpy(query),
        torch.from_numpy(qy),
        torch.from_numpy(reference),
        torch.from_numpy(ry),
        ref_includes_query=ref_includes_query,
    )


@pytest.mark.parametrize("seed", range(3))
def test_equals_pml_query_vs_reference(seed: int) -> None:
    """Disjoint query and gallery: P@1, R-Precision and MAP@R equal PML's (k = max_bin_count)."""
    rng = np.random.default_rng(200 + seed)
    q, g = rng.normal(size=(40, 8)).astype(np.float32), rng.normal(size=(70, 8)).astype(np.float32)
    qy, gy = rng.integers(0, 8, 40), rng.integers(0, 7, 70)
    pml = _pml(q, qy, g, gy, False, "max_bin_count")
    got = query_gallery_metrics(q, qy, g, gy, ks=(1,), chunk_size=9)
    assert math.isclose(got["precision_at_1"], pml["precision_at_1"], rel_tol=1e-9)
    assert math.isclose(got["recall_at_1"], pml["precision_at_1"], rel_tol=1e-9)
    assert math.isclose(got["r_precision"], pml["r_precision"], rel_tol=1e-9)
    assert math.isclose(got["map_at_r"], pml["mean_average_precision_at_r"], rel_tol=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_equals_pml_when_the_reference_includes_the_queries(seed: int) -> None:
    """Queries are the first rows of the gallery: PML drops each query from its own neighbours, ids do here.
    With one camera per sample and no junk, re-ID mAP is PML's mean_average_precision over the whole ranking
    (k = None: every reference), and CMC rank-1 its precision_at_1."""
    rng = np.random.default_rng(300 + seed)
    g = rng.normal(size=(60, 6)).astype(np.float32)
    gy = rng.integers(1, 9, 60)
    q, qy = g[:25], gy[:25]
    ids = np.arange(60)
    pml = _pml(q, qy, g, gy, True, None)  # k=None: every reference
    got = query_gallery_metrics(q, qy, g, gy, ks=(1,), query_ids=ids[:25], gallery_ids=ids, chunk_size=7)
    assert math.isclose(got["precision_at_1"], pml["precision_at_1"], rel_tol=1e-9)
    assert math.isclose(got["r_precision"], pml["r_precision"], rel_tol=1e-9)
    assert math.isclose(got["map_at_r"], pml["mean_average_precision_at_r"], rel_tol=1e-9)
    reid = reid_metrics(q, qy, ids[:25], g, gy, ids, ks=(1,), query_ids=ids[:25], gallery_ids=ids)
    assert math.isclose(reid["reid_map"], pml["mean_average_precision"], rel_tol=1e-9)
    assert math.isclose(reid["cmc_at_1"], pml["precision_at_1"], rel_tol=1e-9)


# --------------------------------------------------------------------------- protocols end to end

QG_PROTOCOL = """
name: qg
seed: 0
data:
  train: {train}
  test: {test}
  image_size: 8
  validation: {{folds: 2, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [16]}}, embedding_dim: 8, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 3}}
evaluation: {{metrics: {metrics}, primary: precision_at_1, ks: [1, 2]}}
tuning: {{trials: 1, startup_trials: 1}}
final: {{seeds: 1}}
grid:
  losses: [{{name: contrastive}}]
"""


def _protocol(tmp_path, train: str, test: str, metrics: str = "[precision_at_1, recall_at_k]"):
    path = tmp_path / "qg.yaml"
    path.write_text(QG_PROTOCOL.format(train=train, test=test, metrics=metrics))
    return path


def _npz(path, labels, cameras=None, seed: int = 0, noise: bool = False):
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    x = np.clip(40 * (labels[:, None, None] % 6) + rng.integers(0, 30, (len(labels), 8, 8)), 0, 255).astype(np.uint8)
    if noise:  # no class structure: metrics well away from 0 and 1
        x = rng.integers(0, 256, x.shape).astype(np.uint8)
    arrays = {"x": x, "y": labels} if cameras is None else {"x": x, "y": labels, "camera": np.asarray(cameras)}
    np.savez(path, **arrays)
    return path


def _run(tmp_path, path) -> int:
    from bench.cli import main

    return main(
        [
            "run",
            str(path),
            "--results-dir",
            str(tmp_path / "results"),
            "--storage",
            f"sqlite:///{tmp_path}/o.db",
            "--tracking-uri",
            str(tmp_path / "mlflow.db"),
            "--threads",
            "1",
            "--quiet",
        ]
    )


@pytest.mark.parametrize(
    ("test", "problem"),
    [
        ("{query: inshop:query}", "data.test: gallery: missing"),
        ("{query: inshop:query, galery: inshop:gallery}", "data.test: unknown key 'galery'"),
        ("{query: 3, gallery: inshop:gallery}", "data.test: query: expected a string, got 3"),
    ],
)
def test_a_test_mapping_names_its_missing_or_unknown_key(test: str, problem: str) -> None:
    from pathlib import Path

    from bench.protocol import ProtocolError, parse_protocol

    text = (Path(__file__).resolve().parents[2] / "protocols" / "inshop.yaml").read_text()
    assert "  test: {query: inshop:query, gallery: inshop:gallery}\n" in text
    with pytest.raises(ProtocolError) as info:
        parse_protocol(text.replace("{query: inshop:query, gallery: inshop:gallery}", test))
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_existing_protocols_keep_their_hash() -> None:
    """The query/gallery form and the new metrics add nothing to a protocol that does not use them."""
    from bench.protocol import load_protocol

    expected = {
        "fashion-mnist-2d": "4108208131a8",
        "omniglot-full": "f30213de2382",  # 7ed6579b38fc before precision: auto and the learned-metric cells (issues 23, 25)
        "omniglot-quick": "4b7f40195b11",  # 155ed2e8f1bc before evaluation.precision: training
        "omniglot-smoke": "73249472d7ea",
    }
    for name, hash12 in expected.items():
        assert load_protocol(f"protocols/{name}.yaml").hash12 == hash12, name


def test_a_query_gallery_protocol_over_two_folders_runs_to_a_leaderboard(tmp_path, capsys) -> None:
    from _shared import write_folder

    from bench.cli import main

    train = write_folder(tmp_path / "train", ["a0", "a1", "a2", "a3"])
    # the same classes under other folder positions: matched by name, not by the folders' own numbering
    query = write_folder(tmp_path / "query", ["b1", "b2", "b3"], per_class=2, seed=1)  # b3: nothing in the gallery
    gallery = write_folder(tmp_path / "gallery", ["b0", "b1", "b2"], per_class=3, seed=2)
    path = _protocol(tmp_path, f"folder:{train}", f"{{query: folder:{query}, gallery: folder:{gallery}}}")
    assert main(["validate", str(path)]) == 0
    assert (
        "6 samples, inputs 1x8x8; 2 without a match in the gallery, skipped by the metrics" in capsys.readouterr().out
    )
    assert main(["plan", str(path)]) == 0
    assert f"test query folder:{query} vs gallery folder:{gallery}" in capsys.readouterr().out
    assert _run(tmp_path, path) == 0
    capsys.readouterr()
    manifest = json.loads((tmp_path / "results" / "qg" / "manifest.json").read_text())
    assert manifest["test_queries"] == {"total": 6, "with_a_match": 4}
    assert main(["leaderboard", str(tmp_path / "results" / "qg")]) == 0
    board = (tmp_path / "results" / "qg" / "leaderboard.md").read_text()
    assert "contrastive+none" in board and "recall_at_1" in board and "recall_at_2" in board


def test_query_gallery_test_data_is_prepared_with_matching_classes_and_guarded(tmp_path) -> None:
    from _shared import write_folder

    from bench.data.query_gallery import QueryGallery
    from bench.protocol import load_protocol
    from bench.sweep.prepare import TestLeakError, prepare

    train = write_folder(tmp_path / "train", ["a0", "a1", "a2", "a3"])
    query = write_folder(tmp_path / "query", ["b1", "b2"], per_class=2, seed=1)
    gallery = write_folder(tmp_path / "gallery", ["b0", "b1", "b2"], per_class=3, seed=2)
    prepared = prepare(
        load_protocol(_protocol(tmp_path, f"folder:{train}", f"{{query: folder:{query}, gallery: folder:{gallery}}}"))
    )
    test = prepared.test
    assert isinstance(test, QueryGallery) and prepared.test_split.classes == (0, 1)
    names = test.gallery.meta["class_names"]
    assert [names[int(c)] for c in test.gallery.y] == ["b0"] * 3 + ["b1"] * 3 + ["b2"] * 3
    assert test.gallery.y.tolist() == [2] * 3 + [0] * 3 + [1] * 3  # b1, b2 keep the query's ids 0, 1
    other = write_folder(tmp_path / "other", ["c0", "c1"], per_class=2, seed=3)
    with pytest.raises(TestLeakError, match="train data contains 4 test class"):  # gallery classes are test classes
        prepare(
            load_protocol(_protocol(tmp_path, f"folder:{train}", f"{{query: folder:{other}, gallery: folder:{train}}}"))
        )


def test_one_set_as_query_and_gallery_never_retrieves_itself(tmp_path) -> None:
    """query = gallery: the metric sees ids, so P@1 is that of the set retrieving itself (the all-vs-all one)."""
    from bench.evaluation import embed, score_model
    from bench.metrics import retrieval_metrics
    from bench.protocol import load_protocol
    from bench.sweep.floor import initial_trunk
    from bench.sweep.prepare import prepare

    train = _npz(tmp_path / "train.npz", np.repeat(np.arange(4), 4))
    test = tmp_path / "test.npz"  # noise: no class structure, so only a query's own image would find its class
    np.savez(
        test,
        x=np.random.default_rng(3).integers(0, 256, (20, 8, 8)).astype(np.uint8),
        y=np.repeat(np.arange(10, 14), 5),
    )
    protocol = load_protocol(
        _protocol(
            tmp_path,
            f"npz:{train}",
            f"{{query: npz:{test}, gallery: npz:{test}}}",
            "[precision_at_1, map_at_r, recall_at_k]",
        )
    )
    prepared = prepare(protocol)
    model = initial_trunk(protocol, 0, tuple(prepared.train.x.shape[1:]))
    got = score_model(protocol.spec, model, prepared.test, clustering=False)
    emb = embed(model, prepared.test.query.x, normalize=True)
    whole = retrieval_metrics(emb, prepared.test.query.y, ks=(1, 2))
    for key in ("precision_at_1", "map_at_r", "recall_at_1", "recall_at_2"):
        assert math.isclose(got[key], whole[key], rel_tol=1e-9), key
    assert got["precision_at_1"] < 1.0  # an untrained trunk: finding itself would give 1


def test_reid_metrics_run_on_npz_with_cameras(tmp_path, capsys) -> None:
    import pandas as pd

    from bench.cli import main
    from bench.evaluation import embed
    from bench.protocol import load_protocol
    from bench.sweep.floor import initial_trunk
    from bench.sweep.prepare import prepare

    rng = np.random.default_rng(5)
    train = _npz(tmp_path / "train.npz", np.repeat(np.arange(100, 104), 4))
    q_y, g_y = rng.integers(1, 6, 30), rng.integers(-1, 6, 60)
    q_cam, g_cam = rng.integers(0, 3, 30), rng.integers(0, 3, 60)
    query = _npz(tmp_path / "query.npz", q_y, cameras=q_cam, seed=1, noise=True)
    gallery = _npz(tmp_path / "gallery.npz", g_y, cameras=g_cam, seed=2, noise=True)
    path = _protocol(
        tmp_path,
        f"npz:{train}",
        f"{{query: npz:{query}, gallery: npz:{gallery}}}",
        "[precision_at_1, recall_at_k, reid_map, cmc_at_k]",
    )
    assert _run(tmp_path, path) == 0
    capsys.readouterr()
    assert main(["leaderboard", str(tmp_path / "results" / "qg")]) == 0
    board = (tmp_path / "results" / "qg" / "leaderboard.md").read_text()
    for column in ("reid_map", "cmc_at_1", "cmc_at_2", "recall_at_1"):
        assert column in board, column
    # the floor row (the untrained trunk) equals the metrics recomputed here by the loop reference
    floor = pd.read_csv(tmp_path / "results" / "qg" / "floor.csv").iloc[0]
    protocol = load_protocol(path)
    prepared = prepare(protocol)
    model = initial_trunk(protocol, 0, tuple(prepared.train.x.shape[1:]))
    q, g = (embed(model, d.x, normalize=True).numpy() for d in (prepared.test.query, prepared.test.gallery))
    ref = _loop_reid(q, q_y, q_cam, g, g_y, g_cam, (1, 2))
    assert 0 < ref["reid_map"] < 1 and ref["skipped_queries"] < 30
    for key in ("reid_map", "cmc_at_1", "cmc_at_2"):
        assert math.isclose(floor[key], ref[key], rel_tol=1e-6), key
    assert math.isclose(
        floor["recall_at_1"], _loop_query_gallery(q, q_y, g, g_y, None, None, (1,))["recall_at_1"], rel_tol=1e-6
    )


@pytest.mark.parametrize(
    "test, metrics, message",
    [
        ("npz:{test}", "[precision_at_1, reid_map]", "reid_map ranks a query set against a gallery"),
        ("{{query: npz:{test}, gallery: npz:{test}}}", "[precision_at_1, nmi]", "nmi needs one test set"),
        ("{{query: npz:{test}, gallery: npz:{test}}}", "[precision_at_1, cmc_at_k]", "has no per-sample camera"),
        ("{{query: npz:{test}}}", "[precision_at_1]", "data.test"),
    ],
)
def test_what_a_query_gallery_protocol_refuses_is_one_line(tmp_path, capsys, test, metrics, message) -> None:
    from bench.cli import main

    train = _npz(tmp_path / "train.npz", np.repeat(np.arange(4), 4))
    data = _npz(tmp_path / "test.npz", np.repeat(np.arange(10, 13), 3), seed=3)
    path = _protocol(tmp_path, f"npz:{train}", test.format(test=data), metrics)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err


def test_test_classes_with_a_query_and_a_gallery_is_refused() -> None:
    from bench.protocol import ProtocolError, parse_protocol

    text = QG_PROTOCOL.format(
        train="npz:a.npz", test="{query: npz:b.npz, gallery: npz:c.npz}", metrics="[precision_at_1]"
    ).replace("  image_size", "  test_classes: 2\n  image_size")
    with pytest.raises(ProtocolError, match="used whole"):
        parse_protocol(text)
