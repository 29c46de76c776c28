"""Augmentation named in a protocol (``data.augment``), built with torchvision's ``transforms.v2``.

A pipeline is a list of ``{ClassName: {kwargs}}`` (or a bare class name)
from `ALLOWED`, checked once at validate time: an unknown name or keyword,
or a value the class refuses, is one line naming it, not a failure inside a
data-loader worker an hour later. The list is written in the protocol, so
it is in the protocol's hash and manifest: every cell of a sweep sees the
same images. Images enter as uint8 tensors (`ToImage`) and leave as float32
in [0, 1] (`ToDtype`, put before the first `Normalize`, which needs floats).

Besides torchvision's classes, `OWN` lists dmlbench's own steps: ``BNInceptionInput``
(BN-Inception's Caffe input convention, BGR on the 0-255 scale minus its mean),
which takes the place of ``Normalize`` in a pipeline for that trunk.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from bench.errors import BenchError
from bench.vision import torchvision

ALLOWED = (
    "CenterCrop",
    "ColorJitter",
    "GaussianBlur",
    "Grayscale",
    "Normalize",
    "Pad",
    "RandomAffine",
    "RandomCrop",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomPerspective",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomVerticalFlip",
    "Resize",
)
OWN = ("BNInceptionInput",)  # dmlbench's own steps (below), usable like the torchvision ones
SIDES = ("train", "eval")
_NEEDS_FLOAT = ("Normalize", "BNInceptionInput")

Step = tuple[str, dict[str, Any]]


def normalise(augment: Mapping[str, Any] | None) -> dict[str, list[dict[str, dict[str, Any]]]]:
    """Each side as a list of one-key mappings ``{Name: {kwargs}}``: a bare name and ``{Name: {}}`` hash alike."""
    if augment is None:
        return {}
    if not isinstance(augment, Mapping):
        raise BenchError(f"data.augment: expected a mapping with train and/or eval lists, got {augment!r}")
    extra = sorted(set(augment) - set(SIDES))
    if extra:
        raise BenchError(f"data.augment: unknown key {extra[0]!r}: expected train and/or eval")
    out: dict[str, list[dict[str, dict[str, Any]]]] = {}
    for side in SIDES:
        if side in augment and augment[side] is not None:
            out[side] = [{name: dict(kwargs)} for name, kwargs in steps(augment[side], side)]
    return out


def steps(items: Any, side: str) -> list[Step]:
    """(name, kwargs) of each item of one side's list, with the shape of every item checked."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise BenchError(f"data.augment.{side}: expected a list of transforms, got {items!r}")
    out: list[Step] = []
    for i, item in enumerate(items):
        where = f"data.augment.{side}[{i}]"
        kwargs: Any
        if isinstance(item, str):
            name, kwargs = item, {}
        elif isinstance(item, Mapping) and len(item) == 1:
            name, kwargs = next(iter(item.items()))
            kwargs = {} if kwargs is None else kwargs
        else:
            raise BenchError(f"{where}: expected a transform name or {{Name: {{kwargs}}}}, got {item!r}")
        if name not in ALLOWED + OWN:
            raise BenchError(f"{where}: unknown transform {name!r}: expected one of {', '.join(ALLOWED + OWN)}")
        if not isinstance(kwargs, Mapping):
            raise BenchError(f"{where}: {name}'s arguments must be a mapping, got {kwargs!r}")
        out.append((str(name), dict(kwargs)))
    return out


def check(augment: Mapping[str, Any] | None) -> None:
    """Build every transform once, so a bad name, keyword or value is found before anything runs."""
    for side, items in normalise(augment).items():
        for i, item in enumerate(items):
            name, kwargs = next(iter(item.items()))
            _build_one(name, kwargs, f"data.augment.{side}[{i}]")


def _build_one(name: str, kwargs: dict[str, Any], where: str) -> Any:
    torchvision()
    from torchvision.transforms import v2

    cls = BNInceptionInput if name == "BNInceptionInput" else getattr(v2, name)
    allowed = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise BenchError(f"{where}: {name} has no parameter {unknown[0]!r} (parameters: {', '.join(allowed)})")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BenchError(f"{where}: {name}({_show(kwargs)}) refused: {message}") from None


class BNInceptionInput:
    """BN-Inception's input convention (Caffe's): RGB in [0, 1] to BGR on the 0-255 scale, minus ``mean``, over ``std``.

    Cadene's ``pretrainedmodels`` gives the published BN-Inception weights
    (`bench.models.bninception`) ``input_space: BGR``, ``input_range:
    [0, 255]``, ``mean: [104, 117, 128]``, ``std: [1, 1, 1]`` (``mean`` and
    ``std`` are per BGR channel, on the 0-255 scale): this step, in place of
    ``Normalize``, feeds it what it was trained on. It takes float images
    with 3 channels in [0, 1] (the pipeline converts before it, as for
    ``Normalize``); any other channel count is refused, in one line.
    """

    def __init__(self, mean: Sequence[float] = (104.0, 117.0, 128.0), std: Sequence[float] = (1.0, 1.0, 1.0)) -> None:
        for key, value in (("mean", mean), ("std", std)):
            if (
                isinstance(value, (str, bytes))
                or not isinstance(value, Sequence)
                or len(value) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            ):
                raise ValueError(f"{key} must be 3 numbers (B, G, R on the 0-255 scale), got {value!r}")
        if any(v <= 0 for v in std):
            raise ValueError(f"std must be positive, got {list(std)!r}")
        self.mean = [float(v) for v in mean]
        self.std = [float(v) for v in std]

    def __call__(self, image: Any) -> Any:
        if not isinstance(image, torch.Tensor) or image.ndim < 3 or image.shape[-3] != 3:
            shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
            raise BenchError(f"BNInceptionInput needs RGB images (3, H, W), got {shape}")
        bgr = image.as_subclass(torch.Tensor).flip(-3) * 255.0
        mean = torch.tensor(self.mean, dtype=bgr.dtype, device=bgr.device).view(3, 1, 1)
        std = torch.tensor(self.std, dtype=bgr.dtype, device=bgr.device).view(3, 1, 1)
        return (bgr - mean) / std

    def __repr__(self) -> str:
        return f"BNInceptionInput(mean={self.mean}, std={self.std})"


def _show(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


# Steps that draw no random number: a pipeline's leading run of them is its deterministic head, what the
# decoded-image cache stores (`bench.data.image_cache`) and what loader workers send to the device when the
# random rest runs there (``data.loader.augment_on: device``)
DETERMINISTIC = ("Resize", "CenterCrop", "Pad", "Grayscale")


def head_length(items: Sequence[Mapping[str, Any]]) -> int:
    """How many leading steps of a pipeline draw no random number (its deterministic head)."""
    count = 0
    for item in items:
        if next(iter(item)) not in DETERMINISTIC:
            break
        count += 1
    return count


def build(items: Sequence[Mapping[str, Mapping[str, Any]]], side: str, to_float: bool = True) -> Any:
    """The v2 pipeline of one side: ToImage, the named transforms, ToDtype(float32) before Normalize or at the end.

    ``to_float=False`` leaves out the ToDtype: the uint8 images a deterministic head gives
    (`bench.data.image_cache`), for steps that need no floats.
    """
    torchvision()
    from torchvision.transforms import v2

    built: list[Any] = [v2.ToImage()]
    convert = v2.ToDtype(torch.float32, scale=True) if to_float else None
    for i, item in enumerate(items):
        name, kwargs = next(iter(item.items()))
        if name in _NEEDS_FLOAT:
            if not to_float:
                raise BenchError(f"data.augment.{side}[{i}]: {name} needs float images, here still uint8")
            if convert is not None:
                built.append(convert)
                convert = None
        built.append(_build_one(name, dict(kwargs), f"data.augment.{side}[{i}]"))
    if convert is not None:
        built.append(convert)
    return v2.Compose(built)
