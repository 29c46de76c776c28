"""Evaluation metrics (public API): retrieval, clustering, few-shot."""

from bench.metrics.fewshot import OneShotRun

__all__ = ["OneShotRun"]
