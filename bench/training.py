"""One training run: a trunk, a loss (and miner) and a budget of iterations.

The same loop serves `dmlbench train`, every tuning trial and every final
seed, so it is where the fair-comparison rules are enforced: the budget is a
number of iterations (and so of samples seen), batches are P classes x K
samples, and everything random is seeded from ``config.seed``.

The loop is kept close to a bare PyTorch loop (the harness overhead goal is
1.05x): losses stay on the device in a preallocated buffer and are read back
only every ``SYNC_EVERY`` iterations, at checkpoints and at the end, which is
also when divergence is detected. A NaN or infinite loss raises
`DivergedError` with the first iteration where it appeared; an exception
raised by the loss or the miner (`method_call`) raises `MethodError` with the
iteration it came from. Either is a failed trial or final seed, not a crash.

Data held in memory lives on the device, and so do its PK batches (each
chunk of the sampler's batches copied there once, `PKSampler.iterate_on`);
on CUDA nothing in the loop's own code waits for the device between
read-backs (no ``.item()``, no branch on a tensor's value, copies without
blocking), and Adam and SGD run as the fused kernels. Losses and miners that
read their statistics back (``float(count)``) still wait once a step. Image files
(`bench.data.images.ImageFiles`) are decoded and augmented by DataLoader
workers, the PK sampler serving as their batch sampler (`_batches`).
Embedding and scoring a model live in `bench.evaluation`; dataset-level
miners embed the training set through its `embed`.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.cell import HARNESS, build_cell, classes_of, method_call
from bench.cell import optimizer as make_optimizer
from bench.devices import AUTO, DTYPE_NAMES, FLOAT32_MAX, describe, device_problem, precision_problem
from bench.errors import BenchError, DivergedError, MethodError
from bench.evaluation import embed
from bench.models.weights import resolve
from bench.resume import RunState, attributes, generators_state, restore_generators, set_attributes

SYNC_EVERY = 25  # iterations between reads of the loss buffer (progress, divergence check)
FINAL_LOSS_WINDOW = 50  # final_loss is the mean of the last this-many losses
AUGMENTATIONS = ("shift", "affine")
OPTIMIZERS = ("adam", "sgd", "rmsprop")  # rmsprop: the Reality Check's
DTYPES = {p: getattr(torch, name) for p, name in DTYPE_NAMES.items()}  # bench.devices.PRECISIONS
SCHEDULES = ("constant", "cosine", "step", "exponential")


@dataclass
class TrainConfig:
    """Everything one training run depends on, so that two equal configs train the same model.

    The ``*_params`` are the named method's constructor arguments (`bench.registry`); ``P`` classes x ``K``
    samples make a batch; ``iterations`` is the budget in batches; `check` refuses bad values.
    """

    trunk: str = "conv4"
    trunk_params: dict[str, Any] = field(default_factory=dict)
    embedding_dim: int = 128
    loss: str = "triplet"
    loss_params: dict[str, Any] = field(default_factory=dict)
    miner: str | None = None
    miner_params: dict[str, Any] = field(default_factory=dict)
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    P: int = 32
    K: int = 4
    iterations: int = 1000
    seed: int = 0
    augmentation: str | None = None
    device: str = "cpu"
    precision: str = "fp32"  # of the trunk's forward (autocast); losses and miners always run in fp32
    channels_last: bool | None = None  # None: on for image data when precision is bf16 or fp16
    schedule: dict[str, Any] = field(default_factory=lambda: {"type": "constant", "warmup": 0})  # no LR change
    pretrained: str | None = None  # weights to start from (bench.models.weights): a path, a hub file name, "hub"
    freeze_bn: bool = False  # the trunk's BatchNorm in eval mode throughout (bench.models.trunk)
    trunk_lr: float | None = None  # the trunk body's LR, the head (and a loss's proxies) keeping lr; None: lr

    def to_dict(self) -> dict[str, Any]:
        """A plain nested dict (copies), what tracking logs as parameters."""
        return asdict(self)

    def check(self) -> None:
        """Refuse bad values with a message naming the field, before anything is built.

        Valid numbers are normalised in place to Python ``int``/``float``.
        """
        for name in ("embedding_dim", "P", "K", "iterations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise BenchError(f"{name} must be a positive integer, got {value!r}")
        if self.K < 2:
            raise BenchError(f"K must be at least 2 (a batch needs positive pairs), got {self.K}")
        # NumPy's and scikit-learn's generators (the data order, k-means) take seeds in [0, 2**32)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or not 0 <= self.seed < 2**32:
            raise BenchError(f"seed must be an integer in [0, 4294967295], got {self.seed!r}")
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or not math.isfinite(value)
                or value < 0
                or (name == "lr" and value == 0)
                or value > FLOAT32_MAX  # held as float32 by the optimiser: its first step would overflow
            ):
                raise BenchError(
                    f"{name} must be a finite number {'> 0' if name == 'lr' else '>= 0'} and at most "
                    f"{FLOAT32_MAX:.4g} (float32's largest), got {value!r}"
                )
        if self.optimizer not in OPTIMIZERS:
            raise BenchError(f"unknown optimizer {self.optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
        if self.augmentation is not None and self.augmentation not in AUGMENTATIONS:
            raise BenchError(
                f"unknown augmentation {self.augmentation!r}: expected none or one of {', '.join(AUGMENTATIONS)}"
            )
        for name in ("trunk_params", "loss_params", "miner_params"):
            if not isinstance(getattr(self, name), dict):
                raise BenchError(f"{name} must be a mapping of parameter names to values")
        problem = device_problem(self.device)
        if problem:
            raise BenchError(problem if problem.startswith("unknown") else f"device {problem}")
        if self.precision == AUTO:
            raise BenchError(
                "precision auto is a protocol's, resolved at a sweep's start: a training run needs fp32, bf16 or fp16"
            )
        problem = precision_problem(self.precision, self.device)
        if problem:
            raise BenchError(problem if problem.startswith("unknown") else f"precision {problem}")
        if self.channels_last is not None and not isinstance(self.channels_last, bool):
            raise BenchError(f"channels_last must be true, false or null, got {self.channels_last!r}")
        problem = schedule_problem(self.schedule, self.iterations)
        if problem:
            raise BenchError(f"schedule: {problem}")
        self._check_trunk_options()
        # numpy scalars (from a tuner) become Python numbers, so they seed and log alike
        for name in ("embedding_dim", "P", "K", "iterations", "seed"):
            setattr(self, name, int(getattr(self, name)))
        self.lr, self.weight_decay = float(self.lr), float(self.weight_decay)

    def _check_trunk_options(self) -> None:
        """trunk_lr a positive number or None, freeze_bn a bool, and the pretrained file present (one line
        saying where to put it), all before data or MLflow are touched."""
        if self.trunk_lr is not None:
            if (
                isinstance(self.trunk_lr, bool)
                or not isinstance(self.trunk_lr, numbers.Real)
                or not math.isfinite(self.trunk_lr)
                or self.trunk_lr <= 0
            ):
                raise BenchError(f"trunk_lr must be a finite number > 0 or null, got {self.trunk_lr!r}")
            self.trunk_lr = float(self.trunk_lr)
        if not isinstance(self.freeze_bn, bool):
            raise BenchError(f"freeze_bn must be true or false, got {self.freeze_bn!r}")
        if self.pretrained is not None:
            resolve(self.pretrained, self.trunk)


@dataclass
class TrainResult:
    """A trained model (in eval mode) and what it cost; ``reason`` notes steps that had no valid tuple."""

    model: nn.Module
    loss_module: nn.Module
    iterations: int
    samples_seen: int
    wall_time_s: float
    final_loss: float
    status: str = "ok"
    reason: str = ""
    best_iteration: int | None = None  # early stopping: the iteration of the checkpoint returned; None: the last
    earlier_s: float = 0.0  # of wall_time_s, the seconds earlier attempts trained (a resumed run, `RunState`)
    resumed: str = ""  # a resumed run's earlier parts (`RunState.described`); "" for one trained in one go


Checkpoint = Callable[[int, nn.Module], None]
Progress = Callable[[int, int, float], None]


@dataclass
class EarlyStopping:
    """Early stopping of one run: ``score(iteration, model)`` (higher is better) every ``check_every``
    iterations; the run stops after ``patience`` checks in a row without a strictly higher score, and the
    model it returns is the best-scoring checkpoint (the trunk and the loss's own parameters, a learned
    metric's or proxies, as they were then). ``config.iterations`` is the most it trains. ``score`` may raise
    (``optuna.TrialPruned``) to stop the run, as ``on_checkpoint`` may."""

    check_every: int
    patience: int
    score: Callable[[int, nn.Module], float]


def _snapshot(*modules: Any) -> list[dict[str, torch.Tensor] | None]:
    return [
        {k: v.detach().clone() for k, v in m.state_dict().items()} if isinstance(m, nn.Module) else None
        for m in modules
    ]


def loss_value(name: str, iteration: int, value: Any) -> torch.Tensor:
    """A loss's result, refused (a `MethodError`) unless it is a tensor of one element, which the loop steps on."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value
    shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
    raise MethodError("loss", name, iteration, TypeError(f"returned {shape}, expected a tensor of one element"))


def schedule_problem(schedule: object, iterations: int) -> str | None:
    """What is wrong with a learning-rate schedule for a budget of ``iterations``, or None.

    A schedule is ``{type: constant | cosine | step | exponential, warmup: N}``,
    and for ``step`` also ``gamma`` (the factor, in (0, 1]) and ``milestones``
    (increasing fractions of the budget, in (0, 1), after which the LR is
    multiplied by gamma); for ``exponential`` (Hermans et al. 2017's decay)
    ``start`` (the fraction of the budget after which the LR decays) and
    ``gamma`` (the factor reached at the end). Fractions, not iteration numbers, so that a budget
    check at twice the iterations keeps the schedule's shape.
    """
    if not isinstance(schedule, dict):
        return f"expected a mapping with a type ({', '.join(SCHEDULES)}), got {schedule!r}"
    kind = schedule.get("type")
    if kind not in SCHEDULES:
        return f"unknown type {kind!r}: expected one of {', '.join(SCHEDULES)}"
    allowed = {"type", "warmup"} | {"step": {"gamma", "milestones"}, "exponential": {"gamma", "start"}}.get(kind, set())
    extra = sorted(set(schedule) - allowed)
    if extra:
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} schedule has no {extra[0]!r}: expected {', '.join(sorted(allowed))}"
    warmup = schedule.get("warmup", 0)
    if isinstance(warmup, bool) or not isinstance(warmup, numbers.Integral) or not 0 <= int(warmup) < iterations:
        return f"warmup must be a whole number of iterations in [0, {iterations}), got {warmup!r}"
    if kind in ("step", "exponential"):
        gamma = schedule.get("gamma")
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0 < float(gamma) <= 1:
            return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} schedule needs gamma in (0, 1], got {gamma!r}"
    if kind == "exponential":
        start = schedule.get("start")
        if isinstance(start, bool) or not isinstance(start, numbers.Real) or not 0 <= float(start) < 1:
            return f"an exponential schedule needs start: the fraction of the budget in [0, 1) after which it decays, got {start!r}"
    if kind == "step":
        milestones = schedule.get("milestones")
        if (
            not isinstance(milestones, (list, tuple))
            or not milestones
            or any(isinstance(m, bool) or not isinstance(m, numbers.Real) or not 0 < float(m) < 1 for m in milestones)
            or list(milestones) != sorted(set(milestones))
        ):
            return f"a step schedule needs milestones: increasing fractions of the budget in (0, 1), got {milestones!r}"
    return None


def lr_factor(schedule: dict[str, Any], it: int, total: int) -> float:
    """The multiple of the base LR used at iteration ``it`` (1-based) of ``total``.

    Warm-up is linear, ``it / warmup`` for the first ``warmup`` iterations.
    Cosine then decays over the rest, ``(1 + cos(pi * s / S)) / 2`` with
    ``s = it - 1 - warmup`` of ``S = total - warmup``; step multiplies by
    ``gamma`` once per milestone fraction ``m`` with ``it > m * total``;
    exponential multiplies by ``gamma ** ((it - t0) / (total - t0))`` after
    ``t0 = start * total`` (so ``gamma`` at the last iteration).
    """
    warmup = int(schedule.get("warmup", 0))
    factor = it / warmup if it <= warmup else 1.0
    if schedule["type"] == "cosine" and it > warmup:
        factor *= 0.5 * (1 + math.cos(math.pi * (it - 1 - warmup) / (total - warmup)))
    elif schedule["type"] == "step":
        factor *= float(schedule["gamma"]) ** sum(it > m * total for m in schedule["milestones"])
    elif schedule["type"] == "exponential":
        t0 = float(schedule["start"]) * total
        if it > t0:
            factor *= float(schedule["gamma"]) ** ((it - t0) / (total - t0))
    return factor


@contextlib.contextmanager
def read_back_point(device: torch.device) -> Iterator[None]:
    """Where the loop may wait for the device (a read-back of the losses, a checkpoint, the end): CUDA's sync
    debug mode, if set (`torch.cuda.set_sync_debug_mode`), is off inside and restored after, so a test that
    sets it to "error" around a run catches any wait between these points and none at them."""
    mode = torch.cuda.get_sync_debug_mode() if device.type == "cuda" else 0
    if mode:
        torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        if mode:
            torch.cuda.set_sync_debug_mode(mode)


def _set_lr(optimizer: torch.optim.Optimizer, base: Sequence[float], factor: float) -> None:
    for group, lr in zip(optimizer.param_groups, base):
        group["lr"] = lr * factor


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The trunk's forward in ``precision``; fp32 is no context at all, so its results stay bit for bit."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


def use_channels_last(config: TrainConfig, x: torch.Tensor) -> bool:
    """Channels-last memory format: asked for, or by default for image data trained in bf16/fp16."""
    if x.ndim != 4:
        return False
    return config.precision != "fp32" if config.channels_last is None else config.channels_last


def augment(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """Random small affine distortions of image batches, drawn from ``generator`` (so seeded).

    ``shift``: translations up to 10% of the image side; ``affine``: plus
    rotations up to 10 degrees and scaling by 0.9-1.1. Vector data is
    returned as is. Pixels shifted in are 0 (Omniglot's background).
    """
    if x.ndim != 4:
        return x
    n = x.shape[0]
    # drawn on the generator's device (the CPU: the same numbers on every device), copied without blocking
    rand = lambda: torch.rand(n, generator=generator).to(x.device, non_blocking=True) * 2 - 1  # noqa: E731 - in [-1, 1]
    shift = torch.stack([rand(), rand()], 1) * 0.2  # grid coordinates span 2, so 0.2 is 10% of the side
    theta = torch.zeros(n, 2, 3, device=x.device)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    if kind == "affine":
        angle = rand() * math.radians(10)
        scale = 1 + rand() * 0.1
        cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
        theta[:, 0, 0], theta[:, 0, 1], theta[:, 1, 0], theta[:, 1, 1] = cos, -sin, sin, cos
    theta[:, :, 2] = shift
    grid = torch.nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
    return torch.nn.functional.grid_sample(x, grid, padding_mode="zeros", align_corners=False)


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python's, NumPy's and torch's global generators with ``seed``; returns a torch generator seeded
    alike (the data order's). Training starts here, and so does anything that must start as training does."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def check_classes(config: TrainConfig, num_classes: int) -> None:
    """A PK batch of ``config.P`` classes needs that many training classes (and any loss two): what `train`
    refuses before its first step unless the miner picks its own batches (a dataset-level miner)."""
    if num_classes < 2 or config.P > num_classes:
        raise BenchError(f"P={config.P} classes per batch, but the training data has {num_classes} classes")


def _pk_sampler(labels: torch.Tensor, config: TrainConfig) -> Any:
    from bench.data.samplers import PKSampler

    check_classes(config, int(torch.unique(labels).numel()))
    return PKSampler(labels, config.P, config.K, config.seed)


def _batches(
    x: Any, labels: torch.Tensor, config: TrainConfig, device: torch.device, start: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, sample indices) on `device` for steps start, start+1, ...: indexed from the tensor in
    memory, or decoded from image files by loader workers with the PK sampler as their batch sampler."""
    sampler = _pk_sampler(labels, config)
    if isinstance(x, torch.Tensor):
        return ((x[idx], idx) for idx in sampler.iterate_on(device, start))
    from bench.data.loading import train_batches
    from bench.data.samplers import PKBatchSampler

    batch_sampler = PKBatchSampler(sampler, start, start + config.iterations)
    return train_batches(x, batch_sampler, config.seed, device)


def train(
    config: TrainConfig,
    data,
    *,
    checkpoint_every: int = 0,
    on_checkpoint: Checkpoint | None = None,
    progress: Progress | None = None,
    on_built: Callable[[nn.Module, Any], None] | None = None,
    early_stopping: EarlyStopping | None = None,
    stop_after: int | None = None,
    resume: RunState | None = None,
) -> TrainResult:
    """Train ``config.trunk`` on ``data`` (a LabeledData) for ``config.iterations`` steps.

    Labels are remapped to 0..C-1 (proxy losses index their proxies by
    label; the global class ids of Omniglot evaluation start at 964).
    ``on_checkpoint(iteration, model)`` runs every ``checkpoint_every``
    iterations and may raise (``optuna.TrialPruned``) to stop the run;
    ``progress(iteration, total, loss)`` is called every ``SYNC_EVERY``
    iterations and at the end. ``on_built(trunk, loss)`` is told the trunk
    and the loss once they are built, before the first step (a checkpoint
    that scores a learned-metric cell needs the loss's metric). With
    ``early_stopping`` the run may stop before ``config.iterations`` and
    returns its best checkpoint (`EarlyStopping`); ``iterations`` is then the
    iterations it trained and ``best_iteration`` the checkpoint's.
    ``stop_after``: stop after that many iterations, the schedule still
    that of ``config.iterations`` (an early-stopped run's final retrained to
    the iteration its best checkpoint was taken at).
    ``resume``: where the run's state is saved as it trains and read back by a later attempt at the same run,
    which then goes on from it (`bench.resume`; not for a dataset-level miner, whose mining state it lacks).
    """
    config.check()
    device = torch.device(config.device)
    generator = seed_everything(config.seed)
    _, labels = torch.unique(data.y, return_inverse=True)  # ranks 0..C-1: what the loss and miner see
    files = not isinstance(data.x, torch.Tensor)  # image files, decoded by loader workers
    x = data.x if files else data.x.to(device)
    labels_dev = labels.to(device)
    trunk, loss_fn, miner = build_cell(config, tuple(data.x.shape[1:]), classes_of(labels), device)
    if on_built is not None:
        on_built(trunk, loss_fn)
    channels_last = use_channels_last(config, x)
    if channels_last:
        trunk = trunk.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(config, trunk, loss_fn)
    scheduled = config.schedule["type"] != "constant" or config.schedule.get("warmup", 0) > 0
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
    dataset_level = bool(getattr(miner, "dataset_level", False))
    miner_name = str(config.miner)
    if dataset_level:
        resume = None  # its own mining state (what it mined, when it mines next) is not saved: it starts over
    identity = (
        resume.identity(
            config=config.to_dict(),
            stop_after=stop_after,
            early_stopping=None if early_stopping is None else [early_stopping.check_every, early_stopping.patience],
            device=device.type,
        )
        if resume is not None
        else {}
    )
    saved = resume.load(identity) if resume is not None else None

    def embed_indices(indices: torch.Tensor) -> torch.Tensor:
        try:
            return embed(trunk, x[indices], device=device).to(device)
        except Exception as e:  # the harness's, though raised inside the miner's call: not the miner's failure
            with contextlib.suppress(AttributeError):
                setattr(e, HARNESS, True)
            raise

    total = config.iterations
    losses = torch.zeros(total, device=device)
    samples_seen, empty_steps, checked = 0, 0, 0
    best_score, best_it, best_state, stale = -math.inf, 0, _snapshot(), 0
    first, earlier_s = 1, 0.0
    methods = {"trunk": trunk, "loss": loss_fn, "miner": miner}  # what a saved state holds of each (`bench.resume`)
    if saved is not None:  # the state of an earlier attempt at this run, which goes on from its next iteration
        for key, method in methods.items():
            if isinstance(method, nn.Module):
                method.load_state_dict(saved[key])
            set_attributes(method, saved["attributes"][key])  # counters, adaptive margins, caches
        optimizer.load_state_dict(saved["optimizer"])
        if scaler is not None:
            scaler.load_state_dict(saved["scaler"])
        restore_generators(generator, saved["generators"])
        first = int(saved["it"]) + 1
        losses[: first - 1] = saved["losses"].to(device)
        checked, samples_seen, empty_steps = saved["checked"], saved["samples_seen"], saved["empty_steps"]
        best_score, best_it, stale = saved["best"]
        best_state = saved["best_state"]
        earlier_s = float(saved["wall_s"])
    # a dataset-level miner picks its own batches: the PK iterator is then empty and never read
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]] = (
        iter(()) if dataset_level else _batches(x, labels, config, device, start=first - 1)
    )

    def read_back(upto: int) -> float:
        """Sync point: raise on the first non-finite loss in [checked, upto), return the latest loss."""
        nonlocal checked
        window = losses[checked:upto]
        bad = (~torch.isfinite(window)).nonzero()
        if len(bad):
            i = int(bad[0])
            raise DivergedError(checked + i + 1, float(window[i]))
        checked = upto
        return float(losses[upto - 1])

    trunk.train()
    start = time.perf_counter()
    for it in range(first, total + 1):
        if dataset_level:
            idx, tuples = method_call(
                "miner", miner_name, it, miner.batch, it - 1, embed_indices, labels_dev, generator
            )
            idx = torch.as_tensor(idx, dtype=torch.long, device=device)
            xb = _decoded(x, idx, it - 1, config.seed, device) if files else x[idx]
        else:
            (xb, idx), tuples = next(batches), None
        yb = labels_dev[idx]
        if config.augmentation:
            xb = augment(xb, config.augmentation, generator)
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        with _autocast(config.precision, device):
            emb = trunk(xb)
        emb = emb.float()  # the losses and miners in fp32 whatever the trunk ran in (a no-op in fp32)
        if miner is not None and not dataset_level:
            tuples = method_call("miner", miner_name, it, miner, emb, yb)
        loss = loss_value(config.loss, it, method_call("loss", config.loss, it, loss_fn, emb, yb, tuples))
        if loss.requires_grad:  # a loss with no tuple may still be a zero tied to the graph: step as PML does
            if scheduled:
                _set_lr(optimizer, base_lrs, lr_factor(config.schedule, it, total))
            optimizer.zero_grad(set_to_none=True)
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        if not loss.requires_grad or getattr(loss_fn, "stats", {}).get("num_tuples") == 0:
            empty_steps += 1  # no valid tuple in this batch: nothing was learned from it
        losses[it - 1] = loss.detach()
        samples_seen += len(idx)
        if it % SYNC_EVERY == 0 or it == total:
            with read_back_point(device):
                latest = read_back(it)
                if progress is not None:
                    progress(it, total, latest)
        if checkpoint_every and on_checkpoint is not None and it % checkpoint_every == 0:
            with read_back_point(device):
                read_back(it)
                on_checkpoint(it, trunk)
            trunk.train()
        if early_stopping is not None and (it % early_stopping.check_every == 0 or it in (total, stop_after)):
            with read_back_point(device):
                read_back(it)
                value = float(early_stopping.score(it, trunk))
            trunk.train()
            if value > best_score or best_it == 0:  # a NaN score never counts as better, but the first is kept
                best_score, best_it, best_state, stale = value, it, _snapshot(trunk, loss_fn), 0
            else:
                stale += 1
                if stale >= early_stopping.patience:
                    break
        if stop_after is not None and it >= stop_after:
            break
        # the state as the next iteration begins (this one's losses read back, its checks made), so a later
        # attempt that loads it trains what this one would have
        if resume is not None and it % SYNC_EVERY == 0 and it < total and resume.due():
            resume.save(
                {
                    "identity": identity,
                    "it": it,
                    **{k: m.state_dict() if isinstance(m, nn.Module) else None for k, m in methods.items()},
                    "attributes": {k: attributes(m) for k, m in methods.items()},
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict() if scaler is not None else None,
                    "generators": generators_state(generator),
                    "losses": losses[:it].cpu(),
                    "checked": checked,
                    "samples_seen": samples_seen,
                    "empty_steps": empty_steps,
                    "best": [best_score, best_it, stale],
                    "best_state": best_state,
                    "wall_s": earlier_s + time.perf_counter() - start,
                    "parts": [*resume.parts, {"first": first, "last": it, "device": describe(config.device)}],
                }
            )
    done = it
    with read_back_point(device):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = earlier_s + time.perf_counter() - start
        read_back(done)
        final = float(losses[max(done - FINAL_LOSS_WINDOW, 0) : done].mean())
        if early_stopping is not None:
            for module, state in zip((trunk, loss_fn), best_state):
                if state is not None:
                    module.load_state_dict(state)
    reason = f"{empty_steps} of {done} steps had no valid tuple" if empty_steps else ""
    best = best_it if early_stopping is not None else None
    resumed = resume.described() if resume is not None else ""
    return TrainResult(trunk.eval(), loss_fn, done, samples_seen, wall, final, "ok", reason, best, earlier_s, resumed)


def _decoded(files: Any, idx: torch.Tensor, step: int, seed: int, device: torch.device) -> torch.Tensor:
    from bench.data.loading import decode_batch

    return decode_batch(files, idx.cpu(), step, seed).to(device)
