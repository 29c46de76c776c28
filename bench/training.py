"""One training run: a trunk, a loss (and miner) and a budget of iterations.

The same loop serves `dmlbench train`, every tuning trial and every final
seed, so it is where the fair-comparison rules are enforced: the budget is a
number of iterations (and so of samples seen), batches are P classes x K
samples, and everything random is seeded from ``config.seed``.

The loop is kept close to a bare PyTorch loop (the harness overhead goal is
1.05x): losses stay on the device in a preallocated buffer and are read back
only every ``SYNC_EVERY`` iterations, at checkpoints and at the end, which is
also when divergence is detected. A NaN or infinite loss raises
`DivergedError` with the first iteration where it appeared.
"""

from __future__ import annotations

import math
import numbers
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from bench import registry
from bench.errors import BenchError, DivergedError

SYNC_EVERY = 25  # iterations between reads of the loss buffer (progress, divergence check)
FINAL_LOSS_WINDOW = 50  # final_loss is the mean of the last this-many losses
AUGMENTATIONS = ("shift", "affine")
OPTIMIZERS = ("adam", "sgd")


@dataclass
class TrainConfig:
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
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise BenchError(f"seed must be an integer, got {self.seed!r}")
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                    or value < 0 or (name == "lr" and value == 0):
                raise BenchError(f"{name} must be a finite number {'> 0' if name == 'lr' else '>= 0'}, "
                                 f"got {value!r}")
        if self.optimizer not in OPTIMIZERS:
            raise BenchError(f"unknown optimizer {self.optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
        if self.augmentation is not None and self.augmentation not in AUGMENTATIONS:
            raise BenchError(f"unknown augmentation {self.augmentation!r}: "
                             f"expected none or one of {', '.join(AUGMENTATIONS)}")
        for name in ("trunk_params", "loss_params", "miner_params"):
            if not isinstance(getattr(self, name), dict):
                raise BenchError(f"{name} must be a mapping of parameter names to values")
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise BenchError(f"unknown device {self.device!r}: expected e.g. cpu, cuda, cuda:1") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise BenchError(f"device {self.device!r} asked for, but this machine has no usable CUDA GPU")
        # numpy scalars (from a tuner) become Python numbers, so they seed and log alike
        for name in ("embedding_dim", "P", "K", "iterations", "seed"):
            setattr(self, name, int(getattr(self, name)))
        self.lr, self.weight_decay = float(self.lr), float(self.weight_decay)


@dataclass
class TrainResult:
    model: nn.Module
    loss_module: nn.Module
    iterations: int
    samples_seen: int
    wall_time_s: float
    final_loss: float
    status: str = "ok"
    reason: str = ""


Checkpoint = Callable[[int, nn.Module], None]
Progress = Callable[[int, int, float], None]


def build(config: TrainConfig, in_shape: tuple[int, ...], num_classes: int, device: torch.device):
    """Trunk, loss and miner from the registry; proxy losses get the class count and embedding size."""
    trunk = registry.build_trunk(config.trunk, in_shape=in_shape, embedding_dim=config.embedding_dim,
                                 **config.trunk_params).to(device)
    context = {"num_classes": num_classes, "embedding_size": config.embedding_dim}
    loss = registry.build_loss(config.loss, context, **config.loss_params)
    if isinstance(loss, nn.Module):
        loss = loss.to(device)
    miner = registry.build_miner(config.miner, context, **config.miner_params) if config.miner else None
    if miner is not None and hasattr(miner, "bind_loss"):
        miner.bind_loss(loss)
    return trunk, loss, miner


def _optimizer(config: TrainConfig, modules: Sequence[nn.Module]) -> torch.optim.Optimizer:
    params, seen = [], set()
    for module in modules:
        for p in module.parameters() if isinstance(module, nn.Module) else ():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=config.lr, momentum=0.9, weight_decay=config.weight_decay)


def augment(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """Random small affine distortions of image batches, drawn from ``generator`` (so seeded).

    ``shift``: translations up to 10% of the image side; ``affine``: plus
    rotations up to 10 degrees and scaling by 0.9-1.1. Vector data is
    returned as is. Pixels shifted in are 0 (Omniglot's background).
    """
    if x.ndim != 4:
        return x
    n = x.shape[0]
    rand = lambda: torch.rand(n, generator=generator).to(x.device) * 2 - 1  # noqa: E731 - uniform in [-1, 1]
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


def _seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _pk_batches(labels: torch.Tensor, config: TrainConfig) -> Iterator[torch.Tensor]:
    from bench.samplers import PKSampler

    num_classes = int(torch.unique(labels).numel())
    if num_classes < 2 or config.P > num_classes:
        raise BenchError(f"P={config.P} classes per batch, but the training data has {num_classes} classes")
    return PKSampler(labels, config.P, config.K, config.seed).iterate()


def train(config: TrainConfig, data, *, checkpoint_every: int = 0, on_checkpoint: Checkpoint | None = None,
          progress: Progress | None = None) -> TrainResult:
    """Train ``config.trunk`` on ``data`` (a LabeledData) for ``config.iterations`` steps.

    Labels are remapped to 0..C-1 (proxy losses index their proxies by
    label; the global class ids of Omniglot evaluation start at 964).
    ``on_checkpoint(iteration, model)`` runs every ``checkpoint_every``
    iterations and may raise (``optuna.TrialPruned``) to stop the run;
    ``progress(iteration, total, loss)`` is called every ``SYNC_EVERY``
    iterations and at the end.
    """
    config.check()
    device = torch.device(config.device)
    generator = _seed_everything(config.seed)
    _, labels = torch.unique(data.y, return_inverse=True)
    num_classes = int(labels.max()) + 1
    x = data.x.to(device)
    labels_dev = labels.to(device)
    trunk, loss_fn, miner = build(config, tuple(data.x.shape[1:]), num_classes, device)
    optimizer = _optimizer(config, [trunk, loss_fn])
    dataset_level = bool(getattr(miner, "dataset_level", False))
    batches = None if dataset_level else _pk_batches(labels, config)

    def embed_indices(indices: torch.Tensor) -> torch.Tensor:
        return embed(trunk, x[indices], device=device).to(device)

    total = config.iterations
    losses = torch.zeros(total, device=device)
    samples_seen, empty_steps, checked = 0, 0, 0

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
    for it in range(1, total + 1):
        if dataset_level:
            idx, tuples = miner.batch(it - 1, embed_indices, labels_dev, generator)
            idx = torch.as_tensor(idx, dtype=torch.long, device=device)
        else:
            idx, tuples = next(batches).to(device), None
        xb, yb = x[idx], labels_dev[idx]
        if config.augmentation:
            xb = augment(xb, config.augmentation, generator)
        emb = trunk(xb)
        if miner is not None and not dataset_level:
            tuples = miner(emb, yb)
        loss = loss_fn(emb, yb, tuples)
        if loss.requires_grad:  # a loss with no tuple may still be a zero tied to the graph: step as PML does
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if not loss.requires_grad or getattr(loss_fn, "stats", {}).get("num_tuples") == 0:
            empty_steps += 1  # no valid tuple in this batch: nothing was learned from it
        losses[it - 1] = loss.detach()
        samples_seen += len(idx)
        if it % SYNC_EVERY == 0 or it == total:
            latest = read_back(it)
            if progress is not None:
                progress(it, total, latest)
        if checkpoint_every and on_checkpoint is not None and it % checkpoint_every == 0:
            read_back(it)
            on_checkpoint(it, trunk)
            trunk.train()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - start
    final = float(losses[-min(FINAL_LOSS_WINDOW, total):].mean())
    reason = f"{empty_steps} of {total} steps had no valid tuple" if empty_steps else ""
    return TrainResult(trunk.eval(), loss_fn, total, samples_seen, wall, final, "ok", reason)


def embed(model: nn.Module, x: torch.Tensor, batch_size: int = 512, device: str | torch.device = "cpu",
          normalize: bool = False) -> torch.Tensor:
    """Embeddings of ``x`` in eval mode without gradients, on the CPU; the model's mode is restored.

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
            out = [model(x[i:i + batch_size].to(device)).float().cpu() for i in range(0, len(x), batch_size)]
    finally:
        model.train(was_training)
    if not out:
        raise BenchError("nothing to embed: the data is empty")
    return to_geometry(torch.cat(out), geometry(normalize))


def evaluate(model: nn.Module, data, ks: Sequence[int] = (1, 2, 4, 8), lake_runs=None, clustering: bool = True,
             batch_size: int = 512, device: str | torch.device = "cpu", seed: int = 0,
             normalize: bool = False) -> dict[str, float]:
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
