"""bench.metrics against PML's AccuracyCalculator, scikit-learn, and hand-computed cases."""

from __future__ import annotations

import zipfile
from io import BytesIO

import numpy as np
import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import CustomKNN
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

from bench.errors import BenchError
from bench.metrics import OneShotRun, clustering_metrics, episode_accuracy, lake_runs_accuracy, retrieval_metrics
from bench.metrics.clustering import kmeans_labels
from bench.metrics.retrieval import nearest_neighbours

PML_KEYS = {"precision_at_1": "precision_at_1", "r_precision": "r_precision", "map_at_r": "mean_average_precision_at_r"}


def clustered(n_classes: int, sizes: list[int] | None, dim: int, spread: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    if sizes is None:
        sizes = torch.randint(1, 12, (n_classes,), generator=g).tolist()
    labels = torch.repeat_interleave(torch.arange(n_classes) * 7 + 3, torch.tensor(sizes))  # non-contiguous ids
    centres = torch.randn(n_classes, dim, generator=g) * spread
    x = centres[torch.repeat_interleave(torch.arange(n_classes), torch.tensor(sizes))] + torch.randn(
        len(labels), dim, generator=g
    )
    perm = torch.randperm(len(labels), generator=g)
    return x[perm], labels[perm]


def pml(x, y, distance):
    knn = CustomKNN(LpDistance(normalize_embeddings=False) if distance == "euclidean" else CosineSimilarity())
    calc = AccuracyCalculator(
        include=tuple(PML_KEYS.values()), k="max_bin_count", knn_func=knn, device=torch.device("cpu")
    )
    return calc.get_accuracy(x, y)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("n_classes,seed", [(40, 0), (150, 1), (300, 2)])
def test_retrieval_equals_pml(n_classes, seed, distance):
    x, y = clustered(n_classes, None, 32, 0.8, seed)  # sizes 1..11: singletons included
    ours = retrieval_metrics(x, y, distance=distance, chunk_size=97)
    theirs = pml(x, y, distance)
    for key, pml_key in PML_KEYS.items():
        assert ours[key] == pytest.approx(theirs[pml_key], abs=1e-6), key
    assert 0.05 < ours["map_at_r"] < 0.95  # neither trivial nor hopeless: ranking errors would show
    assert ours["num_queries"] == sum(int(c) > 1 for c in torch.unique(y, return_counts=True)[1] for _ in range(int(c)))


def test_numpy_input_and_duplicates_within_class():
    x, y = clustered(50, [6] * 50, 16, 0.5, 3)
    order = torch.argsort(y, stable=True)
    x[order[1::6]] = x[order[0::6]]  # exact duplicates within a class: ties that cannot change any metric
    ours = retrieval_metrics(x.numpy(), y.numpy())
    theirs = pml(x, y, "euclidean")
    for key, pml_key in PML_KEYS.items():
        assert ours[key] == pytest.approx(theirs[pml_key], abs=1e-6)


def brute_force(x: np.ndarray, y: np.ndarray, ks) -> dict[str, float]:
    d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    out = {f"recall_at_{k}": [] for k in ks} | {"map_at_r": [], "r_precision": []}
    for i in range(len(y)):
        r = int((y == y[i]).sum()) - 1
        if r == 0:
            continue
        rel = y[np.argsort(d[i], kind="stable")[:-1]] == y[i]
        for k in ks:
            out[f"recall_at_{k}"].append(rel[:k].any())
        out["r_precision"].append(rel[:r].mean())
        out["map_at_r"].append(sum(rel[:j].sum() / j for j in range(1, r + 1) if rel[j - 1]) / r)
    return {k: float(np.mean(v)) for k, v in out.items()}


def test_recall_at_k_and_map_against_brute_force():
    x, y = clustered(30, None, 8, 0.6, 4)
    ks = (1, 3, 5, 10, 500)
    ours = retrieval_metrics(x, y, ks=ks, chunk_size=13)
    for key, value in brute_force(x.double().numpy(), y.numpy(), ks).items():
        assert ours[key] == pytest.approx(value, abs=1e-9), key
    assert ours["recall_at_1"] == ours["precision_at_1"]
    assert ours["recall_at_500"] == 1.0  # k beyond N - 1 sees every other sample


def test_hand_computed_map_at_r_and_r_precision():
    # On a line. Class A at 0, 1, 5; class B at 2, 3.
    # Query 0 (A, R=2): neighbours 1(A) 2(B) 3(B) 5(A) -> RP 1/2, MAP@R (1/1)/2 = 1/2
    # Query 1 (A): 0(A)|2(B) tie... avoided: use 0, 1.1, 5 for A
    x = torch.tensor([[0.0], [1.1], [5.0], [2.0], [3.0]])
    y = torch.tensor([0, 0, 0, 1, 1])
    # q0 (A, R=2): 1.1(A), 2(B) -> RP 1/2, AP@R = (1/1)/2 = 0.5
    # q1.1 (A): 0(A) 0.9, 2(B) 0.9 -> tie avoided? |1.1-0|=1.1, |1.1-2|=0.9: 2(B), 0(A) -> RP 1/2, AP = (1/2)/2 = 0.25
    # q5 (A): 3(B), 2(B) -> 0, 0
    # q2 (B, R=1): 3(B) 1.0 vs 1.1(A) 0.9 -> 1.1(A) first -> RP 0, AP 0
    # q3 (B): 2(B) 1.0, vs 5(A) 2.0 -> RP 1, AP 1
    m = retrieval_metrics(x, y, ks=(1, 2))
    assert m["precision_at_1"] == pytest.approx(2 / 5)
    assert m["r_precision"] == pytest.approx((0.5 + 0.5 + 0 + 0 + 1) / 5)
    assert m["map_at_r"] == pytest.approx((0.5 + 0.25 + 0 + 0 + 1) / 5)
    assert m["recall_at_2"] == pytest.approx(4 / 5)  # q5 has only B in its two nearest


def test_chunked_equals_unchunked():
    x, y = clustered(120, None, 24, 0.5, 5)
    whole = retrieval_metrics(x, y, chunk_size=len(y))
    for chunk in (29, 64, 333):
        assert retrieval_metrics(x, y, chunk_size=chunk) == pytest.approx(whole, abs=1e-6)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize(
    "n,k,group,chunk", [(1003, 19, 32, 250), (997, 5, 16, None), (640, 7, 8, 1), (50, 3, 4, 7), (2000, 11, None, 333)]
)
def test_grouped_top_k_equals_plain_top_k(n, k, group, chunk, distance):
    # Group minima pre-select candidates; padding (N not a multiple of the group), the
    # diagonal and chunk edges must not change the k nearest. Compared by their scores,
    # since exact ties (frequent for cosine in few dimensions) may come in either order.
    x = torch.randn(n, 12, generator=torch.Generator().manual_seed(n + k))
    grouped = nearest_neighbours(x, k, distance, chunk, group)
    plain = nearest_neighbours(x, k, distance, chunk, 1)
    if distance == "cosine":
        xn = torch.nn.functional.normalize(x, dim=1)
        score = -(xn @ xn.T)
    else:
        score = torch.cdist(x, x)
    score.fill_diagonal_(float("inf"))
    expected = torch.topk(score, k, dim=1, largest=False).values
    assert torch.equal(torch.gather(score, 1, grouped), expected)
    assert torch.equal(torch.gather(score, 1, plain), expected)
    assert not (grouped == torch.arange(n)[:, None]).any()  # never its own neighbour
    with pytest.raises(BenchError, match="k must be"):
        nearest_neighbours(x, n, distance)


def test_retrieval_bad_input():
    x, y = clustered(10, [3] * 10, 4, 1.0, 6)
    with pytest.raises(BenchError, match="differ in length"):
        retrieval_metrics(x, y[:-1])
    with pytest.raises(BenchError, match="labels must have shape"):
        retrieval_metrics(x, y[:, None])
    with pytest.raises(BenchError, match="labels must be integers"):
        retrieval_metrics(x, y.float())
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(BenchError, match="NaN"):
        retrieval_metrics(bad, y)
    with pytest.raises(BenchError, match="unknown distance"):
        retrieval_metrics(x, y, distance="manhattan")
    with pytest.raises(BenchError, match="ks"):
        retrieval_metrics(x, y, ks=(0,))
    with pytest.raises(BenchError, match="no class has two samples"):
        retrieval_metrics(x, torch.arange(len(y)))


def test_clustering_equals_sklearn_and_pml():
    x, y = clustered(12, [15] * 12, 8, 1.5, 7)
    ours = clustering_metrics(x, y, seed=3)
    clusters = KMeans(n_clusters=12, n_init=1, random_state=3).fit_predict(x.numpy())
    assert ours["nmi"] == pytest.approx(normalized_mutual_info_score(y.numpy(), clusters), abs=1e-6)
    assert ours["ami"] == pytest.approx(adjusted_mutual_info_score(y.numpy(), clusters), abs=1e-6)
    assert ours["nmi"] > 0.8  # well-separated classes are found
    calc = AccuracyCalculator(
        include=("NMI", "AMI"),
        kmeans_func=lambda emb, k: torch.from_numpy(kmeans_labels(emb, k, seed=3)),
        knn_func=CustomKNN(LpDistance()),
        device=torch.device("cpu"),
    )
    theirs = calc.get_accuracy(x, y)
    assert ours["nmi"] == pytest.approx(theirs["NMI"], abs=1e-6)
    assert ours["ami"] == pytest.approx(theirs["AMI"], abs=1e-6)
    with pytest.raises(BenchError, match="NaN"):
        clustering_metrics(x.masked_fill(x > 3, float("nan")), y)


def test_episode_accuracy_separable_and_random():
    x, y = clustered(30, [6] * 30, 16, 20.0, 8)
    sep = episode_accuracy(x, y, n_way=20, k_shot=1, n_query=2, episodes=50)
    assert sep["mean"] == 1.0 and sep["ci95"] == 0.0
    five = episode_accuracy(x, y, n_way=5, k_shot=5, n_query=1, episodes=20, distance="cosine")
    assert five["mean"] == 1.0
    noise = torch.randn_like(x)
    chance = episode_accuracy(noise, y, n_way=20, episodes=200, seed=1)
    assert 0.0 < chance["mean"] < 0.15 and chance["ci95"] > 0  # chance is 1/20
    assert episode_accuracy(noise, y, n_way=20, episodes=200, seed=1) == chance  # seeded


def test_episode_accuracy_excludes_small_classes():
    x, y = clustered(25, [1] * 5 + [3] * 20, 8, 20.0, 9)
    with pytest.raises(BenchError, match="only 20 of 25 classes"):
        episode_accuracy(x, y, n_way=21, k_shot=1, n_query=2)
    assert episode_accuracy(x, y, n_way=20, k_shot=2, n_query=1, episodes=5)["mean"] == 1.0
    with pytest.raises(BenchError, match="n_way"):
        episode_accuracy(x, y, n_way=0)


def synthetic_runs(n_runs: int, seed: int) -> list[OneShotRun]:
    g = torch.Generator().manual_seed(seed)
    runs = []
    for i in range(n_runs):
        train = torch.rand(20, 1, 6, 6, generator=g)
        answer = torch.randperm(20, generator=g)
        test = (train[answer] + 0.01 * torch.randn(20, 1, 6, 6, generator=g)).clamp(0, 1)
        runs.append(OneShotRun(train, test, answer, f"run{i + 1:02d}"))
    return runs


def test_lake_runs_accuracy_on_synthetic_runs():
    runs = synthetic_runs(3, 10)
    flat = lambda images: images.flatten(1)  # noqa: E731
    result = lake_runs_accuracy(flat, runs)
    assert result["accuracy"] == 1.0 and result["per_run"] == [1.0] * 3 and result["error_percent"] == 0.0
    # Scramble one run's answers: exactly that run drops.
    wrong = OneShotRun(runs[1].train_x, runs[1].test_x, (runs[1].answer + 1) % 20, "wrong")
    result = lake_runs_accuracy(flat, [runs[0], wrong, runs[2]])
    assert result["per_run"] == [1.0, 0.0, 1.0]
    assert result["accuracy_percent"] == pytest.approx(200 / 3)
    with pytest.raises(BenchError, match="expected"):
        lake_runs_accuracy(lambda images: images.flatten(1)[:5], runs)
    with pytest.raises(BenchError, match="answer"):
        OneShotRun(runs[0].train_x, runs[0].test_x, runs[0].answer[:10])


def read_lake_runs(path) -> list[OneShotRun]:
    from PIL import Image

    runs = []
    with zipfile.ZipFile(path) as archive:
        for r in range(1, 21):
            pairs = [
                line.split()
                for line in archive.read(f"run{r:02d}/class_labels.txt").decode().split("\n")
                if line.strip()
            ]
            train_names = sorted({train for _, train in pairs})

            def load(name: str) -> torch.Tensor:
                image = Image.open(BytesIO(archive.read(name))).convert("L")
                return torch.from_numpy(np.array(image, dtype=np.float32) / 255)

            train = torch.stack([load(n) for n in train_names])
            test = torch.stack([load(t) for t, _ in pairs])
            answer = torch.tensor([train_names.index(t) for _, t in pairs])
            runs.append(OneShotRun(train[:, None], test[:, None], answer, f"run{r:02d}"))
    return runs


def test_lake_runs_pixel_distance_is_above_chance(data_root):
    runs = read_lake_runs(data_root / "omniglot" / "all_runs.zip")
    assert len(runs) == 20 and all(run.train_x.shape == (20, 1, 105, 105) for run in runs)
    result = lake_runs_accuracy(lambda images: (1 - images).flatten(1), runs)
    assert len(result["per_run"]) == 20
    assert 0.15 < result["accuracy"] < 0.9  # pixels are a weak but real signal; chance is 0.05


def test_geometry_names_and_unit_rows():
    from bench.metrics import L2_NORMALIZED, RAW, geometry, to_geometry

    assert (geometry(True), geometry(False)) == (L2_NORMALIZED, RAW) == ("l2_normalized", "raw")
    x = torch.tensor([[3.0, 4.0], [0.0, -0.5]])
    assert torch.equal(to_geometry(x, RAW), x)
    assert torch.allclose(to_geometry(x, L2_NORMALIZED), torch.tensor([[0.6, 0.8], [0.0, -1.0]]))
    with pytest.raises(BenchError, match="unknown geometry 'unit'"):
        to_geometry(x, "unit")
    with pytest.raises(BenchError, match="normalize must be true or false"):
        geometry("yes")  # type: ignore[arg-type]
