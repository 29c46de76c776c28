"""The trunk a run trains: built by the registry, given its pretrained weights, its BatchNorm frozen if asked.

`bench.training` and the floor (`bench.floor`, the untrained trunk as
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

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from bench.errors import BenchError


def trunk_from(name: str, in_shape: tuple[int, ...], embedding_dim: int, params: dict[str, Any],
               pretrained: str | None = None, freeze_bn: bool = False) -> nn.Module:
    """The registry's trunk ``name`` with ``model.pretrained`` loaded and ``model.freeze_bn`` applied.

    Loading draws no random numbers, so a seeded build gives the same head
    with or without pretrained weights.
    """
    from bench import registry
    from bench.models.weights import load_pretrained, resolve

    trunk = registry.build_trunk(name, in_shape=in_shape, embedding_dim=embedding_dim, **params)
    if pretrained is not None:
        load_pretrained(trunk, resolve(pretrained, name), name)
    if freeze_bn:
        freeze_batchnorm(trunk)
    return trunk


def protocol_trunk(doc: dict[str, Any], in_shape: tuple[int, ...]) -> nn.Module:
    """The trunk a protocol's ``model`` section names, as `trunk_from` builds it (the floor's trunk, and the
    check of a sweep's weights file before its first trial)."""
    from bench.protocol.schema import setting

    m = doc["model"]
    return trunk_from(m["trunk"], in_shape, m["embedding_dim"], dict(m["trunk_params"]),
                      setting(doc, "model.pretrained"), setting(doc, "model.freeze_bn"))


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
        raise BenchError(f"training.trunk_lr: trunk {type(trunk).__name__} has no embedding head (an `embed` "
                         "layer) to keep apart from the trunk: remove training.trunk_lr")
    return list(head.parameters())


def param_groups(trunk: nn.Module, others: list[nn.Parameter], lr: float,
                 trunk_lr: float | None) -> list[dict[str, Any]]:
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
    return [{"params": [p for p in params if id(p) in body], "lr": trunk_lr},
            {"params": [p for p in params if id(p) not in body], "lr": lr}]


def option_problems(name: str, in_shape: tuple[int, ...], embedding_dim: int, params: dict[str, Any],
                    pretrained: str | None, freeze_bn: bool, trunk_lr: float | None) -> dict[str, str]:
    """What is wrong with the trunk options, by dotted protocol key, found without touching a file.

    For `dmlbench validate` and `plan`: a ``hub`` spec the trunk has no
    published weights for, ``freeze_bn`` on a trunk without BatchNorm,
    ``trunk_lr`` on one without a head. Whether the weights file is there
    is checked when a run starts (a plan may be made on another machine).
    """
    from bench import registry
    from bench.models.backbones import published_weights
    from bench.models.weights import HUB

    problems = {}
    if pretrained is not None and (pretrained == HUB or pretrained.startswith(HUB + ":")):
        try:
            published_weights(name, pretrained.partition(":")[2] or None)
        except BenchError as e:
            problems["model.pretrained"] = str(e).removeprefix("model.pretrained: ")
    if freeze_bn or trunk_lr is not None:
        with torch.device("meta"):
            trunk = registry.build_trunk(name, in_shape=in_shape, embedding_dim=embedding_dim, **params)
        checks: list[tuple[str, Callable[[nn.Module], object]]] = [("model.freeze_bn", freeze_batchnorm)] \
            if freeze_bn else []
        checks += [("training.trunk_lr", head_parameters)] if trunk_lr is not None else []
        for key, check in checks:
            try:
                check(trunk)
            except BenchError as e:
                problems[key] = str(e).removeprefix(key + ": ")
    return problems
