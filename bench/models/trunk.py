"""The trunk a run trains: built by the registry, given its pretrained weights, its BatchNorm frozen if asked.

`bench.training` and the floor (`bench.sweep.floor`, the untrained trunk as
scored) both build through `trunk_from`, so the floor of a pretrained
protocol is the pretrained trunk with its fresh head, as it must be.

Frozen BatchNorm follows the Reality Check: its benchmarker (PML's
trainers, ``freeze_trunk_batchnorm: True``) puts every BatchNorm layer of
the trunk in eval mode at each training step, so batches are normalised
with the running statistics, which never change; the affine weight and
bias stay trainable and are updated with the trunk. Small P x K batches
(32 images of 8 classes) would otherwise replace ImageNet's statistics
with noisy ones.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from bench.errors import BenchError


def _keep_eval(module: nn.Module, args: Any) -> None:
    module.training = False  # whatever train() said: frozen statistics, as PML's freeze_trunk_batchnorm


def freeze_batchnorm(trunk: nn.Module) -> nn.Module:
    """Every BatchNorm layer of ``trunk`` runs in eval mode from now on, even after ``trunk.train()``.

    A forward pre-hook rather than a patched ``train``: the training loop,
    checkpoints and plugins call ``train()`` freely, and the hook holds at
    the one moment that matters, the forward pass. A trunk without
    BatchNorm is refused, since the setting would silently do nothing.
    """
    layers = [m for m in trunk.modules() if isinstance(m, _BatchNorm)]
    if not layers:
        raise BenchError("model.freeze_bn: the trunk has no BatchNorm layer to freeze")
    for layer in layers:
        layer.eval()
        layer.register_forward_pre_hook(_keep_eval)
    return trunk


def head_parameters(trunk: nn.Module) -> list[torch.nn.Parameter]:
    """The embedding head's parameters (``trunk.embed``), which ``training.trunk_lr`` leaves at ``training.lr``."""
    head = getattr(trunk, "embed", None)
    if not isinstance(head, nn.Module):
        raise BenchError(
            f"training.trunk_lr: trunk {type(trunk).__name__} has no embedding head (an `embed` "
            "layer) to keep apart from the trunk: remove training.trunk_lr"
        )
    return list(head.parameters())


def param_groups(
    trunk: nn.Module, others: list[nn.Parameter], lr: float, trunk_lr: float | None
) -> list[dict[str, Any]]:
    """The optimiser's parameter groups: one at ``lr``, or with ``trunk_lr`` the trunk body apart from the rest.

    ``others`` are the trainable parameters outside the trunk (a proxy
    loss's proxies), which train at ``lr`` with the head, as the Reality
    Check's embedder and loss optimisers do.
    """
    params, seen = [], set()
    for p in [*trunk.parameters(), *others]:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    if trunk_lr is None:
        return [{"params": params, "lr": lr}]
    head = {id(p) for p in head_parameters(trunk)}
    body = {id(p) for p in trunk.parameters()} - head
    return [
        {"params": [p for p in params if id(p) in body], "lr": trunk_lr},
        {"params": [p for p in params if id(p) not in body], "lr": lr},
    ]
