"""One cell built: its trunk, its loss and miner, and the optimiser's parameter groups.

Everything that constructs a cell's methods comes here: the protocol's
check that each method builds (`bench.protocol._methods`), the pre-flight's and
the plan's one-step probe and timing (`bench.plan.method_cost`), the dead
parameter probe (`bench.sweep.probe`), the floor of a learned metric
(`bench.sweep.floor`), training (`bench.training.train`) and single runs
(`bench.single_run`). So what the pre-flight checks is what trains.

The rule for ``num_classes`` (the rows of a proxy table, a learned margin
per class): the number of distinct training classes the loss sees in the
run, with labels remapped to 0..C-1 before they reach it (`classes_of`).
Proxies are indexed by label, so one row per class the run trains on is
exactly what a proxy loss needs: a row for a class the run never sees
(a held-out fold, a test class) would be a spare negative in every softmax
over proxies. Before the data are read (validation, planning, a probe on a
random P x K batch) the count is what is known of it (`planned_classes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from bench import registry
from bench.errors import BenchError, MethodError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from bench.spec import ModelSpec

HARNESS = "_dmlbench_harness"  # set on an exception the harness raised inside a method's call (an embedding)


class Recipe(Protocol):
    """What a cell is built from (`bench.training.TrainConfig` is one)."""

    trunk: str
    trunk_params: dict[str, Any]
    embedding_dim: int
    loss: str
    loss_params: dict[str, Any]
    miner: str | None
    miner_params: dict[str, Any]
    optimizer: str
    lr: float
    weight_decay: float
    pretrained: str | None
    freeze_bn: bool
    trunk_lr: float | None


def classes_of(labels: torch.Tensor) -> int:
    """``num_classes`` for a run on these training labels: the distinct classes (the labels the loss sees are
    their ranks, 0..C-1; module docstring)."""
    import torch

    return int(torch.unique(labels).numel())


def planned_classes(batch_classes: int, dataset_classes: float = 0) -> int:
    """``num_classes`` before the data are read: the training dataset's class count where the plan knows it
    (0: unknown), and never fewer than the P classes of a batch, the fewest any run trains on."""
    return max(int(batch_classes), int(dataset_classes))


def method_params(entry: Any, fixed: dict[str, Any], normalize: bool, distance: str | None) -> dict[str, Any]:
    """The protocol-wide choices a method accepts (normalisation, distance), then its own fixed values.

    Normalisation and distance belong to the protocol, not to a method
    (METHODS.md, fair comparison); a method that has no such parameter
    (a proxy loss) keeps its own behaviour.
    """
    accepted = entry.parameters()
    params: dict[str, Any] = {}
    if "normalize" in accepted:
        params["normalize"] = normalize
    if distance is not None and "distance" in accepted:
        params["distance"] = distance
    params.update(fixed)
    return params


def _out_of_memory(error: BaseException) -> bool:
    import torch

    oom = getattr(torch, "OutOfMemoryError", None)
    return (
        isinstance(error, MemoryError)
        or (oom is not None and isinstance(error, oom))
        or (isinstance(error, RuntimeError) and "out of memory" in str(error))
    )


def method_call(role: str, name: str, iteration: int, fn: Callable[..., Any], *args: Any, where: str = "") -> Any:
    """``fn(*args)``, a loss's or a miner's call, with what it raises made a `MethodError` (the method's failure:
    a failed trial, not a crash). What is not the method's own failure passes unchanged: a BenchError (a test-class
    guard's among them), KeyboardInterrupt and the like (not Exceptions), running out of memory, and an exception
    the harness raised from inside the call (marked ``HARNESS``: a dataset-level miner's embedding of the data)."""
    try:
        return fn(*args)
    except BenchError:
        raise
    except Exception as e:
        if getattr(e, HARNESS, False) or _out_of_memory(e):
            raise
        raise MethodError(role, name, iteration, e, where) from e


def build_methods(
    loss: str | None,
    loss_params: dict[str, Any],
    miner: str | None,
    miner_params: dict[str, Any],
    *,
    num_classes: int,
    embedding_dim: int,
    device: torch.device | None = None,
) -> tuple[Any, Any]:
    """The loss and the miner (None without one) from the registry, as a run trains them: proxy losses get
    ``num_classes`` and the embedding size, a learned metric draws its weights now (a function of the seed),
    and a miner with ``bind_loss`` is bound to the loss (a ``bind_loss`` that raises is a `MethodError`).
    ``loss`` None builds the miner alone (the protocol's check that it builds)."""
    from torch import nn

    context = {"num_classes": num_classes, "embedding_size": embedding_dim}
    loss_fn = registry.build_loss(loss, context, **loss_params) if loss else None
    if isinstance(loss_fn, nn.Module) and device is not None:
        loss_fn = loss_fn.to(device)
    materialize = getattr(loss_fn, "materialize", None)
    if callable(materialize):
        materialize(embedding_dim)
    miner_fn = registry.build_miner(miner, context, **miner_params) if miner else None
    if miner_fn is not None and loss_fn is not None and hasattr(miner_fn, "bind_loss"):
        method_call("miner", str(miner), 0, miner_fn.bind_loss, loss_fn, where="bind_loss")
    return loss_fn, miner_fn


def protocol_trunk(model: ModelSpec, in_shape: tuple[int, ...]) -> nn.Module:
    """The trunk a protocol's ``model`` section names, as `build_cell` builds it (the floor's trunk, and the
    check of a sweep's weights file before its first trial); seeded alike, it is the trunk a run starts from,
    since `build_cell` draws the trunk's numbers before the loss's."""
    from bench.trunks import trunk_from

    return trunk_from(
        model.trunk, in_shape, model.embedding_dim, dict(model.trunk_params), model.pretrained, model.freeze_bn
    )


def build_cell(recipe: Recipe, in_shape: tuple[int, ...], num_classes: int, device: torch.device) -> tuple[Any, ...]:
    """Trunk (pretrained, BN frozen, as configured), then loss and miner (`build_methods`), in that order: the
    trunk's random draws come first, so a seeded build gives the same trunk whatever the loss."""
    from bench.trunks import trunk_from

    trunk = trunk_from(
        recipe.trunk, in_shape, recipe.embedding_dim, recipe.trunk_params, recipe.pretrained, recipe.freeze_bn
    ).to(device)
    loss, miner = build_methods(
        recipe.loss or None,
        recipe.loss_params,
        recipe.miner,
        recipe.miner_params,
        num_classes=num_classes,
        embedding_dim=recipe.embedding_dim,
        device=device,
    )
    return trunk, loss, miner


def optimizer(recipe: Recipe, trunk: nn.Module, loss: Any) -> torch.optim.Optimizer:
    """One parameter group at ``lr``; with ``trunk_lr``, the trunk body in its own group (bench.models).

    A loss with a ``param_lr`` (its ``lr`` parameter: a proxy loss's proxies, a learned margin beta) has
    its own parameters in a last group at that rate, as the Reality Check's separate loss optimiser;
    without one they train at ``lr`` with the head. Every group has the same optimiser, weight decay
    and schedule.
    """
    import torch
    from torch import nn

    from bench.models import param_groups

    others = list(loss.parameters()) if isinstance(loss, nn.Module) else []
    own_lr = getattr(loss, "param_lr", None)
    if own_lr is None:
        groups = param_groups(trunk, others, recipe.lr, recipe.trunk_lr)
    else:
        groups = param_groups(trunk, [], recipe.lr, recipe.trunk_lr)
        in_trunk = {id(p) for p in trunk.parameters()}
        own = [p for p in dict.fromkeys(others) if p.requires_grad and id(p) not in in_trunk]
        if own:
            groups.append({"params": own, "lr": float(own_lr)})
    # fused: one kernel for every parameter on CUDA (fewer launches, no per-parameter host work); the CPU keeps
    # the default implementation, so its results stay bit for bit what they were
    fused = True if _fused(groups) else None  # None: torch's default implementation
    if recipe.optimizer == "adam":
        return torch.optim.Adam(groups, lr=recipe.lr, weight_decay=recipe.weight_decay, fused=fused)
    if recipe.optimizer == "rmsprop":
        return torch.optim.RMSprop(groups, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.SGD(groups, lr=recipe.lr, momentum=0.9, weight_decay=recipe.weight_decay, fused=fused)


def _fused(groups: list[dict[str, Any]]) -> bool:
    """Whether every parameter is a floating-point tensor on CUDA, where the fused Adam and SGD run."""
    params = [p for group in groups for p in group["params"]]
    return bool(params) and all(p.device.type == "cuda" and p.is_floating_point() for p in params)
