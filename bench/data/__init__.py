"""Datasets as `LabeledData`, named by a spec string a protocol can hold.

``load("omniglot:background")`` and friends; `load_lake_runs` for Lake's
20 one-shot runs. A spec's dataset is looked up through `resolve_root`
(explicit root, ``$DMLBENCH_DATA``, ``../shared/data``, ``./data``);
``npz:PATH`` and ``folder:PATH`` name their file directly (relative to the
current directory) and ignore the root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bench.data._core import LabeledData, cache_dir, resolve_root
from bench.data.fashion_mnist import load_fashion_mnist
from bench.data.generic import load_folder, load_npz
from bench.data.omniglot import load_lake_runs, load_omniglot
from bench.errors import BenchError

__all__ = ["LabeledData", "SPECS", "cache_dir", "load", "load_lake_runs", "resolve_root"]

_Loader = Callable[[str, "str | Path | None", int], LabeledData]

_NAMED: dict[str, _Loader] = {
    "omniglot:background": lambda _, root, size: load_omniglot("background", root, size),
    "omniglot:evaluation": lambda _, root, size: load_omniglot("evaluation", root, size),
    "fashion-mnist:train": lambda _, root, size: load_fashion_mnist("train", root, size),
    "fashion-mnist:test": lambda _, root, size: load_fashion_mnist("test", root, size),
}
_PATHS: dict[str, _Loader] = {
    "npz": lambda path, _, size: load_npz(path, size),
    "folder": lambda path, _, size: load_folder(path, size),
}
SPECS = (*_NAMED, *(f"{kind}:PATH" for kind in _PATHS))


def load(spec: str, root: str | Path | None = None, size: int = 28) -> LabeledData:
    """The dataset a spec names, images at ``size x size``."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise BenchError(f"image size must be a positive integer, got {size!r}")
    if spec in _NAMED:
        return _NAMED[spec](spec, root, size)
    kind, sep, path = spec.partition(":")
    if sep and kind in _PATHS and path:
        return _PATHS[kind](path, root, size)
    raise BenchError(f"unknown dataset spec {spec!r}: expected one of {', '.join(SPECS)}")
