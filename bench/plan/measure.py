"""The protocol's trunk timed on this machine: a training step, and an embedded image.

The cost table (`bench.plan.cost.TRUNK_COSTS`) holds one machine's figures
at one batch and image size, scaled to the protocol's; that made `plan`
2.2-3.3x optimistic on a machine other than the one it was measured on, and
it knows nothing of the threads a run is given. `measure_trunk` therefore
builds the protocol's trunk (`bench.trunks.trunk_from`, random weights: a
pretrained file changes no time) and times, on random inputs of the
protocol's shape (P x K images, its image size and channels), what training
does a step: the forward in the protocol's precision and memory format, a
backward, an optimiser step. One or two warm-up steps, then the median of a
few, their number capped by ``budget_s``. It also times the no-gradient
embedding evaluation runs (`bench.evaluation.embed`, its batches and, on the CPU, its folded copy), per
image over up to 1,024 images (fewer where a big trunk's images do not fit the budget).

`measure_loader` times the protocol's training loader where the images are
files read a step: a step takes at least a batch's loading time
(`bench.plan.cost.bounded_by_loader`).

What is not timed here: the loss and miner (a small fixed term a step, or
`bench.plan.method_cost` with ``--time-methods``) and the metrics
(`bench.plan.cost`'s per-pair and k-means figures).
"""

from __future__ import annotations

import inspect
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bench.devices import device_problem
from bench.errors import BenchError
from bench.evaluation import embed, embedding_precision, evaluation_batch
from bench.protocol import Protocol
from bench.spec import DataSpec, ModelSpec, TrainingSpec
from bench.training import DTYPES, OPTIMIZERS, TrainConfig, use_channels_last
from bench.trunks import trunk_from

__all__ = [
    "EMBED_BATCH",
    "SLOW_FACTOR",
    "VARIANTS",
    "Measured",
    "PrecisionChoice",
    "candidate_variants",
    "channels_of",
    "choose_precision",
    "measure_loader",
    "measure_trunk",
    "protocol_variant",
    "slow_line",
    "slow_precision",
    "time_variants",
    "unavailable",
    "variant_name",
]

EMBED_BATCH: int = inspect.signature(embed).parameters["batch_size"].default  # what evaluation embeds with
GREY_DATASETS = ("omniglot", "fashion-mnist", "mnist")  # named datasets stored with one channel
MAX_STEPS = 7  # timed steps at most; fewer when a step is slow (the budget caps them)


@dataclass(frozen=True)
class Measured:
    """A training step's median seconds and an embedded image's seconds, as timed here, and how."""

    step_s: float
    steps: int  # timed steps (after the warm-up) the median is of
    embed_s: float  # per image, no gradient, eval mode
    embed_batch: int  # the batch it was timed at
    threads: int
    device: str
    slowdown: float = 1.0  # wall time x threads / CPU time of the timed steps, at least 1 (CPU only)


def channels_of(data: DataSpec) -> int:
    """The channels the trunk sees: ``data.channels``, else 1 for the grey named datasets, else 3 (RGB)."""
    channels = data.channels
    if channels is not None:
        return int(channels)
    name = str(data.train).split(":", 1)[0]
    return 1 if name in GREY_DATASETS else 3


def unavailable(protocol: Protocol) -> str | None:
    """Why the protocol's device cannot be timed on here (None: it can)."""
    return device_problem(str(protocol.spec.training.device))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _optimizer(name: str, params: Any, lr: float) -> torch.optim.Optimizer:
    """The protocol's optimiser (the same update cost as training's `bench.training` builds)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def measure_trunk(
    protocol: Protocol,
    budget_s: float = 3.0,
    threads: int | None = None,
    embed_batch: int = EMBED_BATCH,
    train_steps: bool = True,
) -> Measured:
    """Time the protocol's trunk here: training steps for up to about ``budget_s`` seconds, then embedding
    for up to about half that (each at least once after a warm-up). ``threads``: torch CPU threads while
    timing (None: as set now, what `run` uses without ``--threads``); ``embed_batch``: the batch evaluation
    embeds in (`EMBED_BATCH`, or the whole test set when it is smaller). ``train_steps=False`` times the
    embedding only (``step_s`` NaN, ``steps`` 0, the slowdown that of the embedding): for an estimate of
    evaluation alone, which trains nothing, where a large trunk's step costs minutes on a CPU core."""
    spec = protocol.spec
    model, training = spec.model, spec.training
    assert training.optimizer in OPTIMIZERS
    device = torch.device(str(training.device))
    h, w = spec.data.hw
    in_shape = (channels_of(spec.data), h, w)
    batch = training.batch_size
    config = TrainConfig(precision=training.precision, channels_last=training.channels_last, device=str(device))
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        used = torch.get_num_threads()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # every RNG left as it was
            torch.manual_seed(0)
            cpu_before, wall_before = time.process_time(), time.perf_counter()
            if train_steps:
                step_s, steps, trunk = _time_steps(model, training, config, in_shape, batch, device, budget_s)
            else:
                step_s, steps = math.nan, 0
                trunk = _stepper(model, training, config, in_shape, batch, device).trunk  # type: ignore[attr-defined]
            cpu, wall = time.process_time() - cpu_before, time.perf_counter() - wall_before
            embed_s, timed_batch = _time_embedding(  # in the precision every score embeds in
                trunk, in_shape, device, budget_s / 2, max(1, min(embed_batch, EMBED_BATCH)), spec.scored_in
            )
            if not train_steps:  # the slowdown of what was timed
                cpu, wall = time.process_time() - cpu_before, time.perf_counter() - wall_before
    finally:
        torch.set_num_threads(before)
    slowdown = max(1.0, wall * used / cpu) if device.type == "cpu" and cpu > 0 else 1.0
    return Measured(step_s, steps, embed_s, timed_batch, used, str(device), slowdown)


def _time_steps(
    model: ModelSpec,
    training: TrainingSpec,
    config: TrainConfig,
    in_shape: tuple[int, ...],
    batch: int,
    device: torch.device,
    budget_s: float,
) -> tuple[float, int, torch.nn.Module]:
    step = _stepper(model, training, config, in_shape, batch, device)
    began = time.perf_counter()
    step()  # warm-up: allocations, kernel selection, lazy initialisation
    if time.perf_counter() - began < budget_s / 4:
        step()  # a second one where steps are cheap: the first is often far slower than the rest
    times: list[float] = []
    while not times or (len(times) < MAX_STEPS and time.perf_counter() - began < budget_s):
        times.append(step())
    return statistics.median(times), len(times), step.trunk  # type: ignore[attr-defined]


def _stepper(
    model: ModelSpec,
    training: TrainingSpec,
    config: TrainConfig,
    in_shape: tuple[int, ...],
    batch: int,
    device: torch.device,
) -> Callable[[], float]:
    """A function doing one training step of the protocol's trunk in ``config``'s precision and memory format
    on a random batch, returning its seconds; the trunk is its ``trunk`` attribute."""
    trunk = trunk_from(
        model.trunk,
        in_shape,
        model.embedding_dim,
        dict(model.trunk_params),
        None,
        model.freeze_bn,
    ).to(device)
    x = torch.randn(batch, *in_shape, device=device)
    channels_last = use_channels_last(config, x)
    if channels_last:
        trunk = trunk.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # the stubs lack memory_format
        x = x.contiguous(memory_format=torch.channels_last)
    optimizer = _optimizer(training.optimizer, trunk.parameters(), float(training.lr))
    autocast = torch.autocast(device.type, dtype=DTYPES[config.precision]) if config.precision != "fp32" else None
    trunk.train()

    def step() -> float:
        _sync(device)
        start = time.perf_counter()
        if autocast is None:
            emb = trunk(x)
        else:
            with autocast:
                emb = trunk(x)
        loss = emb.float().pow(2).mean()  # the loss proper is the method's, timed elsewhere
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        _sync(device)
        return time.perf_counter() - start

    step.trunk = trunk  # type: ignore[attr-defined]
    return step


EMBED_TIMED_MAX = 1024  # images: enough for the evaluation's folded copy (`FOLD_MIN_IMAGES`) and its batches


def _time_embedding(
    trunk: torch.nn.Module,
    in_shape: tuple[int, ...],
    device: torch.device,
    budget_s: float,
    target: int,
    precision: str = "fp32",
) -> tuple[float, int]:
    """Seconds per image of `bench.evaluation.embed` (``target`` its batch size, under ``precision``'s
    autocast) on sets of 16, 64, 256 and 1,024 random images, the largest whose timing fits ``budget_s``,
    and the batch it embedded in. Timing `embed` itself, not the trunk's forward, times what evaluation
    runs: on the CPU its folded copy, channels-last order and capped batches, which embed Conv-4 3-4x
    faster than the trunk as trained (the forward alone made `plan` overestimate scoring)."""
    began = time.perf_counter()
    size, per_image = 16, 0.0
    with embedding_precision(precision):  # `embed` itself runs in eval mode and puts the mode back
        while True:
            x = torch.randn(size, *in_shape)
            times = []
            for _ in range(3):  # the first of each size warms it up
                _sync(device)
                start = time.perf_counter()
                embed(trunk, x, batch_size=target, device=device)
                _sync(device)
                times.append(time.perf_counter() - start)
            per_image = min(times[1:]) / size  # the less disturbed of two, on a shared machine
            bigger = size * 4
            left = budget_s - (time.perf_counter() - began)
            if bigger > EMBED_TIMED_MAX or 3 * per_image * bigger > left:
                return per_image, min(size, evaluation_batch(x, target, device))
            size = bigger


# --------------------------------------------------------------------------- precision and memory format

VARIANTS: dict[str, tuple[str, bool]] = {  # name: (precision, channels_last), in the order they are timed
    "fp32": ("fp32", False),
    "fp32+channels_last": ("fp32", True),
    "bf16": ("bf16", False),
    "bf16+channels_last": ("bf16", True),
}
SLOW_FACTOR = 3.0  # a fixed precision this many times slower than the fastest variant here is warned about
CHOICE_BUDGET_S = 6.0  # what `precision: auto` spends timing the variants at a sweep's start


def variant_name(precision: str, channels_last: bool) -> str:
    return f"{precision}+channels_last" if channels_last else precision


def protocol_variant(protocol: Protocol) -> str | None:
    """The variant a protocol's fixed precision trains in (channels-last by `use_channels_last`'s default for
    images), or None for ``precision: auto`` (or fp16, which is not timed here)."""
    training = protocol.spec.training
    if training.precision not in ("fp32", "bf16"):
        return None
    image = protocol.spec.model.trunk != "mlp"
    config = TrainConfig(precision=training.precision, channels_last=training.channels_last)
    return variant_name(training.precision, image and use_channels_last(config, torch.empty(1, 1, 1, 1)))


def candidate_variants(protocol: Protocol) -> list[str]:
    """What ``precision: auto`` chooses among on the protocol's device: fp32 and bf16, each with and without
    channels-last (image trunks only); bf16 only where the device has it (every CPU; a CUDA GPU that says so)."""
    device = torch.device(str(protocol.spec.training.device))
    bf16 = device.type != "cuda" or torch.cuda.is_bf16_supported()
    image = protocol.spec.model.trunk != "mlp"
    return [
        name
        for name, (precision, channels_last) in VARIANTS.items()
        if (bf16 or precision == "fp32") and (image or not channels_last)
    ]


@dataclass(frozen=True)
class PrecisionChoice:
    """The fastest variant of a protocol's training step here, and what was timed to choose it."""

    precision: str
    channels_last: bool
    step_ms: dict[str, float]  # variant name: median training step in ms
    rounds: int  # timed rounds (each variant once a round) the medians are of
    threads: int
    device: str

    @property
    def variant(self) -> str:
        return variant_name(self.precision, self.channels_last)

    def to_dict(self) -> dict[str, Any]:
        """What a sweep records (manifest, Optuna storage): the choice and the timings it rests on."""
        return {
            "precision": self.precision,
            "channels_last": self.channels_last,
            "step_ms": {k: round(v, 3) for k, v in self.step_ms.items()},
            "rounds": self.rounds,
            "threads": self.threads,
            "device": self.device,
        }


def time_variants(
    protocol: Protocol,
    variants: list[str] | None = None,
    budget_s: float = CHOICE_BUDGET_S,
    threads: int | None = None,
    min_rounds: int = 2,
) -> tuple[dict[str, float], int, int]:
    """Median seconds of the protocol's training step in each variant (`VARIANTS`; default: the candidates),
    the number of timed rounds and the threads used. Each variant gets its own trunk (same seed), optimiser
    and input; after a warm-up step each, the variants alternate step by step, round after round (at least
    ``min_rounds``, at most `MAX_STEPS`, while ``budget_s`` lasts), so a busy machine slows them alike."""
    spec = protocol.spec
    model, training = spec.model, spec.training
    device = torch.device(str(training.device))
    h, w = spec.data.hw
    in_shape = (channels_of(spec.data), h, w)
    batch = training.batch_size
    names = variants or candidate_variants(protocol)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        used = torch.get_num_threads()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            steps = {}
            for name in names:
                precision, channels_last = VARIANTS[name]
                torch.manual_seed(0)
                config = TrainConfig(precision=precision, channels_last=channels_last, device=str(device))
                steps[name] = _stepper(model, training, config, in_shape, batch, device)
            began = time.perf_counter()
            for step in steps.values():
                step()  # warm-up: allocations, kernel selection (oneDNN's bf16 primitives)
            times: dict[str, list[float]] = {name: [] for name in names}
            rounds = 0
            while rounds < min_rounds or (rounds < MAX_STEPS and time.perf_counter() - began < budget_s):
                for name, step in steps.items():
                    times[name].append(step())
                rounds += 1
    finally:
        torch.set_num_threads(before)
    return {name: statistics.median(t) for name, t in times.items()}, rounds, used


def choose_precision(
    protocol: Protocol, budget_s: float = CHOICE_BUDGET_S, threads: int | None = None
) -> PrecisionChoice:
    """What ``precision: auto`` trains in here: the fastest candidate variant by `time_variants` (a tie within
    2% goes to the earlier of `VARIANTS`, fp32 first: fp32 keeps results bit for bit across machines)."""
    medians, rounds, used = time_variants(protocol, budget_s=budget_s, threads=threads)
    fastest = min(medians.values())
    name = next(n for n in VARIANTS if n in medians and medians[n] <= fastest * 1.02)
    precision, channels_last = VARIANTS[name]
    step_ms = {n: s * 1000 for n, s in medians.items()}
    return PrecisionChoice(precision, channels_last, step_ms, rounds, used, str(protocol.spec.training.device))


def slow_precision(protocol: Protocol, budget_s: float = 4.0, threads: int | None = None) -> str | None:
    """One line when the protocol's fixed precision trains `SLOW_FACTOR` or more times slower here than the
    fastest other variant (timed now, `time_variants`), else None; None too for ``auto`` and fp16."""
    own = protocol_variant(protocol)
    if own is None:
        return None
    candidates = candidate_variants(protocol)
    if own not in candidates:
        candidates.append(own)
    # one round can do: a factor of 3 is no close call (a busy machine slows the variants alike)
    medians, _, used = time_variants(protocol, candidates, budget_s=budget_s, threads=threads, min_rounds=1)
    return slow_line(own, medians, used)


def slow_line(own: str, medians: dict[str, float], threads: int) -> str | None:
    """The warning `slow_precision` prints for variant ``own`` given each variant's step seconds, or None when
    ``own`` is less than `SLOW_FACTOR` times the fastest."""
    best = min(medians, key=lambda n: medians[n])
    ratio = medians[own] / medians[best]
    if ratio < SLOW_FACTOR:
        return None
    return (
        f"training.precision: {own} takes {medians[own] * 1000:.0f} ms a training step here, {ratio:.1f}x the "
        f"{medians[best] * 1000:.0f} ms of {best} ({threads} thread(s)): `precision: auto` picks the fastest at "
        f"a sweep's start"
    )


LOADER_BATCHES = 6  # batches timed after the first (whose time is the workers' start-up)
IN_MEMORY = (*GREY_DATASETS, "npz")  # data held as tensors: nothing is read a step, nothing to time


def measure_loader(protocol: Protocol, data_root: str | None = None) -> tuple[float | None, str]:
    """Images a second the protocol's training loader delivers here, and where that came from.

    For image files read a step (``folder:``, the published layouts): the
    protocol's own training pipeline (``data.augment``) and workers
    (``data.loader.workers``) over `LOADER_BATCHES` P x K batches after a
    first, without the decoded-image cache (building it would take longer
    than the plan; the cache is faster, so this is a bound). ``(None, "")``
    for data held in memory, which costs nothing a step; ``(None, why)``
    where the data cannot be read here.
    """
    from bench.data import load
    from bench.data.loading import loader_options, stream, train_loader
    from bench.data.samplers import PKBatchSampler, PKSampler

    d, training = protocol.spec.data, protocol.spec.training
    if str(d.train).split(":", 1)[0] in IN_MEMORY:
        return None, ""
    try:
        data = load(
            d.train,
            data_root,
            size=d.image_size,
            resize=d.resize,
            channels=d.channels,
            augment=d.augment,
            loader={**d.loader.as_dict(), "cache": False},
        )
        if not data.lazy:
            return None, ""
        _, labels = torch.unique(data.y, return_inverse=True)
        sampler = PKBatchSampler(PKSampler(labels, training.P, training.K, seed=0), 0, LOADER_BATCHES + 1)
        device = torch.device("cpu")
        workers = loader_options(data.x, device)["num_workers"]
        batches = stream(train_loader(data.x, sampler, seed=0, device=device), device)
        next(batches)
        start = time.perf_counter()
        images = sum(len(xb) for xb, _ in batches)
        rate = images / (time.perf_counter() - start)
    except BenchError as err:
        return None, f"the loader was not timed ({err})"
    return rate, f"{rate:.0f} images/s, the training loader timed here ({workers} worker(s), {images} images)"
