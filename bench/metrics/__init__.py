"""Evaluation metrics (public API): retrieval (a set against itself, or queries against a gallery, re-ID),
clustering, few-shot, and the geometry they are computed in.

All are pure functions of embeddings and labels (tensors or arrays); bad input
raises ``bench.errors.BenchError``. See each module for definitions, edge cases
and how they match PML's ``AccuracyCalculator`` and scikit-learn.
"""

from bench.metrics.clustering import clustering_metrics
from bench.metrics.fewshot import OneShotRun, episode_accuracy, lake_runs_accuracy
from bench.metrics.geometry import GEOMETRIES, L2_NORMALIZED, RAW, geometry, to_geometry
from bench.metrics.query_gallery import query_gallery_metrics, reid_metrics
from bench.metrics.retrieval import retrieval_metrics

__all__ = [
    "GEOMETRIES",
    "L2_NORMALIZED",
    "OneShotRun",
    "RAW",
    "clustering_metrics",
    "episode_accuracy",
    "geometry",
    "lake_runs_accuracy",
    "query_gallery_metrics",
    "reid_metrics",
    "retrieval_metrics",
    "to_geometry",
]
