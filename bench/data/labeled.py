"""The container every dataset reader returns: images or vectors, int64 labels, per-sample facts.

`LabeledData.x` is a float32 tensor in [0, 1] or `ImageFiles` decoded on
demand (`lazy`); `with_channels` gives train and test one channel count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from bench.data.images import ImageFiles
from bench.errors import BenchError


@dataclass(frozen=True, eq=False)
class LabeledData:
    """Samples and their global class ids, the unit every later stage consumes.

    Class ids are global (Omniglot evaluation starts at 964), so that a
    subset keeps the ids a split or a record names. `meta` holds per-class
    information keyed by those same ids (``alphabet``, ``class_names``),
    which therefore stays valid in any subset; `per_sample` holds facts about
    each sample beside its label (Market-1501's ``camera``), subset with it.
    `x` is a float32 tensor held in memory, or `bench.data.images.ImageFiles`
    for image files decoded lazily: both index, subset and report a shape alike.
    """

    x: Any  # torch.Tensor | ImageFiles
    y: torch.Tensor
    name: str
    meta: dict[str, Any] = field(default_factory=dict)
    per_sample: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lazy:
            if not isinstance(self.x, torch.Tensor) or self.x.dtype != torch.float32:
                raise BenchError(f"{self.name}: x must be a float32 tensor or image files, got {_describe(self.x)}")
            if self.x.dim() not in (2, 4):
                raise BenchError(f"{self.name}: x must have shape (N, C, H, W) or (N, D), got {tuple(self.x.shape)}")
        if not isinstance(self.y, torch.Tensor) or self.y.dtype != torch.int64:
            raise BenchError(f"{self.name}: y must be an int64 tensor, got {_describe(self.y)}")
        if self.y.shape != (self.x.shape[0],):
            raise BenchError(f"{self.name}: y must have shape (N,) = ({self.x.shape[0]},), got {tuple(self.y.shape)}")
        for key, values in self.per_sample.items():
            if not isinstance(values, torch.Tensor) or values.shape[:1] != self.y.shape:
                raise BenchError(f"{self.name}: per_sample[{key!r}] must be a tensor of {len(self.y)} values")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def lazy(self) -> bool:
        """Whether `x` is image files decoded on demand rather than a tensor in memory."""
        return isinstance(self.x, ImageFiles)

    @property
    def classes(self) -> tuple[int, ...]:
        """The sorted class ids present, as plain ints (what splits and fingerprints take)."""
        return tuple(int(c) for c in torch.unique(self.y).tolist())

    def subset(self, classes: Iterable[int]) -> LabeledData:
        """Keep the samples of `classes`; a class that is absent is an error, not a silent no-op.

        A split that names a class the data lacks means the split was made for
        other data, which would silently shrink a test set.
        """
        wanted = sorted({int(c) for c in classes})
        missing = sorted(set(wanted) - set(self.classes))
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            raise BenchError(f"{self.name}: subset names {len(missing)} class(es) not in the data: {shown}")
        mask = torch.isin(self.y, torch.tensor(wanted, dtype=torch.int64))
        return self.where(mask)

    def where(self, mask: torch.Tensor) -> LabeledData:
        """The samples a boolean mask (or index tensor) selects, with their per-sample facts."""
        return LabeledData(
            self.x[mask], self.y[mask], self.name, dict(self.meta), {k: v[mask] for k, v in self.per_sample.items()}
        )


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of {value.dtype}"
    return type(value).__name__


def with_channels(data: LabeledData, channels: int | None) -> LabeledData:
    """Images with `channels` channels: grey repeated to RGB, RGB to grey by ITU-R 601 luma; None keeps them.

    Applied the same way to train and test, so a colour train set and a grey
    test set meet the trunk with one shape instead of crashing after training.
    """
    if channels is None or data.x.dim() != 4 or data.x.shape[1] == channels:
        return data
    have = int(data.x.shape[1])
    if data.lazy:  # decoded to `channels` when read
        return replace(data, x=data.x.with_options(channels=channels))
    if channels == 3 and have == 1:
        x = data.x.repeat(1, 3, 1, 1)
    elif channels == 1 and have == 3:
        weights = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float32).view(1, 3, 1, 1)
        x = (data.x * weights).sum(dim=1, keepdim=True).clamp_(0.0, 1.0)
    else:
        raise BenchError(f"{data.name}: cannot turn {have}-channel images into {channels} channels")
    return replace(data, x=x.contiguous(), meta=dict(data.meta))
