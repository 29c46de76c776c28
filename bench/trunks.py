"""A trunk as a run builds it: the registry's network, its pretrained weights, BatchNorm frozen if asked.

`bench.training` and the floor (`bench.sweep.floor`, the untrained trunk as
scored) both build through `trunk_from`, so the floor of a pretrained
protocol is the pretrained trunk with its fresh head, as it must be. The
checks a protocol's trunk options get before anything runs (`check_size`,
`option_problems`) build it on PyTorch's meta device, so they cost no
memory and touch no file.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from bench import registry
from bench.errors import BenchError
from bench.models import check_embedding_dim, freeze_batchnorm, head_parameters
from bench.models.backbones import published_weights
from bench.models.weights import HUB, load_pretrained, resolve

__all__ = ["MAX_EMBEDDING_DIM", "MAX_PARAMETERS", "check_size", "option_problems", "trunk_from"]


MAX_EMBEDDING_DIM = 65_536  # far above any embedding in the literature (512-2048); 1e12 is a typo
MAX_PARAMETERS = 500_000_000  # 2 GB of float32 weights: more is a typo here, not a trunk this benchmark trains


def trunk_from(
    name: str,
    in_shape: tuple[int, ...],
    embedding_dim: int,
    params: dict[str, Any],
    pretrained: str | None = None,
    freeze_bn: bool = False,
) -> nn.Module:
    """The registry's trunk ``name`` with ``model.pretrained`` loaded and ``model.freeze_bn`` applied.

    Loading draws no random numbers, so a seeded build gives the same head
    with or without pretrained weights.
    """
    trunk = registry.build_trunk(name, in_shape=in_shape, embedding_dim=embedding_dim, **params)
    if pretrained is not None:
        load_pretrained(trunk, resolve(pretrained, name), name)
    if freeze_bn:
        freeze_batchnorm(trunk)
    return trunk


def check_size(name: str, in_shape: Sequence[int], embedding_dim: int, params: dict) -> None:
    """Refuse absurd trunk sizes before a byte is allocated: the trunk is built on PyTorch's meta device.

    A negative channel count or an embedding of 1e12 would otherwise fail
    (or exhaust memory) mid-run, after an MLflow run was opened.
    """
    check_embedding_dim(name, embedding_dim)
    if embedding_dim > MAX_EMBEDDING_DIM:
        raise BenchError(f"embedding_dim {embedding_dim} is absurd: expected at most {MAX_EMBEDDING_DIM}")
    try:
        # a layer of size 0 is refused below in one line; torch's warning about initialising it would be a second
        with torch.device("meta"), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op", UserWarning)
            trunk = registry.build_trunk(name, in_shape=tuple(in_shape), embedding_dim=embedding_dim, **params)
    except (RuntimeError, OverflowError, MemoryError) as e:
        raise BenchError(f"trunk {name!r} cannot be built with {params}: {str(e).splitlines()[0]}") from None
    if any(p.numel() == 0 for p in trunk.parameters()):
        raise BenchError(f"trunk {name!r} with {params} has a layer of size 0")
    count = sum(p.numel() for p in trunk.parameters())
    if count > MAX_PARAMETERS:
        raise BenchError(
            f"trunk {name!r} with {params or 'its defaults'} has {count:,} parameters: expected at "
            f"most {MAX_PARAMETERS:,} (a typo in a size?)"
        )


def option_problems(
    name: str,
    in_shape: tuple[int, ...],
    embedding_dim: int,
    params: dict[str, Any],
    pretrained: str | None,
    freeze_bn: bool,
    trunk_lr: float | None,
) -> dict[str, str]:
    """What is wrong with the trunk options, by dotted protocol key, found without touching a file.

    For `dmlbench validate` and `plan`: a ``hub`` spec the trunk has no
    published weights for, ``freeze_bn`` on a trunk without BatchNorm,
    ``trunk_lr`` on one without a head. Whether the weights file is there
    is checked when a run starts (a plan may be made on another machine).
    """
    problems = {}
    if pretrained is not None and (pretrained == HUB or pretrained.startswith(HUB + ":")):
        try:
            published_weights(name, pretrained.partition(":")[2] or None)
        except BenchError as e:
            problems["model.pretrained"] = str(e).removeprefix("model.pretrained: ")
    if freeze_bn or trunk_lr is not None:
        with torch.device("meta"):
            trunk = registry.build_trunk(name, in_shape=in_shape, embedding_dim=embedding_dim, **params)
        checks: list[tuple[str, Callable[[nn.Module], object]]] = (
            [("model.freeze_bn", freeze_batchnorm)] if freeze_bn else []
        )
        checks += [("training.trunk_lr", head_parameters)] if trunk_lr is not None else []
        for key, check in checks:
            try:
                check(trunk)
            except BenchError as e:
                problems[key] = str(e).removeprefix(key + ": ")
    return problems
