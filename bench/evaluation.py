"""Embedding and scoring a model: the one place a trunk's outputs become metrics.

`embed` runs a model over data in eval mode (tensors sliced, image files
streamed through the loader); `evaluate` scores it on one labelled set
(query = reference set); `score_model` is a protocol's evaluation of a model
on its test data (a labelled set, or a query set ranked against a gallery),
the one call that final seeds, the budget check and the floor share.
Training (`bench.training`) only trains; its dataset-level miners embed
through `embed` too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from bench.errors import BenchError

if TYPE_CHECKING:
    from bench.protocol import Protocol


def _inputs(x: Any, batch_size: int, device: torch.device) -> Iterator[torch.Tensor]:
    """Batches of `x` on `device`: slices of a tensor, or image files streamed through the loader."""
    if isinstance(x, torch.Tensor):
        yield from (x[i : i + batch_size].to(device) for i in range(0, len(x), batch_size))
        return
    from bench.data.loading import eval_loader, stream

    yield from (xb for xb, _ in stream(eval_loader(x, batch_size, device), device))


def embed(
    model: nn.Module, x: Any, batch_size: int = 512, device: str | torch.device = "cpu", normalize: bool = False
) -> torch.Tensor:
    """Embeddings of ``x`` (a tensor, or `ImageFiles` streamed through the loader) in eval mode without
    gradients, on the CPU; the model's mode is restored.

    Restoring the mode lets dataset-level miners embed the training set in
    the middle of training (they normalise as their own ``normalize`` says,
    hence raw by default). ``normalize=True`` returns them in the protocol's
    L2-normalised geometry (`bench.metrics.geometry`), what every metric and
    saved embedding of a normalising protocol must use.
    """
    from bench.metrics.geometry import geometry, to_geometry

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = [model(xb).float().cpu() for xb in _inputs(x, batch_size, torch.device(device))]
    finally:
        model.train(was_training)
    if not out:
        raise BenchError("nothing to embed: the data is empty")
    return to_geometry(torch.cat(out), geometry(normalize))


def evaluate(
    model: nn.Module,
    data,
    ks: Sequence[int] = (1, 2, 4, 8),
    lake_runs=None,
    clustering: bool = True,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
    seed: int = 0,
    normalize: bool = False,
) -> dict[str, float]:
    """Retrieval metrics on ``data`` (query = reference set), NMI/AMI and Lake's runs when given.

    Keys follow the results tables: ``precision_at_1``, ``r_precision``,
    ``map_at_r``, ``recall_at_{k}``, ``nmi``, ``ami``, ``lake_accuracy``.
    Every metric is computed in one geometry: L2-normalised embeddings when
    ``normalize`` (pass the protocol's ``model.normalize``: the geometry the
    losses trained in), raw trunk outputs otherwise; records name it with
    `bench.metrics.geometry(normalize)`. Values are floats only, so a caller
    can log them as metrics as they are.
    """
    from bench.metrics import clustering_metrics, lake_runs_accuracy, retrieval_metrics

    emb = embed(model, data.x, batch_size, device, normalize)
    metrics = retrieval_metrics(emb, data.y, ks=ks)
    metrics.pop("num_queries", None)
    if clustering:
        metrics.update(clustering_metrics(emb, data.y, seed=seed))
    if lake_runs:
        lake = lake_runs_accuracy(lambda x: embed(model, x, batch_size, device, normalize), lake_runs)
        metrics["lake_accuracy"] = float(lake["accuracy"])
    return metrics


# --------------------------------------------------------------------------- a protocol's evaluation


def clusters_on_test(protocol: Protocol) -> bool:
    """Whether the test evaluation clusters the embeddings (NMI or AMI asked for): k-means is its dearest part."""
    return bool({"nmi", "ami"} & set(protocol.doc["evaluation"]["metrics"]))


def score_model(
    protocol: Protocol,
    model: Any,
    data: Any,
    *,
    clustering: bool,
    lake_runs: Any = None,
    device: str = "cpu",
    seed: int = 0,
) -> dict[str, float]:
    """The protocol's evaluation of a model on ``data``: the one path final seeds and the floor share."""
    from bench.data.query_gallery import QueryGallery

    ev = protocol.doc["evaluation"]
    if isinstance(data, QueryGallery):
        return score_query_gallery(protocol, model, data, device=device)
    return evaluate(
        model,
        data,
        ks=tuple(ev["ks"]),
        lake_runs=lake_runs,
        clustering=clustering,
        device=device,
        seed=seed,
        normalize=protocol.doc["model"]["normalize"],
    )


def score_query_gallery(protocol: Protocol, model: Any, data: Any, *, device: str = "cpu") -> dict[str, float]:
    """The protocol's metrics of a query set ranked against its gallery, in the protocol's geometry.

    Retrieval metrics (P@1, R-Precision, MAP@R, Recall@k) rank the gallery
    less the query itself; ``reid_map`` and ``cmc_at_{k}`` apply the
    Market-1501 rules (`bench.metrics.query_gallery`).
    """
    from bench.metrics.query_gallery import (
        RANKING_METRICS,
        query_gallery_metrics,
        reid_metrics,
    )
    from bench.protocol.schema import REID_METRICS

    ev, normalize = protocol.doc["evaluation"], protocol.doc["model"]["normalize"]
    query = embed(model, data.query.x, device=device, normalize=normalize)
    gallery = query if data.query is data.gallery else embed(model, data.gallery.x, device=device, normalize=normalize)
    ids = {"query_ids": data.query_ids, "gallery_ids": data.gallery_ids}
    out: dict[str, float] = {}
    ranking = [m for m in ev["metrics"] if m in RANKING_METRICS]
    if ranking:
        out.update(
            query_gallery_metrics(
                query, data.query.y, gallery, data.gallery.y, ks=tuple(ev["ks"]), metrics=ranking, **ids
            )
        )
    if set(REID_METRICS) & set(ev["metrics"]):
        q_cam, g_cam = data.cameras()
        out.update(reid_metrics(query, data.query.y, q_cam, gallery, data.gallery.y, g_cam, ks=tuple(ev["ks"]), **ids))
    out.pop("num_queries", None)
    out.pop("skipped_queries", None)
    return out
