"""Clustering quality of an embedding: NMI and AMI of k-means against the true classes.

k is the number of classes in ``labels``, as in PML's ``AccuracyCalculator`` and
the Reality Check protocol. PML clusters with faiss ``Kmeans`` (20 iterations,
one run, faiss's own seeding); dmlbench uses scikit-learn's ``KMeans`` seeded by
``seed`` so a result can be reproduced without faiss. The scores of a given
clustering are identical (both call scikit-learn's ``normalized_mutual_info_score``
and ``adjusted_mutual_info_score`` with their defaults, arithmetic normalisation);
only the clustering itself can differ, so NMI/AMI from PML with faiss differ from
these by k-means' run-to-run variation, not by definition.
"""

from __future__ import annotations

import numpy as np
import torch

from bench.errors import BenchError
from bench.metrics.retrieval import as_embeddings_and_labels


def kmeans_labels(embeddings: torch.Tensor | np.ndarray, n_clusters: int, seed: int = 0, n_init: int = 1) -> np.ndarray:
    """Cluster index per row: scikit-learn k-means++ with a fixed seed, one run (as faiss's default).

    Exposed so that a check can hand the very same clustering to another
    implementation (e.g. as PML's ``kmeans_func``).
    """
    from sklearn.cluster import KMeans  # scikit-learn takes seconds to import: only a run that scores NMI pays

    x = embeddings.detach().cpu().numpy() if isinstance(embeddings, torch.Tensor) else np.asarray(embeddings)
    if not 1 <= n_clusters <= len(x):
        raise BenchError(f"k-means needs 1 <= n_clusters <= {len(x)} samples, got {n_clusters}")
    model = KMeans(n_clusters=n_clusters, n_init=n_init, random_state=seed)
    return model.fit_predict(x.astype(np.float32, copy=False))


def clustering_metrics(
    embeddings: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, seed: int = 0
) -> dict[str, float]:
    """``{"nmi", "ami"}`` of k-means (k = number of classes, seeded) against ``labels``.

    Edge cases: a single class gives one cluster, and both scores are 1.0 by
    scikit-learn's convention (two identical trivial partitions). Duplicate
    embeddings can leave k-means with fewer distinct points than classes;
    scikit-learn then warns and returns fewer non-empty clusters, which lowers
    the scores as it should. Raises ``BenchError`` on malformed input.
    """
    from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

    x, y = as_embeddings_and_labels(embeddings, labels)
    n_classes = int(torch.unique(y).numel())
    clusters = kmeans_labels(x, n_classes, seed=seed)
    truth = y.numpy()
    return {
        "nmi": float(normalized_mutual_info_score(truth, clusters)),
        "ami": float(adjusted_mutual_info_score(truth, clusters)),
    }
