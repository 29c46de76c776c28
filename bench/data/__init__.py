"""Datasets as `LabeledData`, named by a spec string a protocol can hold.

``load("omniglot:background")`` and friends; `load_lake_runs` for Lake's
20 one-shot runs. A spec's dataset is looked up through `resolve_root`
(explicit root, ``$DMLBENCH_DATA``, ``../shared/data``, ``./data``);
``npz:PATH`` and ``folder:PATH`` name their file directly (relative to the
current directory) and ignore the root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from bench.data._core import LabeledData, cache_dir, resolve_root, with_channels
from bench.data.fashion_mnist import load_fashion_mnist
from bench.data.generic import load_folder, load_npz
from bench.data.omniglot import load_lake_runs, load_omniglot
from bench.errors import BenchError

__all__ = ["LabeledData", "SPECS", "cache_dir", "check_path", "class_keys", "load", "load_lake_runs", "resolve_root"]

_Loader = Callable[[str, "str | Path | None", int, str], LabeledData]

_NAMED: dict[str, _Loader] = {
    # square images: every resize mode is the same
    "omniglot:background": lambda _, root, size, __: load_omniglot("background", root, size),
    "omniglot:evaluation": lambda _, root, size, __: load_omniglot("evaluation", root, size),
    "fashion-mnist:train": lambda _, root, size, __: load_fashion_mnist("train", root, size),
    "fashion-mnist:test": lambda _, root, size, __: load_fashion_mnist("test", root, size),
}
_PATHS: dict[str, _Loader] = {
    "npz": lambda path, _, size, resize: load_npz(path, size, resize),
    "folder": lambda path, _, size, resize: load_folder(path, size, resize),
}
SPECS = (*_NAMED, *(f"{kind}:PATH" for kind in _PATHS))


def load(spec: str, root: str | Path | None = None, size: int = 28, resize: str = "stretch",
         channels: int | None = None) -> LabeledData:
    """The dataset a spec names, images at ``size x size`` made square by `resize`, with `channels` (None: as stored)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise BenchError(f"image size must be a positive integer, got {size!r}")
    if spec in _NAMED:
        return with_channels(_NAMED[spec](spec, root, size, resize), channels)
    kind, sep, path = spec.partition(":")
    if sep and kind in _PATHS and path:
        return with_channels(_PATHS[kind](path, root, size, resize), channels)
    raise BenchError(f"unknown dataset spec {spec!r}: expected one of {', '.join(SPECS)}")


def check_path(spec: str) -> None:
    """A ``folder:``/``npz:`` spec whose path is missing or unreadable is one line, without loading anything.

    What `plan` and `validate` check first, so a typo in a path is not
    reported with a class count of data that does not exist.
    """
    kind, sep, path = spec.partition(":")
    if not sep or kind not in _PATHS:
        return
    target = Path(path)
    want_dir = kind == "folder"
    if not target.exists():
        raise BenchError(f"{spec}: {'folder' if want_dir else 'file'} {target} does not exist")
    if want_dir != target.is_dir():
        raise BenchError(f"{spec}: {target} is {'a file' if want_dir else 'a folder'}, expected "
                         f"{'a folder of class sub-folders' if want_dir else 'an .npz file'}")
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
    origin = f"{kind}:{os.path.realpath(path)}" if kind in _PATHS else kind
    names = data.meta.get("class_names", {}) if kind == "folder" else {}
    return {c: (origin, str(names.get(c, c))) for c in data.classes}
