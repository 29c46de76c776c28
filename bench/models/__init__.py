"""Trunks: the networks that map an input to its embedding.

Every trunk is built as ``Trunk(in_shape, embedding_dim=128, **own_params)``
with ``in_shape`` the shape of one sample, ``(C, H, W)`` or ``(D,)``, so the
training loop can build any of them from the data alone. Feature sizes are
computed from ``in_shape`` up front: an input too small for a trunk is a
`BenchError` at build time naming the smallest size that fits, never a shape
error in the middle of training.

Only the Omniglot encoder normalises its output (as in the experiment it
comes from); for the others, normalisation belongs to the protocol and the
losses (their ``normalize`` parameter), not to the trunk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from bench.errors import BenchError


def _image_shape(name: str, in_shape: Sequence[int]) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in in_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise BenchError(f"trunk {name!r} needs images (C, H, W), got input shape {shape}")
    return shape[0], shape[1], shape[2]


def check_embedding_dim(name: str, embedding_dim: int) -> int:
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 1:
        raise BenchError(f"trunk {name!r}: embedding_dim must be a positive integer, got {embedding_dim!r}")
    return embedding_dim


def _too_small(name: str, shape: tuple[int, int, int], needed: int, hint: str = "") -> BenchError:
    return BenchError(
        f"input {shape[1]}x{shape[2]} is too small for trunk {name!r}: it needs at least {needed}x{needed}{hint}"
    )


class Conv4(nn.Module):
    """The standard few-shot encoder (Vinyals et al. 2016; Snell et al. 2017).

    Four blocks halve the image each, so 28x28 ends as 64 x 1 x 1 and
    84x84 as 64 x 5 x 5; a linear layer maps the flattened features to the
    embedding (the few-shot papers use the features directly: the linear
    layer lets every trunk share one ``embedding_dim`` in a protocol).
    """

    def __init__(self, in_shape: tuple[int, ...], embedding_dim: int = 128, channels: int = 64):
        super().__init__()
        c, h, w = shape = _image_shape("conv4", in_shape)
        if min(h, w) < 16:
            raise _too_small("conv4", shape, 16)
        blocks: list[nn.Module] = []
        for i in range(4):
            blocks += [
                nn.Conv2d(c if i == 0 else channels, channels, 3, padding=1),
                nn.BatchNorm2d(channels),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
            h, w = h // 2, w // 2
        self.features = nn.Sequential(*blocks, nn.Flatten())
        self.embed = nn.Linear(channels * h * w, check_embedding_dim("conv4", embedding_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images to (B, embedding_dim) raw embeddings; the protocol decides on normalising."""
        return self.embed(self.features(x))


class LeCun2006(nn.Module):
    """The DrLIM network of Hadsell, Chopra and LeCun (2006).

    The paper feeds 32x32 images: 6x6 conv -> 27, average pool 3 -> 9,
    9x9 conv -> 1x1. MNIST and Omniglot at 28x28 are therefore zero-padded
    to ``pad_to`` (LeNet's convention) rather than changing the layers.
    The paper embeds in 2-D for its figures: pass ``embedding_dim=2``.
    """

    def __init__(self, in_shape: tuple[int, ...], embedding_dim: int = 128, pad_to: int = 32):
        super().__init__()
        c, h, w = shape = _image_shape("lecun2006", in_shape)
        self._pad = (0, 0, 0, 0)
        if min(h, w) < pad_to:
            ph, pw = max(pad_to - h, 0), max(pad_to - w, 0)
            self._pad = (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2)  # F.pad order: left, right, top, bottom
            h, w = max(h, pad_to), max(w, pad_to)
        h, w = (h - 5) // 3 - 8, (w - 5) // 3 - 8
        if min(h, w) < 1:
            raise _too_small("lecun2006", shape, 32, " (raise pad_to to 32)")
        self.features = nn.Sequential(
            nn.Conv2d(c, 15, 6),
            nn.ReLU(inplace=True),
            nn.AvgPool2d(3),
            nn.Conv2d(15, 30, 9),
            nn.ReLU(inplace=True),
            nn.Flatten(),
        )
        self.embed = nn.Linear(30 * h * w, check_embedding_dim("lecun2006", embedding_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images, zero-padded to ``pad_to`` when smaller, to (B, embedding_dim)."""
        if any(self._pad):
            x = F.pad(x, self._pad)
        return self.embed(self.features(x))


class OmniglotEncoder(nn.Module):
    """Craeymeersch's encoder from the quadruplet experiment on Omniglot.

    With the original unpadded ("valid") convolutions it needs 34x34 inputs
    at least; it was run on full-size 105x105 Omniglot. ``padding="same"``
    keeps the three convolutions size-preserving so that the same layers can
    join a 28x28 protocol. The output is L2-normalised, as in the original.
    """

    def __init__(self, in_shape: tuple[int, ...], embedding_dim: int = 128, padding: str = "valid"):
        super().__init__()
        c, h, w = shape = _image_shape("omniglot_encoder", in_shape)
        if padding not in ("valid", "same"):
            raise BenchError(f"trunk 'omniglot_encoder': padding must be 'valid' or 'same', got {padding!r}")
        if padding == "valid":
            h, w = ((h - 6) // 2 - 4) // 2 - 4, ((w - 6) // 2 - 4) // 2 - 4
            if min(h, w) < 1:
                raise _too_small("omniglot_encoder", shape, 34, " (or use padding='same')")
        else:
            h, w = h // 4, w // 4
            if min(h, w) < 1:
                raise _too_small("omniglot_encoder", shape, 4)
        self.features = nn.Sequential(
            nn.Conv2d(c, 128, 7, padding=padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(128, 128, 5, padding=padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(128, 64, 5, padding=padding),
            nn.ReLU(inplace=True),
            nn.Flatten(),
            nn.Linear(64 * h * w, 2048),
            nn.ReLU(inplace=True),
        )
        self.embed = nn.Linear(2048, check_embedding_dim("omniglot_encoder", embedding_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Unit-length embeddings, as Craeymeersch's encoder ends with an L2 normalisation."""
        return F.normalize(self.embed(self.features(x)), p=2, dim=1)


class MLP(nn.Module):
    """Linear layers with ReLU: the cheap trunk for vector data and quick protocols.

    Images are flattened, so the same MLP also serves as a fast baseline on
    Omniglot; ``hidden=()`` gives a purely linear embedding.
    """

    def __init__(self, in_shape: tuple[int, ...], embedding_dim: int = 128, hidden: Sequence[int] = (256,)):
        super().__init__()
        shape = tuple(int(s) for s in in_shape)
        if not shape or min(shape) < 1:
            raise BenchError(f"trunk 'mlp' needs a non-empty input shape, got {shape}")
        if isinstance(hidden, (str, bytes)) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in hidden
        ):
            raise BenchError(f"trunk 'mlp': hidden must be a list of positive integers, got {hidden!r}")
        sizes = [math.prod(shape), *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(sizes, sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        layers.append(nn.Linear(sizes[-1], check_embedding_dim("mlp", embedding_dim)))
        self.net = nn.Sequential(*layers)

    @property
    def embed(self) -> nn.Module:
        """The last linear layer, the head ``training.trunk_lr`` separates (a view: state_dict keys unchanged)."""
        return self.net[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, ...) inputs, flattened by the first layer, to (B, embedding_dim)."""
        return self.net(x)


# the trunk a run trains (weights, frozen BN, parameter groups): bench/models/trunk.py
from bench.models.trunk import freeze_batchnorm, head_parameters, param_groups  # noqa: E402

__all__ = [
    "MLP",
    "Conv4",
    "LeCun2006",
    "OmniglotEncoder",
    "check_embedding_dim",
    "freeze_batchnorm",
    "head_parameters",
    "param_groups",
]
