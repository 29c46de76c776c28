"""Datasets that are folders of image files, as their publishers ship them.

A reader of a published layout (CUB-200-2011, Cars196, SOP, In-shop,
Market-1501) only parses index files into a `FileIndex`; decoding and
augmenting happen later, lazily, in data-loader workers, so that memory
does not grow with the number of images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.data.images import ImageFiles, image_channels
from bench.data.labeled import LabeledData
from bench.errors import BenchError


@dataclass(frozen=True)
class FileIndex:
    """What a dataset's index files say: one image file per sample, its global class id, per-sample facts.

    `paths` are relative to `root`; `labels` are global class ids (a test
    class keeps its id in every split, as with Omniglot), `per_sample` holds
    facts a metric needs beside the label (Market-1501's ``camera``), each
    as long as `paths`; `class_names` maps ids to the publisher's names.
    """

    root: Path
    paths: tuple[str, ...]
    labels: tuple[int, ...]
    name: str
    per_sample: dict[str, tuple[int, ...]] = field(default_factory=dict)
    class_names: dict[int, str] = field(default_factory=dict)
    skipped: int = 0  # files left out by the reader's rule (a folder's non-image files)

    def __post_init__(self) -> None:
        if len(self.paths) != len(self.labels):
            raise ValueError(f"{self.name}: {len(self.paths)} paths but {len(self.labels)} labels")
        for key, values in self.per_sample.items():
            if len(values) != len(self.paths):
                raise ValueError(
                    f"{self.name}: per_sample[{key!r}] has {len(values)} values for {len(self.paths)} paths"
                )


def labeled_from_index(
    index: FileIndex,
    size: int = 28,
    resize: str = "stretch",
    channels: int | None = None,
    *,
    scan_channels: bool = False,
) -> LabeledData:
    """The dataset an index describes, as `LabeledData` whose ``x`` is lazy `ImageFiles` (nothing decoded).

    `channels` None is RGB (3), what the published photo sets are, unless
    `scan_channels` reads every file's header (not its pixels) and keeps one
    channel when no file is in colour, as the in-memory folder loader did.
    Labels stay the index's global ids; `per_sample` facts become int64
    tensors that follow every subset.
    """
    if not index.paths:
        raise BenchError(f"{index.name}: the index lists no images")
    if channels is None:
        channels = _scan_channels(index) if scan_channels else 3
    files = ImageFiles(Path(index.root), np.asarray(index.paths, dtype=str), size, resize, channels)
    per_sample = {k: torch.tensor(v, dtype=torch.int64) for k, v in index.per_sample.items()}
    meta: dict[str, Any] = {"source": str(index.root)}
    if index.class_names:
        meta["class_names"] = dict(index.class_names)
    if index.skipped:
        meta["skipped_files"] = index.skipped
    return LabeledData(files, torch.tensor(index.labels, dtype=torch.int64), index.name, meta, per_sample)


def _scan_channels(index: FileIndex) -> int:
    """3 when any file is in colour, else 1; every file is opened (header only), so a stray one is named now."""
    colour = False
    for path in index.paths:
        colour = image_channels(Path(index.root) / path) == 3 or colour
    return 3 if colour else 1
