"""ImageNet backbones as trunks: torchvision's ResNet-18/50 and any timm model, each with an embedding head.

The field's benchmarks (the Reality Check, Hermans et al.'s re-ID) take a
classification network, drop its classifier and put one linear layer from
the pooled features to the embedding (the Reality Check's "embedder": a
single Linear to 128). `Backbone` is exactly that: ``body`` (the network
without classifier, so its keys are those of the published weights) and
``embed`` (the head, the parameters ``training.trunk_lr`` keeps apart).

torchvision and timm are imported only when such a trunk is built, and
always through `bench.vision.torchvision` (see that module for why).
timm is an optional extra: naming a ``timm:<name>`` trunk without it is
one line saying how to install it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bench.errors import BenchError
from bench.models import _image_shape, _too_small, check_embedding_dim
from bench.vision import torchvision

RESNETS = ("resnet18", "resnet50")
TIMM_PREFIX = "timm:"
TIMM_INSTALL = "pip install 'dmlbench[timm]'"
# BN-Inception's published weights (bench.models.bninception): Cadene's pretrainedmodels file, sha256 52deb4733...
BNINCEPTION_FILE = "bn_inception-52deb4733.pth"
BNINCEPTION_URL = "http://data.lip6.fr/cadene/pretrainedmodels/" + BNINCEPTION_FILE
MIN_RESNET_SIDE = 32  # five stride-2 stages: 32x32 is the smallest input that keeps one pixel to the end


class Backbone(nn.Module):
    """A classification network without its classifier (``body``), then a linear head to the embedding.

    ``classifier`` is the prefix of the classifier's keys in the published
    weights (``fc`` for ResNets): those keys are expected in a weights file
    and skipped, every other key must match ``body``.
    """

    def __init__(self, name: str, body: nn.Module, features: int, embedding_dim: int, classifier: str) -> None:
        super().__init__()
        self.body = body
        self.embed = nn.Linear(features, check_embedding_dim(name, embedding_dim))
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images to (B, embedding_dim) raw embeddings; the protocol decides on normalising."""
        return self.embed(self.body(x))


def _resnet(arch: str, in_shape: tuple[int, ...], embedding_dim: int) -> Backbone:
    c, h, w = shape = _image_shape(arch, in_shape)
    if min(h, w) < MIN_RESNET_SIDE:
        raise _too_small(arch, shape, MIN_RESNET_SIDE)
    body = getattr(torchvision().models, arch)(weights=None)
    features = body.fc.in_features
    body.fc = nn.Identity()
    if c != 3:  # grey images: the same first layer for c channels (ImageNet weights then do not fit it)
        body.conv1 = nn.Conv2d(c, body.conv1.out_channels, 7, stride=2, padding=3, bias=False)
    return Backbone(arch, body, features, embedding_dim, "fc")


def resnet18(in_shape: tuple[int, ...], embedding_dim: int = 128) -> Backbone:
    """torchvision's ResNet-18 (He et al. 2016), 512 pooled features, then the embedding head."""
    return _resnet("resnet18", in_shape, embedding_dim)


def resnet50(in_shape: tuple[int, ...], embedding_dim: int = 128) -> Backbone:
    """torchvision's ResNet-50 (He et al. 2016), 2048 pooled features, then the embedding head
    (Hermans et al. 2017's re-ID trunk)."""
    return _resnet("resnet50", in_shape, embedding_dim)


def timm_module() -> Any:
    """The timm package, or a BenchError saying how to install it."""
    torchvision()
    try:
        import timm
    except ImportError:
        raise BenchError(f"timm trunks need timm: {TIMM_INSTALL}") from None
    return timm


def check_timm_name(model: str) -> None:
    """Refuse an unknown timm model name, or a missing timm, in one line."""
    timm = timm_module()
    if not model or not timm.is_model(model):
        raise BenchError(f"unknown timm model {model!r}: see timm.list_models() (timm {timm.__version__})")


def timm_trunk(model: str, in_shape: tuple[int, ...], embedding_dim: int = 128) -> Backbone:
    """``timm.create_model(model, pretrained=False, num_classes=0)`` (pooled features, no classifier), then the head.

    A model that cannot take this input (a ViT built for 224x224) is found
    here by a forward pass on the meta device, which allocates nothing.
    """
    name = TIMM_PREFIX + model
    c, h, w = _image_shape(name, in_shape)
    timm = timm_module()
    kwargs = {"pretrained": False, "num_classes": 0, "in_chans": c}
    body = timm.create_model(model, **kwargs)
    with torch.device("meta"):
        probe = timm.create_model(model, **kwargs)
        try:
            with torch.no_grad():
                probe.eval()(torch.empty(1, c, h, w))
        except (RuntimeError, ValueError, AssertionError) as e:
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise BenchError(f"input {h}x{w} does not fit trunk {name!r}: {first}") from None
    classifier = str(body.pretrained_cfg.get("classifier") or "")
    return Backbone(name, body, int(body.num_features), embedding_dim, classifier)


def __getattr__(attr: str) -> Callable[..., Backbone]:
    """``timm_<model>`` for any timm model name: the registry's target for a ``timm:<model>`` trunk.

    The registry imports trunks by ``module:attribute``; this binds the
    model name so the trunk's signature is that of every other trunk.
    """
    if not attr.startswith("timm_"):
        raise AttributeError(attr)
    return functools.partial(timm_trunk, attr[len("timm_") :])


def published_weights(trunk: str, variant: str | None = None) -> tuple[str, str]:
    """(file name in the torch hub cache, what it is) of a trunk's published ImageNet weights.

    torchvision's file names come from its weights enums (``variant`` one of
    their names, default the enum's DEFAULT); timm's from the model's
    pretrained config, where its weights are a plain download; BN-Inception's
    is Cadene's ``bn_inception-52deb4733.pth`` (no variants).
    """
    if trunk in RESNETS:
        enum = torchvision().models.get_model_weights(trunk)
        try:
            weights = enum.DEFAULT if variant is None else enum[variant]
        except KeyError:
            raise BenchError(
                f"model.pretrained: torchvision has no {variant!r} weights for {trunk}: expected one of "
                f"{', '.join(w.name for w in enum)}"
            ) from None
        arch = trunk.replace("resnet", "ResNet-")
        return weights.url.rsplit("/", 1)[-1], f"torchvision's {arch} weights ({weights.name})"
    if trunk == "bninception":
        if variant is not None:
            raise BenchError(
                f"model.pretrained: BN-Inception has one set of published weights: write hub, not hub:{variant}"
            )
        return BNINCEPTION_FILE, f"Cadene's pretrainedmodels BN-Inception ImageNet weights ({BNINCEPTION_URL})"
    if trunk.startswith(TIMM_PREFIX):
        model = trunk[len(TIMM_PREFIX) :] + (f".{variant}" if variant else "")
        check_timm_name(model)
        cfg = timm_module().models.get_pretrained_cfg(model)
        url = getattr(cfg, "url", None) if cfg is not None else None
        if not url:
            hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
            where = f" from the Hugging Face hub ({hub_id}, model.safetensors)" if hub_id else ""
            raise BenchError(
                f"model.pretrained: timm publishes {model}'s weights{where}, not in the torch hub "
                "cache: give the file's path"
            )
        return url.rsplit("/", 1)[-1], f"timm's {model} weights"
    raise BenchError(f"model.pretrained: trunk {trunk!r} has no published weights: give the path of a state_dict")
