"""How long a plan takes: per-trunk step costs, dataset sizes, and the estimate of one cell.

`dmlbench plan` times the protocol's trunk on this machine (`bench.plan.measure`:
a training step at the protocol's batch, image size and precision, and an
embedded image) and the estimate uses that (`measured_cost`). Without it
(``--no-measure``, or a CUDA protocol on a machine without CUDA) the estimate
falls back on the per-trunk costs in `TRUNK_COSTS`, measured on this
project's reference machine (2 CPU cores), or `GPU_TRUNK_COSTS` for a
protocol that trains on CUDA (then it is GPU-hours), scaled by batch size
and pixels: one machine's figures, 2-3x off on another. A step time given by
hand (`--step-ms`) replaces both. It is an estimate to decide whether a
sweep fits an afternoon or a GPU allocation, not a promise.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bench import registry
from bench.plan.types import Budget, Cell, Estimate, TrunkCost
from bench.protocol import Protocol

if TYPE_CHECKING:
    from bench.plan.measure import Measured

# One place for the machine's speed. conv4 and mlp are measured here (Conv-4 at
# 28x28, batch 128: 75-135 ms a step; MLP on 784-d: 2-4 ms; embedding Omniglot's
# 13,180 evaluation images with Conv-4: about 8 s). The others are scaled by
# their multiply-adds relative to Conv-4 and marked as not measured.
TRUNK_COSTS: dict[str, TrunkCost] = {
    "conv4": TrunkCost((0.075, 0.135), 8.0 / 13180),
    "mlp": TrunkCost((0.002, 0.004), 0.1 / 13180),
    "lecun2006": TrunkCost((0.010, 0.025), 1.5 / 13180, measured=False),
    "omniglot_encoder": TrunkCost((0.300, 0.600), 30.0 / 13180, measured=False),
}
UNKNOWN_TRUNK = TrunkCost((0.075, 0.135), 8.0 / 13180, measured=False)
# ResNets at 224x224, batch 32, bf16 + channels-last, one thread. ResNet-50 measured here by
# benchmarks/bench_trunk_step.py (3.2 s of CPU a step at 227x227, embedding ~0.09 s an image in fp32,
# on a loaded machine: the range allows for it); ResNet-18 scaled by multiply-adds (1.8 / 4.1 G).
TRUNK_COSTS.update(
    {
        "resnet18": TrunkCost(
            (1.3, 2.0),
            0.04,
            ref_batch=32,
            ref_pixels=224 * 224,
            measured=False,
            source="not measured: scaled from ResNet-50",
        ),
        "resnet50": TrunkCost((3.0, 4.5), 0.09, ref_batch=32, ref_pixels=224 * 224),
        # BN-Inception: ResNet-50's figures times 0.41, the ratio of their CPU time a training step (fp32, batch 32,
        # 227x227, one thread) by benchmarks/bench_trunk_step.py (a ratio holds on a loaded machine where absolute
        # times do not; benchmarks/README.md); 2.0 / 4.1 G multiply-adds say 0.49
        "bninception": TrunkCost(
            (1.2, 1.85),
            0.037,
            ref_batch=32,
            ref_pixels=224 * 224,
            measured=False,
            source="not measured: ResNet-50's step x 0.41, their CPU-time ratio measured here",
        ),
    }
)
# On one GPU. Conv-4 measured on an H100 (benchmarks/bench_step_time.py: 8.0-8.5 ms at batch 128,
# 13,180 images embedded in 0.04 s). The ResNets are not measured on a GPU here (a guess until
# someone measures them): eager PyTorch trains a ResNet-50 at about 1,000-1,600 images/s in bf16 on
# one A100/H100-class GPU, i.e. 20-32 ms for a batch of 32 at 224x224; pass a measured
# `--step-ms` for a real figure.
_GPU_GUESS = "not measured: published eager-PyTorch throughput; pass --step-ms from benchmarks/bench_trunk_step.py"
GPU_TRUNK_COSTS: dict[str, TrunkCost] = {
    "conv4": TrunkCost((0.0080, 0.0085), 0.04 / 13180, source="measured on an H100"),
    "resnet18": TrunkCost(
        (0.008, 0.014), 0.0002, ref_batch=32, ref_pixels=224 * 224, measured=False, source=_GPU_GUESS
    ),
    "resnet50": TrunkCost(
        (0.020, 0.032), 0.0005, ref_batch=32, ref_pixels=224 * 224, measured=False, source=_GPU_GUESS
    ),
    # BN-Inception: half of ResNet-50's multiply-adds, but many small convolutions (kernel launches): the
    # ResNet-50 guess's lower end to its upper, rather than half of it
    "bninception": TrunkCost(
        (0.012, 0.032), 0.0003, ref_batch=32, ref_pixels=224 * 224, measured=False, source=_GPU_GUESS
    ),
}
UNKNOWN_GPU_TRUNK = GPU_TRUNK_COSTS["resnet50"]

# Images per class and classes per named dataset: eval cost without loading data.
DATASET_SIZES: dict[str, tuple[int, float]] = {  # spec -> (classes, images per class)
    "omniglot:background": (964, 20),
    "omniglot:evaluation": (659, 20),
    "fashion-mnist:train": (10, 6000),
    "fashion-mnist:test": (10, 1000),
    # the published splits (METHODS.md): images / classes
    "cub200:train": (100, 58.64),
    "cub200:test": (100, 59.24),
    "cars196:train": (98, 8054 / 98),
    "cars196:test": (98, 8131 / 98),
    "sop:train": (11318, 59551 / 11318),
    "sop:test": (11316, 60502 / 11316),
    "inshop:train": (3997, 25882 / 3997),
    "inshop:query": (3985, 14218 / 3985),
    "inshop:gallery": (3985, 12612 / 3985),
    "market1501:train": (751, 12936 / 751),
    "market1501:query": (750, 3368 / 750),
    "market1501:gallery": (752, 19732 / 752),  # 750 test identities, distractors (0) and junk (-1)
}
OVERHEAD_S_PER_RUN = 0.4  # MLflow and Optuna records per training run (SQLite)
# Once a sweep, whatever its cells: starting Python and importing torch, Optuna and MLflow (3-6 s here),
# the preflight reading the data (4 s for Omniglot), creating the MLflow and Optuna databases (3-7 s), and at
# the end the floor and the tables: about 20 s on omniglot-smoke (benchmarks/README.md). The floor's
# evaluations are added by `sweep_overhead_s`.
SWEEP_FIXED_S = 20.0
STEP_FIXED_S = 0.005  # per step whatever the batch: optimiser, loss and miner calls (measured: small batches)
# Metrics on N embeddings: retrieval is O(N^2), the scores in blocks and the top K ranked: 21.9 s of CPU
# (one thread, 128-d) at SOP's N = 60,502 by benchmarks/bench_query_gallery.py --sets sop, 6.0e-9 s a
# pair, the same as its bare matmul + top-k; k-means for NMI/AMI is O(N x classes x iterations), 85 s at
# N = 13,180 and 659 classes, 0.5 s at 4,800 and 240.
RETRIEVAL_S_PER_PAIR = 6.0e-9
KMEANS_S_PER_POINT_CLUSTER = 1.0e-5
# A learned-metric cell ranks by g, its metric network on (query, reference) pairs: by the compiled pair
# kernel (`bench.losses.pair_kernel`) about 2.6e-8 (`concat`) and 4.4e-8 (`difference_product`) s a scored pair on
# one thread at 64-d with the 3 x 10 network, ranking included, on an AVX-512 machine; by the torch tiles (no C
# compiler) 1.1-1.5e-7 (`benchmarks/bench_learned_ranking.py --kernel`, benchmarks/README.md). The kernel's figure
# is rounded up for machines with narrower vectors. A set ranked against itself scores one triangle while it is
# small enough (`learned_pairs`). Validation sets are ranked the same way.
LEARNED_S_PER_PAIR = 1.5e-7
LEARNED_S_PER_PAIR_KERNEL = 6.0e-8


def learned_s_per_pair() -> float:
    """Seconds a scored pair of g here: the kernel's figure where it can be built (a C compiler on the path, not
    switched off), else the torch tiles'. Decided without building it, so `plan` stays quick."""
    off = os.environ.get("DMLBENCH_PAIR_KERNEL", "1") == "0"
    return LEARNED_S_PER_PAIR if off or shutil.which(os.environ.get("CC", "cc")) is None else LEARNED_S_PER_PAIR_KERNEL


LAKE_IMAGES = 20 * 40  # Lake's 20 one-shot runs: 20 test + 20 training images each


def learned_pairs(images: float) -> float:
    """Pairs g scores to rank a set of ``images`` against itself: one triangle where what that keeps fits
    `bench.metrics.query_gallery.MIRROR_ELEMENTS`, else every pair."""
    from bench.metrics.query_gallery import MIRROR_ELEMENTS  # torch: not at `validate`'s option parsing

    return images * (images + 1) / 2 if images * images / 4 <= MIRROR_ELEMENTS else images**2


def dataset_size(spec: Any, classes: Any) -> tuple[float, float]:
    """(classes, images) of a dataset side, (0, 0) for a dataset of unknown size.

    A query/gallery test side counts the gallery's images (what each query is searched in) and
    the query's classes."""
    if isinstance(spec, dict):
        n_classes, _ = dataset_size(spec["query"], classes)
        _, gallery = dataset_size(spec["gallery"], None)
        return n_classes, gallery
    if spec not in DATASET_SIZES:
        return 0, 0
    n_classes, per_class = DATASET_SIZES[spec]
    if isinstance(classes, int):
        n_classes = classes
    elif isinstance(classes, list):
        n_classes = len(classes)
    return n_classes, n_classes * per_class


def sized_test(test: Any) -> str:
    """The spec whose size stands for the test side's cost: a query/gallery side's gallery (every query ranks it)."""
    return test["gallery"] if isinstance(test, dict) else test


def _metrics_s(images: float, classes: float, clustering: bool) -> float:
    return RETRIEVAL_S_PER_PAIR * images**2 + (KMEANS_S_PER_POINT_CLUSTER * images * classes if clustering else 0)


def trunk_cost(protocol: Protocol, step_s: float | None = None) -> TrunkCost:
    """The cost table entry of the protocol's trunk on its device, or one made of a measured step time."""
    spec = protocol.spec
    trunk, gpu = spec.model.trunk, str(spec.training.device).startswith("cuda")
    table = (GPU_TRUNK_COSTS, UNKNOWN_GPU_TRUNK) if gpu else (TRUNK_COSTS, UNKNOWN_TRUNK)
    cost = table[0].get(trunk, table[1])
    if step_s is None:
        return cost
    h, w = spec.data.hw
    batch = spec.training.batch_size
    embed_s = cost.embed_s * (h * w) / cost.ref_pixels
    return TrunkCost((step_s, step_s), embed_s, ref_batch=batch, ref_pixels=h * w, ref_hw=(h, w), source="--step-ms")


def measured_cost(protocol: Protocol, m: Measured) -> TrunkCost:
    """A cost entry made of the trunk timed here (`bench.plan.measure.measure_trunk`), at the protocol's
    batch and image size: no scaling, no range."""
    spec = protocol.spec
    h, w = spec.data.hw
    batch = spec.training.batch_size
    where = "on this machine" if m.device == "cpu" else f"on {m.device} here"
    return TrunkCost(
        (m.step_s, m.step_s),
        m.embed_s,
        ref_batch=batch,
        ref_pixels=h * w,
        ref_hw=(h, w),
        source=f"measured {where}: median of {m.steps} steps, {m.threads} thread(s)",
        threads=m.threads,
        slowdown=m.slowdown,
    )


def bounded_by_loader(
    protocol: Protocol, cost: TrunkCost, images_per_s: float | None, source: str = ""
) -> tuple[TrunkCost, str]:
    """The cost with every training step paying a batch's loading time at ``images_per_s`` (what the
    loader delivers: ``--loader-rate``, ``benchmarks/bench_loader.py``'s loader or cache row, or
    `bench.plan.measure.measure_loader`'s timing here, which ``source`` then names), and a line saying how.

    On an accelerator the loader and the trunk overlap (workers decode the next batches during a step), so
    a step takes the longer of the two, not their sum. On the CPU the loader's workers decode on the cores
    the trunk computes on, so a step takes both, and every image an evaluation embeds is decoded too (the
    field-size rehearsals: benchmarks/README.md)."""
    if images_per_s is None:
        return cost, ""
    spec = protocol.spec
    h, w = spec.data.hw
    batch = spec.training.batch_size
    scale = (batch / cost.ref_batch) * (h * w / cost.ref_pixels)
    load_s = batch / images_per_s
    low, high = (s * scale for s in cost.step_s)
    floor = load_s / scale  # at the cost's reference batch and size, where step_s is kept
    rate = source or f"{images_per_s:g} images/s"
    given = "the loader timed here" if source else "--loader-rate"
    step = f"{low * 1000:.3g}" + ("" if low == high else f"-{high * 1000:.3g}")
    if str(spec.training.device).startswith("cpu"):
        bounded = replace(
            cost,
            step_s=(cost.step_s[0] + floor, cost.step_s[1] + floor),
            embed_s=cost.embed_s + cost.ref_pixels / (h * w) / images_per_s,  # embed_s scales with the pixels
            source=f"{cost.source}; plus {load_s * 1000:.3g} ms a step to load a batch ({given})".lstrip("; "),
        )
        note = (
            f"loader: {rate} feeds a batch of {batch} in {load_s * 1000:.3g} ms on the cores the trunk's "
            f"{step} ms step runs on: on the CPU a step takes both, and each evaluated image its decoding"
        )
        return bounded, note
    bound = "the loader" if load_s >= high else "the trunk" if load_s <= low else "the loader or the trunk"
    bounded = replace(
        cost,
        step_s=(max(cost.step_s[0], floor), max(cost.step_s[1], floor)),
        source=f"{cost.source}; at least {load_s * 1000:.3g} ms a step to load a batch ({given})".lstrip("; "),
    )
    note = (
        f"loader: {rate} feeds a batch of {batch} in {load_s * 1000:.3g} ms, the trunk's step "
        f"takes {step} ms: {bound} bounds the training steps"
    )
    return bounded, note


def estimate_cell(
    protocol: Protocol,
    cell: Cell,
    budget: Budget,
    cost: TrunkCost | None = None,
    check_multiple: float = 0,
    method_s: float = 0.0,
) -> Estimate:
    """Seconds for one cell: training steps, evaluations (validation, pruning checks, test) and records.

    ``check_multiple`` > 0 adds a budget check: the finals retrained at that multiple of the budget
    with the same seeds, and evaluated again. ``method_s``: the cell's loss and miner, timed, a step."""
    spec = protocol.spec
    cost = cost or trunk_cost(protocol)
    h, w = spec.data.hw
    pixels = h * w  # an MLP's first layer and a conv trunk both scale with the pixel count
    scale = (budget.batch_size / cost.ref_batch) * (pixels / cost.ref_pixels)
    embed_one = cost.embed_s * pixels / cost.ref_pixels
    _, train_images = dataset_size(spec.data.train, spec.data.train_classes)
    folds = spec.data.validation.folds
    val_images = train_images / folds
    per_step_extra = _miner_step_extra(cell, train_images * (folds - 1) / folds, embed_one) + method_s
    slow = cost.slowdown  # the figures not timed here run on the same busy machine as the timed step
    pruner = spec.tuning.pruner
    stopping = spec.training.early_stopping
    every = stopping.check_every if stopping else (None if pruner.type == "none" else pruner.check_every)
    checks = 0 if every is None else budget.iterations // every
    one_val = val_images * embed_one + slow * _metrics_s(val_images, 0, clustering=False)
    test_eval = _test_eval_s(protocol, cost)
    learned = bool(cell.loss_params.get("learned_metric"))  # ranked by g on validation and test (`learned_s_per_pair`)
    if learned:
        _, test_images = dataset_size(sized_test(spec.data.test), spec.data.test_classes)
        per_pair = learned_s_per_pair()
        one_val += slow * per_pair * learned_pairs(val_images)
        test_eval += slow * per_pair * learned_pairs(test_images)
    tuning_eval = budget.tuning_runs * (1 + checks) * one_val
    # a final seed scores its model; under final.mode folds each fold model (early-stopped on its fold's
    # validation classes) alone, then their concatenation: on a one-set test side joined from the fold
    # models' kept embeddings (`bench.evaluation.kept_embeddings`), so only its metrics; a query/gallery
    # test side is embedded through every fold model again
    final_runs = budget.final_count * budget.final_runs
    joined = test_eval if isinstance(protocol.spec.data.test_spec, dict) else _test_metrics_s(protocol, cost)
    final_eval = budget.final_count * (test_eval if budget.final_runs == 1 else budget.final_runs * test_eval + joined)
    if budget.final_runs > 1 and stopping:
        final_eval += final_runs * checks * one_val
    fixed = (
        tuning_eval
        + final_eval
        + (budget.tuning_runs + final_runs + budget.trial_count + 1) * OVERHEAD_S_PER_RUN * slow
    )
    if learned:
        fixed += budget.seeds * test_eval  # the cell's own floor: its untrained trunk and metric, ranked by g
    steps = budget.total_iterations + check_multiple * budget.final_iterations
    if check_multiple:
        fixed += final_eval + budget.final_count * OVERHEAD_S_PER_RUN * slow
    low = steps * (cost.step_s[0] * scale + STEP_FIXED_S * slow + per_step_extra) + fixed
    high = steps * (cost.step_s[1] * scale + STEP_FIXED_S * slow + per_step_extra) + fixed
    return Estimate(low, high, cost.measured)


def sweep_overhead_s(protocol: Protocol, budget: Budget, cost: TrunkCost | None = None) -> float:
    """Seconds a sweep spends outside its cells: start-up, reading the data, opening the stores
    (`SWEEP_FIXED_S`), and the floor (the untrained trunk scored like a final seed, once per seed); the
    figures not timed here stretched by the slowdown seen while timing (`TrunkCost.slowdown`)."""
    cost = cost or trunk_cost(protocol)
    return SWEEP_FIXED_S * cost.slowdown + budget.seeds * (
        _test_eval_s(protocol, cost) + OVERHEAD_S_PER_RUN * cost.slowdown
    )


def _test_eval_s(protocol: Protocol, cost: TrunkCost) -> float:
    """One evaluation on the test side: embedding it (and Lake's runs) and its metrics."""
    spec = protocol.spec
    h, w = spec.data.hw
    embed_one = cost.embed_s * h * w / cost.ref_pixels
    test_classes, test_images = dataset_size(sized_test(spec.data.test), spec.data.test_classes)
    metrics = spec.evaluation.metrics
    lake = LAKE_IMAGES if "lake_accuracy" in metrics else 0
    return (test_images + lake) * embed_one + _test_metrics_s(protocol, cost)


def _test_metrics_s(protocol: Protocol, cost: TrunkCost) -> float:
    """The metrics of one evaluation on the test side, without embedding it."""
    data, metrics = protocol.spec.data, protocol.spec.evaluation.metrics
    test_classes, test_images = dataset_size(sized_test(data.test_spec), data.test_classes)
    return cost.slowdown * _metrics_s(test_images, test_classes, "nmi" in metrics or "ami" in metrics)


def _miner_step_extra(cell: Cell, train_images: float, embed_one: float) -> float:
    """Dataset-level miners embed training samples without gradient (`Entry.embeds_per_step`)."""
    if cell.miner is None or not cell.dataset_level:
        return 0.0
    entry = registry.get("miner", cell.miner)
    if entry.embeds_per_step is None:
        return 0.0
    return entry.embeds_per_step(entry.settings(cell.miner_params), train_images) * embed_one
