"""Embedding and scoring a model: the one place a trunk's outputs become metrics.

`embed` runs a model over data in eval mode (tensors sliced, image files
streamed through the loader); `evaluate` scores it on one labelled set
(query = reference set); `score_model` is a protocol's evaluation of a model
on its test data (a labelled set, or a query set ranked against a gallery),
the one call that final seeds, the budget check and the floor share.
Training (`bench.training`) only trains; its dataset-level miners embed
through `embed` too.

A cell whose loss learns its own metric (the quadruplet loss's learned
``g``: its ``pair_scorer()``, see `pair_scorer_of`) is ranked by that
metric, as its paper and both public re-implementations rank test pairs:
every ranking metric (P@1, R-Precision, MAP@R, Recall@k, query/gallery and
re-ID, Lake's runs) comes from the query x reference matrix of ``g``,
computed in chunks of query rows with bounded memory
(`bench.metrics.query_gallery`; never the N x N matrix). The same metrics
ranked by the embedding distance in the protocol geometry are reported
beside them with the ``embedding_`` prefix, a labelled secondary result.
NMI/AMI cluster the embeddings (k-means needs a vector space) in both cases.
This is the one exception to the protocol's geometry rule (docs/PROTOCOL.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from copy import deepcopy as copy_module
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from bench.devices import DTYPE_NAMES
from bench.errors import BenchError
from bench.spec.schema import REID_METRICS

if TYPE_CHECKING:
    from bench.losses.learned_metric import PairScorer
    from bench.spec import Spec

EMBEDDING_PREFIX = "embedding_"  # the embedding-distance ranking of a learned-metric cell, beside its g ranking


def pair_scorer_of(loss: Any) -> PairScorer | None:
    """The learned metric a loss ranks pairs by (its ``pair_scorer()``), or None for a distance-based loss."""
    make = getattr(loss, "pair_scorer", None)
    return make() if callable(make) else None


def ranked_by_metric(
    metric: PairScorer, embeddings: torch.Tensor, labels: torch.Tensor, ks: Sequence[int], chunk_size: int | None = None
) -> dict[str, float]:
    """P@1, R-Precision, MAP@R and Recall@k of the set retrieving itself, ranked by the learned ``g``.

    ``embeddings`` are the trunk's raw outputs (the metric applies its own
    normalisation). Each query is ranked against every other sample (itself
    removed), ties by position; a query whose class has no other sample is
    left out, as in `bench.metrics.retrieval_metrics`. Chunks of
    ``chunk_size`` queries (default: sized from the metric's per-pair
    working memory, `PairScorer.cost`).
    """
    from bench.metrics.query_gallery import query_gallery_metrics

    x = metric.prepare(embeddings)
    ids = torch.arange(len(labels))
    out = query_gallery_metrics(
        x,
        labels,
        x,
        labels,
        ks=tuple(ks),
        query_ids=ids,
        gallery_ids=ids,
        chunk_size=chunk_size,
        pair_score=metric,
        pair_cost=metric.cost(x.shape[1]),
    )
    out.pop("num_queries", None)
    out.pop("skipped_queries", None)
    return out


class Concatenated(nn.Module):
    """Several models as one embedder: each model's embedding L2-normalised, then side by side.

    The Reality Check's "concatenated" evaluation of its fold models (``final.mode: folds``): four 128-d
    fold models give one 512-d embedding, which the protocol's geometry then normalises as a whole. Each part
    is normalised first so that no fold model's scale outweighs another's. It embeds through every model in
    turn; the models keep their own devices and precision.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        if not models:
            raise BenchError("nothing to concatenate: no model")
        self.parts = nn.ModuleList(models)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.join([m(x) for m in self.parts])

    @staticmethod
    def join(parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """The parts' embeddings of the same rows as one: each normalised, side by side (what `forward` does
        batch by batch, row by row)."""
        return torch.cat([nn.functional.normalize(p.float(), dim=1) for p in parts], dim=1)


# Raw embeddings kept by `kept_embeddings`: the data kept for, and (model, batch size, device, autocast dtype) ->
# (model, embeddings); the data and models are held so that their ids stay theirs while kept
_KEPT: tuple[Any, dict[tuple[int, int, str, Any], tuple[nn.Module, torch.Tensor]]] | None = None

# The dtype `embed` runs a trunk's forward in under autocast (`scoring_precision`); None: as the model is (fp32)
_SCORING_DTYPE: torch.dtype | None = None


@contextmanager
def scoring_precision(spec: Spec) -> Iterator[None]:
    """Within it, `embed` runs the trunk in the precision the protocol scores in (``evaluation.precision``):
    fp32, the default, whatever training ran in; or ``training``, under autocast in the precision the sweep
    trains in (``training.precision`` as resolved: a sweep's ``auto`` is resolved before anything is scored),
    which on a CPU with AMX embeds in bf16 at under half fp32's time. The metrics and learned metrics run in
    fp32 either way; the embeddings come back as fp32. Validation, test, floor, artifacts and kept embeddings
    enter it; training (and its dataset-level miners' embedding) does not."""
    precision = spec.scored_in
    if precision == "auto":
        raise BenchError("evaluation.precision: training needs the sweep's training precision; auto is unresolved")
    with embedding_precision(precision):
        yield


@contextmanager
def embedding_precision(precision: str) -> Iterator[None]:
    """Within it, `embed` runs the trunk under autocast in ``precision`` (a resolved one: fp32, none)."""
    global _SCORING_DTYPE
    outer, _SCORING_DTYPE = _SCORING_DTYPE, None if precision == "fp32" else getattr(torch, DTYPE_NAMES[precision])
    try:
        yield
    finally:
        _SCORING_DTYPE = outer


@contextmanager
def kept_embeddings(data_x: Any, store: dict[Any, Any] | None = None) -> Iterator[None]:
    """Within it, `embed` keeps each model's raw embeddings of ``data_x`` (one data set: the test set, which a
    model embeds once trained, never between training steps), and embeds a `Concatenated` of kept models by
    joining theirs (`Concatenated.join`) instead of running every model over the data again: final.mode folds
    scores each fold model alone, then their concatenation. The values are those of embedding again: the same
    models in eval mode, the same batches, row by row. Other data are embedded as always. Nested for the same
    data, it keeps to the outermost's end: a final seed's fold models, kept while they are scored, are joined
    again for its artifacts and kept model (not keeping them had each embed the test set twice). ``store``: the
    caller's dict to keep them in, which outlives the context (the floor keeps an untrained trunk's for the
    learned-metric cells' own floors of that seed: `bench.sweep.floor`); it must be for these data alone."""
    global _KEPT
    if _KEPT is not None and _KEPT[0] is data_x:
        yield
        return
    outer, _KEPT = _KEPT, (data_x, {} if store is None else store)
    try:
        yield
    finally:
        _KEPT = outer


def _raw_embeddings(model: nn.Module, x: Any, batch_size: int, device: torch.device, fold: bool = True) -> torch.Tensor:
    """The model's raw embeddings of ``x``; ``fold=False`` runs the model as it is (no `_folded` copy)."""
    kept = _KEPT[1] if _KEPT is not None and _KEPT[0] is x else None
    dtype = _SCORING_DTYPE
    key = (id(model), batch_size, str(device), dtype)
    if kept is not None:
        if key in kept:
            return kept[key][1].clone()
        if isinstance(model, Concatenated):
            keys = [(id(m), batch_size, str(device), dtype) for m in model.parts]
            if all(k in kept for k in keys):
                return Concatenated.join([kept[k][1] for k in keys])
    was_training = model.training
    model.eval()
    try:
        runner = _folded(model, x, device) if fold else model

        def forward(xb: torch.Tensor) -> torch.Tensor:
            # autocast around the forward alone: image files decode (here, or in loader workers forked here)
            # outside it, as in fp32 (their resizing would otherwise run in bf16)
            with torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext():
                return runner(xb)

        with torch.no_grad(), _channels_last_on_cpu(runner, x, device):
            out = [forward(xb).float().cpu() for xb in _inputs(x, evaluation_batch(x, batch_size, device), device)]
    finally:
        model.train(was_training)
    if not out:
        raise BenchError("nothing to embed: the data is empty")
    raw = torch.cat(out)
    if kept is not None:
        kept[key] = (model, raw.clone())
    return raw


# On the CPU a model embeds images in batches of at most about this many input values (256 KB), in channels-last
# order, as its rearranged copy (`_folded`): small batches keep a first convolution's output (64 channels of
# 28x28 for 64 Omniglot images: 13 MB) near the core; Conv-4 embeds Omniglot's test set fastest in batches of
# 32-64 (`benchmarks/bench_embed.py`; benchmarks/README.md). None of it changes a value beyond the fold's
# rounding: an embedding's rows do not depend on the batch they were in (bit for bit, tests/test_evaluation.py).
CPU_EVAL_INPUT_VALUES = 1 << 16
CPU_EVAL_MIN_BATCH = 16


def _images(x: Any) -> bool:
    """Whether ``x`` is N x C x H x W images: a 4-d tensor, or image files (`bench.data.images.ImageFiles`,
    decoded batch by batch), which embed as their decoded tensor would: the same batch cap, fold and
    memory order on the CPU (without them BN-Inception embedded files 1.5-2x slower: benchmarks/README.md)."""
    return getattr(x, "ndim", None) == 4


def evaluation_batch(x: Any, batch_size: int, device: torch.device) -> int:
    """The evaluation batch: ``batch_size``, capped on the CPU for images (`CPU_EVAL_INPUT_VALUES`)."""
    if device.type != "cpu" or getattr(x, "ndim", 0) < 3 or len(x) == 0:
        return batch_size
    per_image = max(1, math.prod(x.shape[1:]))
    cap = 1 << max(0, (CPU_EVAL_INPUT_VALUES // per_image).bit_length() - 1)  # a power of two
    return min(batch_size, max(CPU_EVAL_MIN_BATCH, cap))


FOLD_MIN_IMAGES = 256  # below this many images the copy costs more than the folded BatchNorm saves


def _folded(model: nn.Module, x: Any, device: torch.device) -> nn.Module:
    """For many images (4-d tensors) on the CPU, a copy of the eval-mode ``model`` rearranged to compute the
    same function with less work, in two ways, both inside an ``nn.Sequential``:

    * a ``BatchNorm2d`` that directly follows a ``Conv2d`` is folded into that convolution's weights and bias
      (``torch.nn.utils.fusion.fuse_conv_bn_eval``): one pass less over every activation (Conv-4's BatchNorm
      took a third of its convolutions' time over Omniglot's test set); equal up to rounding;
    * a ``ReLU`` directly followed by a ``MaxPool2d`` runs after it: ``max(relu(a), relu(b)) = relu(max(a, b))``
      exactly (both are monotone, and ReLU rounds nothing; a pool's -inf padding becomes 0 either way), so
      the ReLU passes over a quarter of the values of a 2x2 pool, bit for bit the same output.

    Otherwise, or when there is nothing to rearrange, the model itself."""
    image = _images(x) and len(x) >= FOLD_MIN_IMAGES
    if device.type != "cpu" or not image or model.training:
        return model

    def foldable(seq: nn.Sequential, i: int) -> bool:
        conv, norm = seq[i], seq[i + 1]
        return (
            isinstance(conv, nn.Conv2d)
            and type(norm) is nn.BatchNorm2d
            and norm.running_mean is not None
            and norm.running_var is not None
        )

    def swappable(seq: nn.Sequential, i: int) -> bool:
        relu, pool = seq[i], seq[i + 1]
        return type(relu) is nn.ReLU and type(pool) is nn.MaxPool2d and not pool.return_indices

    pairs = [(seq, i) for seq in model.modules() if isinstance(seq, nn.Sequential) for i in range(len(seq) - 1)]
    if not any(foldable(seq, i) or swappable(seq, i) for seq, i in pairs):
        return model

    copy = copy_module(model)
    for seq in [m for m in copy.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):
            conv, norm = seq[i], seq[i + 1]
            if foldable(seq, i):
                assert isinstance(conv, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d)
                seq[i], seq[i + 1] = fuse_conv_bn_eval(conv, norm), nn.Identity()
            elif swappable(seq, i):
                seq[i], seq[i + 1] = seq[i + 1], seq[i]
    return copy.eval()


@contextmanager
def _channels_last_on_cpu(model: nn.Module, x: Any, device: torch.device) -> Iterator[None]:
    """Within it a model of 2-d convolutions embeds images (4-d tensors) on the CPU in channels-last order;
    a model not already in that order is put back as it was (its values are untouched either way)."""
    convs = [m.weight for m in model.modules() if isinstance(m, nn.Conv2d)]
    if device.type != "cpu" or not _images(x) or not convs:
        yield
        return
    already = all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    if not already:
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # (torch's stubs lack it)
    try:
        yield
    finally:
        if not already:
            model.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]


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

    return to_geometry(_raw_embeddings(model, x, batch_size, torch.device(device)), geometry(normalize))


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
    metric: PairScorer | None = None,
) -> dict[str, float]:
    """Retrieval metrics on ``data`` (query = reference set), NMI/AMI and Lake's runs when given.

    Keys follow the results tables: ``precision_at_1``, ``r_precision``,
    ``map_at_r``, ``recall_at_{k}``, ``nmi``, ``ami``, ``lake_accuracy``.
    Every metric is computed in one geometry: L2-normalised embeddings when
    ``normalize`` (pass the protocol's ``model.normalize``: the geometry the
    losses trained in), raw trunk outputs otherwise; records name it with
    `bench.metrics.geometry(normalize)`. Values are floats only, so a caller
    can log them as metrics as they are. With a learned ``metric`` the
    ranking metrics and Lake's runs are ranked by it and the embedding
    ranking's values are added with the ``embedding_`` prefix (module
    docstring).
    """
    from bench.metrics import clustering_metrics, lake_runs_accuracy, retrieval_metrics
    from bench.metrics.geometry import geometry, to_geometry

    raw = embed(model, data.x, batch_size, device)
    emb = to_geometry(raw, geometry(normalize))
    ranking = retrieval_metrics(emb, data.y, ks=ks)
    ranking.pop("num_queries", None)
    lake_raw = _runs_embedder(model, lake_runs, batch_size, torch.device(device)) if lake_runs else None
    if lake_raw is not None:
        lake = lake_runs_accuracy(lambda x: to_geometry(lake_raw(x), geometry(normalize)), lake_runs)
        ranking["lake_accuracy"] = float(lake["accuracy"])
    metrics = ranking
    if metric is not None:
        metrics = ranked_by_metric(metric, raw, data.y, ks)
        if lake_raw is not None:
            by_g = lake_runs_accuracy(
                lambda x: metric.prepare(to_geometry(lake_raw(x), geometry(False))), lake_runs, pair_score=metric
            )
            metrics["lake_accuracy"] = float(by_g["accuracy"])
        metrics.update({EMBEDDING_PREFIX + k: v for k, v in ranking.items()})
    if clustering:
        metrics.update(clustering_metrics(emb, data.y, seed=seed))
    return metrics


def _runs_embedder(
    model: nn.Module, runs: Sequence[Any], batch_size: int, device: torch.device
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The raw embedding of each image set of Lake's one-shot runs (``train_x``, ``test_x``), all of them
    embedded in one pass rather than one call per set: returns a function from such a set to its rows (any
    other tensor is embedded as `embed` would). The values are those of embedding each set alone: the model
    as it is (a set of 20 is too small for `_folded`), and a row does not depend on the batch it is in; one
    pass spares Lake's 40 sets 40 model set-ups and small batches."""
    sets = [t for run in runs for t in (getattr(run, "train_x", None), getattr(run, "test_x", None))]
    images = [t for t in sets if isinstance(t, torch.Tensor) and t.dim() == 4 and len(t)]
    if not images or any(t.shape[1:] != images[0].shape[1:] or t.dtype != images[0].dtype for t in images):
        return lambda x: _raw_embeddings(model, x, batch_size, device)
    raw = _raw_embeddings(model, torch.cat(images), batch_size, device, fold=False)
    rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    start = 0
    for t in images:
        rows[id(t)] = (t, raw[start : start + len(t)])  # the set is held so that its id stays its own
        start += len(t)

    def rows_of(x: torch.Tensor) -> torch.Tensor:
        held = rows.get(id(x))
        return held[1] if held is not None and held[0] is x else _raw_embeddings(model, x, batch_size, device)

    return rows_of


# --------------------------------------------------------------------------- a protocol's evaluation


def clusters_on_test(spec: Spec) -> bool:
    """Whether the test evaluation clusters the embeddings (NMI or AMI asked for): k-means is its dearest part."""
    return bool({"nmi", "ami"} & set(spec.evaluation.metrics))


def score_model(
    spec: Spec,
    model: Any,
    data: Any,
    *,
    clustering: bool,
    lake_runs: Any = None,
    device: str = "cpu",
    seed: int = 0,
    metric: PairScorer | None = None,
) -> dict[str, float]:
    """The protocol's evaluation of a model on ``data``: the one path final seeds and the floor share.
    ``metric``: the cell's learned metric, which then ranks (module docstring)."""
    from bench.data.query_gallery import QueryGallery

    with scoring_precision(spec):
        if isinstance(data, QueryGallery):
            return score_query_gallery(spec, model, data, device=device, metric=metric)
        return evaluate(
            model,
            data,
            ks=spec.evaluation.ks,
            lake_runs=lake_runs,
            clustering=clustering,
            device=device,
            seed=seed,
            normalize=spec.model.normalize,
            metric=metric,
        )


def score_query_gallery(
    spec: Spec, model: Any, data: Any, *, device: str = "cpu", metric: PairScorer | None = None
) -> dict[str, float]:
    """The protocol's metrics of a query set ranked against its gallery, in the protocol's geometry.

    Retrieval metrics (P@1, R-Precision, MAP@R, Recall@k) rank the gallery
    less the query itself; ``reid_map`` and ``cmc_at_{k}`` apply the
    Market-1501 rules (`bench.metrics.query_gallery`). With a learned
    ``metric`` they are ranked by it, the embedding ranking's beside them
    with the ``embedding_`` prefix.
    """
    from bench.metrics.geometry import geometry, to_geometry

    raw_q = embed(model, data.query.x, device=device)
    raw_g = raw_q if data.query is data.gallery else embed(model, data.gallery.x, device=device)
    shape = geometry(spec.model.normalize)
    out = _query_gallery_scores(spec, data, to_geometry(raw_q, shape), to_geometry(raw_g, shape), {})
    if metric is None:
        return out
    pq, pg = metric.prepare(raw_q), metric.prepare(raw_g)
    by_g = _query_gallery_scores(spec, data, pq, pg, {"pair_score": metric, "pair_cost": metric.cost(pq.shape[1])})
    return {**by_g, **{EMBEDDING_PREFIX + k: v for k, v in out.items()}}


def _query_gallery_scores(
    spec: Spec, data: Any, query: torch.Tensor, gallery: torch.Tensor, ranking: dict[str, Any]
) -> dict[str, float]:
    """The protocol's query/gallery and re-ID metrics of these embeddings; ``ranking``: a learned metric's
    ``pair_score`` and ``pair_cost``, or nothing (the Euclidean ranking)."""
    from bench.metrics.query_gallery import (
        RANKING_METRICS,
        query_gallery_metrics,
        reid_metrics,
    )

    ev = spec.evaluation
    ids = {"query_ids": data.query_ids, "gallery_ids": data.gallery_ids}
    out: dict[str, float] = {}
    wanted = [m for m in ev.metrics if m in RANKING_METRICS]
    if wanted:
        out.update(
            query_gallery_metrics(
                query, data.query.y, gallery, data.gallery.y, ks=ev.ks, metrics=wanted, **ids, **ranking
            )
        )
    if set(REID_METRICS) & set(ev.metrics):
        q_cam, g_cam = data.cameras()
        out.update(reid_metrics(query, data.query.y, q_cam, gallery, data.gallery.y, g_cam, ks=ev.ks, **ids, **ranking))
    out.pop("num_queries", None)
    out.pop("skipped_queries", None)
    return out
