"""Few-shot classification metrics: random N-way K-shot episodes and Lake et al.'s 20 runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch

from bench.distances import pairwise
from bench.errors import BenchError
from bench.metrics.retrieval import as_embeddings_and_labels


@dataclass(frozen=True)
class OneShotRun:
    """One of Lake et al.'s 20-way one-shot runs, as the data loader hands it over.

    The run is fixed by its authors (which images are training and which are test),
    so it is carried as images rather than indices into a dataset: a model is scored
    on exactly the published comparisons.

    * ``train_x``: ``(20, ...)`` one training image per class of the run.
    * ``test_x``: ``(20, ...)`` the test images, same trailing shape as ``train_x``.
    * ``answer``: LongTensor ``(len(test_x),)``, for each test image the index into
      ``train_x`` of the image of its class.
    * ``name``: where the run came from (e.g. ``"run01"``), for reports only.
    """

    train_x: torch.Tensor
    test_x: torch.Tensor
    answer: torch.Tensor
    name: str = ""

    def __post_init__(self) -> None:
        label = self.name or "one-shot run"
        if self.train_x.ndim < 1 or self.test_x.ndim < 1:
            raise BenchError(f"{label}: train_x and test_x need a leading sample dimension")
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise BenchError(
                f"{label}: train_x {tuple(self.train_x.shape)} and test_x {tuple(self.test_x.shape)} "
                "differ in their per-image shape"
            )
        if self.answer.ndim != 1 or self.answer.shape[0] != self.test_x.shape[0]:
            raise BenchError(
                f"{label}: answer has shape {tuple(self.answer.shape)}, expected ({self.test_x.shape[0]},)"
            )
        if self.answer.dtype != torch.long:
            raise BenchError(f"{label}: answer must be a LongTensor, got {self.answer.dtype}")
        n_train = self.train_x.shape[0]
        if self.answer.numel() and (int(self.answer.min()) < 0 or int(self.answer.max()) >= n_train):
            raise BenchError(f"{label}: answer indices must lie in 0..{n_train - 1}")


FEWSHOT_DISTANCES = ("euclidean", "squared_euclidean", "cosine")


def _check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BenchError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_distance(distance: str) -> str:
    if distance not in FEWSHOT_DISTANCES:
        raise BenchError(f"unknown distance {distance!r}: expected one of {', '.join(FEWSHOT_DISTANCES)}")
    return distance


def episode_accuracy(
    embeddings: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    n_way: int = 20,
    k_shot: int = 1,
    n_query: int = 1,
    episodes: int = 1000,
    seed: int = 0,
    distance: str = "euclidean",
) -> dict[str, float]:
    """Mean accuracy of N-way K-shot nearest-prototype classification over random episodes.

    Each episode draws ``n_way`` classes, and from each ``k_shot`` support and
    ``n_query`` query samples without replacement; a query is assigned the class
    of the nearest prototype (the mean support embedding, so for 1-shot the
    nearest neighbour). With ``"cosine"`` embeddings are L2-normalised before
    prototypes are averaged, as in prototypical networks with cosine distance.
    Ties between prototypes go to the first drawn class (``torch.argmin``).

    Returns ``mean`` (fraction correct over all episodes), ``ci95`` (1.96 standard
    errors of the per-episode accuracies; 0.0 for one episode) and ``episodes``.
    Episodes depend only on ``labels`` and ``seed``, so two models scored on the
    same labels see the same episodes. Classes with fewer than
    ``k_shot + n_query`` samples are skipped; ``BenchError`` if fewer than
    ``n_way`` classes remain, or on malformed input.
    """
    x, y = as_embeddings_and_labels(embeddings, labels)
    n_way = _check_positive("n_way", n_way)
    k_shot = _check_positive("k_shot", k_shot)
    n_query = _check_positive("n_query", n_query)
    episodes = _check_positive("episodes", episodes)
    _check_distance(distance)
    if n_way < 2:
        raise BenchError(f"n_way must be at least 2 for a classification, got {n_way}")
    if distance == "cosine":
        x = torch.nn.functional.normalize(x, dim=1)

    per_class = k_shot + n_query
    y_np = y.numpy()
    order = np.argsort(y_np, kind="stable")
    classes, starts, counts = np.unique(y_np[order], return_index=True, return_counts=True)
    eligible = np.flatnonzero(counts >= per_class)
    if len(eligible) < n_way:
        raise BenchError(
            f"{n_way}-way {k_shot}-shot episodes with {n_query} queries need {n_way} classes of at least "
            f"{per_class} samples; only {len(eligible)} of {len(classes)} classes qualify"
        )

    rng = np.random.default_rng(seed)
    target = torch.arange(n_way).repeat_interleave(n_query)
    accuracies = np.empty(episodes)
    for episode in range(episodes):
        chosen = rng.choice(eligible, size=n_way, replace=False)
        picks = np.stack([order[starts[c] + rng.choice(counts[c], size=per_class, replace=False)] for c in chosen])
        picks_t = torch.from_numpy(picks)
        prototypes = x[picks_t[:, :k_shot]].mean(dim=1)  # (n_way, D)
        queries = x[picks_t[:, k_shot:].reshape(-1)]  # (n_way * n_query, D), class-major
        predicted = pairwise(queries, prototypes, distance).argmin(dim=1)
        accuracies[episode] = (predicted == target).double().mean().item()
    ci95 = 1.96 * accuracies.std(ddof=1) / np.sqrt(episodes) if episodes > 1 else 0.0
    return {"mean": float(accuracies.mean()), "ci95": float(ci95), "episodes": float(episodes)}


class LakeRunsResult(TypedDict):
    """What `lake_runs_accuracy` returns: fractions, the percentages papers print, and the per-run detail."""

    accuracy: float
    accuracy_percent: float
    error_percent: float
    per_run: list[float]
    runs: int


def lake_runs_accuracy(
    embed_fn: Callable[[torch.Tensor], torch.Tensor],
    runs: Sequence[OneShotRun],
    distance: str = "euclidean",
    pair_score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> LakeRunsResult:
    """Accuracy on Lake et al.'s one-shot runs: each test image takes the class of the closest training image.

    ``embed_fn`` maps a batch of images ``(n, ...)`` to embeddings ``(n, D)``
    (call it under ``torch.no_grad()`` and in eval mode as appropriate; this
    function does not touch the model). Each run is scored on its own, as
    published; ties go to the lowest training index (``torch.argmin``).
    ``pair_score(test, train)``, when given, replaces ``distance``: a
    learned metric's ``(n_test, n_train)`` scores, smaller nearer (``g``).

    Returns ``accuracy`` (fraction over all test images of all runs),
    ``accuracy_percent``, ``error_percent`` (the figure Lake et al. report),
    ``per_run`` (list of fractions, in the order given) and ``runs``.
    """
    _check_distance(distance)
    runs = list(runs)
    if not runs:
        raise BenchError("no one-shot runs given")
    per_run: list[float] = []
    correct = total = 0
    with torch.no_grad():
        for run in runs:
            if not isinstance(run, OneShotRun):
                raise BenchError(f"runs must be OneShotRun objects, got {type(run).__name__}")
            label = run.name or "one-shot run"
            train = _embedded(embed_fn(run.train_x), len(run.train_x), f"{label}: embed_fn(train_x)")
            test = _embedded(embed_fn(run.test_x), len(run.test_x), f"{label}: embed_fn(test_x)")
            if train.shape[1] != test.shape[1]:
                raise BenchError(f"{label}: train and test embeddings differ in width")
            scores = pairwise(test, train, distance) if pair_score is None else pair_score(test, train)
            if tuple(scores.shape) != (len(test), len(train)):
                raise BenchError(
                    f"{label}: pair_score returned {tuple(scores.shape)}, expected ({len(test)}, {len(train)})"
                )
            predicted = scores.argmin(dim=1)
            hits = int((predicted == run.answer.to(predicted.device)).sum())
            per_run.append(hits / len(run.answer))
            correct += hits
            total += len(run.answer)
    accuracy = correct / total
    return {
        "accuracy": accuracy,
        "accuracy_percent": 100.0 * accuracy,
        "error_percent": 100.0 * (1.0 - accuracy),
        "per_run": per_run,
        "runs": len(runs),
    }


def _embedded(value: object, n: int, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise BenchError(f"{what} must return a tensor, got {type(value).__name__}")
    if value.ndim != 2 or value.shape[0] != n:
        raise BenchError(f"{what} returned shape {tuple(value.shape)}, expected ({n}, D)")
    value = value.detach().float()
    if not torch.isfinite(value).all():
        raise BenchError(f"{what} returned NaN or inf")
    return value
