"""BN-Inception (Ioffe and Szegedy 2015), the Reality Check's trunk, under the names of its published weights.

The Reality Check (Musgrave et al. 2020) and most DML papers of 2017-2020
train Inception with BatchNorm as ported from Caffe by Cadene's
``pretrainedmodels`` (``bninception``). This is that network written out
here: every convolution is followed by BatchNorm and ReLU, and its layers
carry the port's names (``conv1_7x7_s2``, ``conv1_7x7_s2_bn``, ...,
``inception_5b_pool_proj_bn``), so the published ImageNet weights
(``bn_inception-52deb4733.pth``) load key for key into ``body``; their
classifier (``last_linear``, 1024 -> 1000) is dropped, as a `Backbone`
drops a ResNet's ``fc``.

Rules the port fixes and this module keeps:

* convolutions have biases; BatchNorm has eps 1e-5 and affine parameters;
* max pools round up (``ceil_mode``); the 3x3 average pools of the
  branches count the zero padding;
* the last Inception block (5b) pools with a stride-1 max pool, the
  others' pool branches use a stride-1 average pool, and the two
  down-sampling blocks (3c, 4e) have no 1x1 branch and pass their
  stride-2 max pool through without projection;
* at 224x224 or 227x227 the last feature map is 7x7 and the port's
  ``AvgPool2d(7)`` is the global average this module takes (adaptive, so
  every side `side_fits` accepts works), giving 1024 features.

Two things differ from the port, neither of which changes a weight: the
published file stores BatchNorm tensors as ``(1, C)`` (a PyTorch 0.2-era
layout that later PyTorch refuses), which `fit_published` reshapes to
``(C,)``; and BatchNorm's momentum is PyTorch's default 0.1, where the port
wrote Caffe's 0.9 into PyTorch's opposite convention (a frozen BatchNorm,
the Reality Check's setting, never updates its statistics either way).

The input convention is Caffe's: BGR channels on the 0-255 scale minus the
mean [104, 117, 128], std 1; a protocol gives it with the ``BNInceptionInput``
step of ``data.augment`` (`bench.data.augment`, whose defaults they are), in place of ``Normalize``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from bench.errors import BenchError
from bench.models import _image_shape, _too_small
from bench.models.backbones import BNINCEPTION_FILE, Backbone

FEATURES = 1024
CLASSIFIER = "last_linear"  # the published classifier's key prefix, dropped when the weights load
WEIGHTS_FILE = BNINCEPTION_FILE  # Cadene's pretrainedmodels file (sha256 52deb473314542a5...)
MIN_SIDE = 31  # the smallest side with a feature map left after block 5b

# name: (in, 1x1, 3x3 reduce, 3x3, double 3x3 reduce, double 3x3, pool, pool projection, stride)
# 1x1 = 0: no 1x1 branch; projection = 0: the pool's output passes as it is (the stride-2 blocks).
_BLOCKS: tuple[tuple[str, int, int, int, int, int, int, str, int, int], ...] = (
    ("3a", 192, 64, 64, 64, 64, 96, "avg", 32, 1),
    ("3b", 256, 64, 64, 96, 64, 96, "avg", 64, 1),
    ("3c", 320, 0, 128, 160, 64, 96, "max", 0, 2),
    ("4a", 576, 224, 64, 96, 96, 128, "avg", 128, 1),
    ("4b", 576, 192, 96, 128, 96, 128, "avg", 128, 1),
    ("4c", 576, 160, 128, 160, 128, 160, "avg", 128, 1),
    ("4d", 608, 96, 128, 192, 160, 192, "avg", 128, 1),
    ("4e", 608, 0, 128, 192, 192, 256, "max", 0, 2),
    ("5a", 1056, 352, 192, 320, 160, 224, "avg", 128, 1),
    ("5b", 1024, 352, 192, 320, 192, 224, "max", 128, 1),
)


class BNInceptionBody(nn.Module):
    """BN-Inception up to its global pool: (B, 3, H, W) BGR 0-255 images to (B, 1024) features.

    Layers are attributes named as in the published weights; `layer_shapes`
    lists them. Forward: conv -> BN -> ReLU everywhere, Inception blocks
    concatenate their branches in the order 1x1, 3x3, double 3x3, pool.
    """

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        self._conv("conv1_7x7_s2", in_channels, 64, 7, stride=2, padding=3)
        self._conv("conv2_3x3_reduce", 64, 64, 1)
        self._conv("conv2_3x3", 64, 192, 3, padding=1)
        for name, cin, c1, r3, c3, rd, cd, _pool, proj, stride in _BLOCKS:
            p = f"inception_{name}_"
            if c1:
                self._conv(p + "1x1", cin, c1, 1)
            self._conv(p + "3x3_reduce", cin, r3, 1)
            self._conv(p + "3x3", r3, c3, 3, stride=stride, padding=1)
            self._conv(p + "double_3x3_reduce", cin, rd, 1)
            self._conv(p + "double_3x3_1", rd, cd, 3, padding=1)
            self._conv(p + "double_3x3_2", cd, cd, 3, stride=stride, padding=1)
            if proj:
                self._conv(p + "pool_proj", cin, proj, 1)

    def _conv(self, name: str, cin: int, cout: int, k: int, stride: int = 1, padding: int = 0) -> None:
        self.add_module(name, nn.Conv2d(cin, cout, k, stride=stride, padding=padding))
        self.add_module(name + "_bn", nn.BatchNorm2d(cout, eps=1e-5))

    def _cbr(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return F.relu(getattr(self, name + "_bn")(getattr(self, name)(x)), inplace=True)

    def _block(self, spec: tuple, x: torch.Tensor) -> torch.Tensor:
        name, _cin, c1, _r3, _c3, _rd, _cd, pool, proj, stride = spec
        p = f"inception_{name}_"
        out = [self._cbr(p + "1x1", x)] if c1 else []
        out.append(self._cbr(p + "3x3", self._cbr(p + "3x3_reduce", x)))
        d = self._cbr(p + "double_3x3_1", self._cbr(p + "double_3x3_reduce", x))
        out.append(self._cbr(p + "double_3x3_2", d))
        if pool == "avg":
            pooled = F.avg_pool2d(x, 3, stride=1, padding=1, ceil_mode=True, count_include_pad=True)
        elif stride == 2:
            pooled = F.max_pool2d(x, 3, stride=2, ceil_mode=True)
        else:
            pooled = F.max_pool2d(x, 3, stride=1, padding=1, ceil_mode=True)
        out.append(self._cbr(p + "pool_proj", pooled) if proj else pooled)
        return torch.cat(out, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) images in BN-Inception's input convention to (B, 1024) globally average-pooled features."""
        x = F.max_pool2d(self._cbr("conv1_7x7_s2", x), 3, stride=2, ceil_mode=True)
        x = self._cbr("conv2_3x3", self._cbr("conv2_3x3_reduce", x))
        x = F.max_pool2d(x, 3, stride=2, ceil_mode=True)
        for spec in _BLOCKS:
            x = self._block(spec, x)
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)


def layer_shapes(in_channels: int = 3) -> dict[str, tuple[int, ...]]:
    """Every state_dict key of the body and its shape, computed without allocating (meta device)."""
    with torch.device("meta"):
        body = BNInceptionBody(in_channels)
    return {k: tuple(v.shape) for k, v in body.state_dict().items()}


def fit_published(state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The published file's tensors in the body's shapes: ``(1, C)`` BatchNorm tensors become ``(C,)``.

    Only that reshape, and only where the element count is the same and the
    key is a BatchNorm layer's (``*_bn.*``): any other difference is left
    for the loader to report.
    """
    out = dict(state)
    for key, value in state.items():
        target = own.get(key)
        if (
            target is not None
            and "_bn." in key
            and value.ndim == 2
            and value.shape[0] == 1
            and tuple(target.shape) == (value.shape[1],)
        ):
            out[key] = value.reshape(-1)
    return out


def _conv_out(n: int, k: int, s: int, p: int) -> int:
    return (n + 2 * p - k) // s + 1


def _pool_out(n: int) -> int:
    """A 3x3 stride-2 max pool with ``ceil_mode`` (PyTorch's rule: the last window starts inside the input)."""
    out = -(-(n - 3) // 2) + 1
    return out - 1 if (out - 1) * 2 >= n else out


def side_fits(side: int) -> bool:
    """Whether BN-Inception takes images ``side`` pixels wide (or high).

    Blocks 3c and 4e concatenate a stride-2 convolution (padded, rounding
    down) with a stride-2 max pool (unpadded, rounding up): their maps agree
    only when the block's input side is even, which holds for sides
    32k - 1 .. 32k + 6 (224 and 227 among them) and no others.
    """
    n = _pool_out(_pool_out(_conv_out(side, 7, 2, 3)))
    for _ in range(2):  # blocks 3c and 4e
        if n < 1 or _conv_out(n, 3, 2, 1) != _pool_out(n):
            return False
        n = _pool_out(n)
    return n >= 1


def _nearest(side: int) -> str:
    below = next((n for n in range(side, MIN_SIDE - 1, -1) if side_fits(n)), None)
    above = next(n for n in range(side, side + 64) if side_fits(n))
    return " or ".join(str(n) for n in (below, above) if n is not None)


def bninception(in_shape: tuple[int, ...], embedding_dim: int = 128) -> nn.Module:
    """BN-Inception without classifier (1024 pooled features), then the linear embedding head (a `Backbone`).

    Sides must satisfy `side_fits` (224 and 227 do); the published weights need 3 channels
    (grey images build a first layer for 1 channel, which those weights do
    not fit).
    """
    c, h, w = shape = _image_shape("bninception", in_shape)
    if min(h, w) < MIN_SIDE:
        raise _too_small("bninception", shape, MIN_SIDE)
    for side in (h, w):
        if not side_fits(side):
            raise BenchError(
                f"input {h}x{w} does not fit trunk 'bninception': its stride-2 blocks (3c, 4e) need sides of "
                f"32k-1 to 32k+6 pixels (224, 227, 64, ...): use {_nearest(side)} instead of {side}"
            )
    return Backbone("bninception", BNInceptionBody(c), FEATURES, embedding_dim, CLASSIFIER)


__all__ = [
    "BNInceptionBody",
    "CLASSIFIER",
    "FEATURES",
    "WEIGHTS_FILE",
    "bninception",
    "fit_published",
    "layer_shapes",
    "side_fits",
]
