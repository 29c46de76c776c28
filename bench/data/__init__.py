"""Datasets as `LabeledData`, named by a spec string a protocol can hold.

``load("omniglot:background")`` and friends; `load_lake_runs` for Lake's
20 one-shot runs. A spec's dataset is looked up through `resolve_root`
(explicit root, ``$DMLBENCH_DATA``, ``../shared/data``, ``./data``);
``npz:PATH``, ``folder:PATH`` and ``csv:PATH#SPLIT`` (open-metric-learning's
listing, `bench.data.csv_listing`) name their file directly and ignore the
root: a relative PATH is relative to the current directory here, and to the
protocol file's folder in a protocol (`resolve_spec`, `bench.protocol.load`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.data import cars, cub, inshop, market, sop
from bench.data._layout import Layout
from bench.data.augment import normalise
from bench.data.cache import cache_dir
from bench.data.csv_listing import csv_index, split_spec
from bench.data.fashion_mnist import load_fashion_mnist
from bench.data.files import FileIndex, labeled_from_index
from bench.data.generic import load_folder, load_npz
from bench.data.image_cache import attach
from bench.data.images import ImageFiles
from bench.data.labeled import LabeledData, with_channels
from bench.data.omniglot import load_lake_runs, load_omniglot
from bench.data.roots import resolve_root
from bench.errors import BenchError

__all__ = [
    "ImageFiles",
    "LabeledData",
    "SPECS",
    "cache_dir",
    "check_path",
    "class_keys",
    "load",
    "load_lake_runs",
    "resolve_root",
    "resolve_spec",
]

_Loader = Callable[[str, "str | Path | None", int, str], LabeledData]

_NAMED: dict[str, _Loader] = {
    # square images: every resize mode is the same
    "omniglot:background": lambda _, root, size, __: load_omniglot("background", root, size),
    "omniglot:evaluation": lambda _, root, size, __: load_omniglot("evaluation", root, size),
    "fashion-mnist:train": lambda _, root, size, __: load_fashion_mnist("train", root, size),
    "fashion-mnist:test": lambda _, root, size, __: load_fashion_mnist("test", root, size),
}
_Reader = Callable[[Path, str], FileIndex]
_PathLoader = Callable[[str, "str | Path | None", int, str, "str | None"], LabeledData]


def _published(layout: Layout, read: _Reader, split: str) -> _Loader:
    """A spec's loader for one split of a published layout, found under the usual data roots."""
    return lambda _, root, size, resize: labeled_from_index(read(layout.find(root), split), size, resize, None)


_STANDARD: tuple[tuple[Layout, _Reader, tuple[str, ...]], ...] = (
    (cub.LAYOUT, cub.read_cub200, tuple(cub.SPLITS)),
    (cars.LAYOUT, cars.read_cars196, tuple(cars.SPLITS)),
    (sop.LAYOUT, sop.read_sop, sop.SPLITS),
    (inshop.LAYOUT, inshop.read_inshop, inshop.SPLITS),
    (market.LAYOUT, market.read_market1501, tuple(market.SPLITS)),
)
_NAMED.update(
    {
        f"{layout.family}:{split}": _published(layout, read, split)
        for layout, read, splits in _STANDARD
        for split in splits
    }
)
_PATHS: dict[str, _PathLoader] = {
    "npz": lambda path, _, size, resize, layout: load_npz(path, size, resize, layout),
    "folder": lambda path, _, size, resize, layout: load_folder(path, size, resize),
    "csv": lambda path, _, size, resize, layout: labeled_from_index(
        csv_index(*split_spec(path)), size, resize, scan_channels=True
    ),
}
SPECS = (*_NAMED, *(f"{kind}:PATH" if kind != "csv" else "csv:PATH#SPLIT" for kind in _PATHS))


def load(
    spec: str,
    root: str | Path | None = None,
    size: int | Sequence[int] = 28,
    resize: str = "stretch",
    channels: int | None = None,
    augment: Mapping[str, Any] | None = None,
    loader: Mapping[str, Any] | None = None,
    layout: str | None = None,
) -> LabeledData:
    """The dataset a spec names, images at ``size x size`` made square by `resize`, with `channels` (None: as stored).

    `layout` (``data.layout``) is how an ``npz:`` file's 4-D ``x`` is ordered (`bench.data.generic.check_layout`).

    `size` may be [height, width] for image files whose `augment` pipelines (both sides) end there.

    `augment` (``data.augment``) and `loader` (``data.loader``) apply to
    image files, read lazily; data held in memory refuses `augment`.
    """
    hw = _size_hw(size)
    if hw[0] != hw[1]:  # (height, width): image files whose pipelines end at that size
        data = load(spec, root, hw[0], resize, channels, augment, loader, layout)
        sides = normalise(augment)
        if not data.lazy or not (sides.get("train") and sides.get("eval")):
            raise BenchError(
                f"data.image_size {hw[0]}x{hw[1]} is not square: only image files with both "
                "data.augment.train and data.augment.eval, ending at that size, take it"
            )
        return replace(data, x=data.x.with_options(size=hw))
    size = hw[0]
    if spec in _NAMED:
        data = _NAMED[spec](spec, root, size, resize)
    else:
        kind, sep, path = spec.partition(":")
        if not (sep and kind in _PATHS and path):
            raise BenchError(f"unknown dataset spec {spec!r}: expected one of {', '.join(SPECS)}")
        data = _PATHS[kind](path, root, size, resize, layout)
    return _with_pipeline(with_channels(data, channels), spec, augment, loader)


def _size_hw(size: Any) -> tuple[int, int]:
    """A side, or [height, width]: positive integers, or one line."""
    parts = list(size) if isinstance(size, (list, tuple)) else [size]
    if len(parts) not in (1, 2) or any(not isinstance(p, int) or isinstance(p, bool) or p < 1 for p in parts):
        raise BenchError(f"image size must be a positive integer or [height, width], got {size!r}")
    return (parts[0], parts[-1])


def _with_pipeline(
    data: LabeledData, spec: str, augment: Mapping[str, Any] | None, loader: Mapping[str, Any] | None
) -> LabeledData:
    steps = normalise(augment)
    if not data.lazy:
        if steps:
            raise BenchError(
                f"data.augment: {spec} is held in memory as tensors, not read from image files: "
                "use data.augmentation (shift or affine) for it"
            )
        return data
    files = data.x.with_options(augment=steps, loader=dict(loader or {}))
    if files.loader.get("augment_on") == "device" and not steps.get("train"):
        raise BenchError(
            "data.loader.augment_on: device runs data.augment.train's random steps on the training device, "
            f"and {spec} has no data.augment.train (give one, or leave augment_on at workers)"
        )
    return replace(data, x=attach(files, files.loader))


def resolve_spec(spec: str, base: str | Path) -> str:
    """A ``folder:``/``npz:`` spec with its path made absolute: ``~`` expanded, a relative path joined to
    `base` (a protocol file's folder); any other spec as it is. The path is normalised, not resolved
    through symbolic links, so the spec still says the folder the user named."""
    kind, sep, path = spec.partition(":")
    if not sep or kind not in _PATHS or not path:
        return spec
    target = Path(path).expanduser()
    if not target.is_absolute():
        target = Path(base) / target
    return f"{kind}:{os.path.normpath(target)}"


def check_path(spec: str) -> None:
    """A ``folder:``/``npz:`` spec whose path is missing or unreadable is one line, without loading anything.

    What `plan` and `validate` check first, so a typo in a path is not
    reported with a class count of data that does not exist.
    """
    kind, sep, path = spec.partition(":")
    if not sep or kind not in _PATHS:
        return
    if kind == "csv":
        path, _ = split_spec(path)
    target = Path(path)
    want_dir = kind == "folder"
    if not target.exists():
        raise BenchError(f"{spec}: {'folder' if want_dir else 'file'} {target} does not exist")
    if want_dir != target.is_dir():
        raise BenchError(
            f"{spec}: {target} is {'a file' if want_dir else 'a folder'}, expected "
            f"{'a folder of class sub-folders' if want_dir else 'an .npz file' if kind == 'npz' else 'a CSV file'}"
        )
    if not os.access(target, os.R_OK | (os.X_OK if want_dir else 0)):
        raise BenchError(f"{spec}: {target} is not readable")


def class_keys(spec: str, data: LabeledData) -> dict[int, tuple[str, str]]:
    """Each class id's identity across datasets: (where the class comes from, its name).

    Two files of one's own each number their classes from 0, so ids alone
    cannot say whether a test class was seen in training. A file or folder
    is identified by its resolved path and a class by its folder name (or
    its id in an npz); a named dataset by its family (``omniglot``), whose
    ids are global (Omniglot's evaluation alphabets start at 964) or shared
    (Fashion-MNIST's train and test hold the same ten classes).
    """
    kind, _, path = spec.partition(":")
    if kind == "csv":  # one file's rows: its train and validation classes are one family, known by label
        path = path.rpartition("#")[0] or path
    origin = f"{kind}:{os.path.realpath(path)}" if kind in _PATHS else kind
    names = data.meta.get("class_names", {}) if kind in ("folder", "csv") else {}
    return {c: (origin, str(names.get(c, c))) for c in data.classes}
