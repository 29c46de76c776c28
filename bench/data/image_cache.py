"""The decoded-image cache (``data.loader.cache``): each file decoded once, kept as uint8 in a memory-mapped file.

A side's pipeline (``data.augment.train`` or ``.eval``) starts with a
*deterministic head*: its leading steps that draw no random number
(``Resize``, ``CenterCrop``, ``Pad``, ``Grayscale``; none at all when it
starts with a random crop). The cache holds every file of the dataset
decoded and passed through that head, as the uint8 (C, H, W) tensor the
pipeline would hold at that point; a run then reads it back and applies
only the rest of the pipeline. The images are therefore the same, bit for
bit, with and without the cache, and ``data.loader`` stays out of the
protocol's hash.

One cache serves every subset of a dataset (folds, test classes): entries
are found by the file's path. Its key is the content fingerprint of every
file (`bench.data.fingerprint`), the channel count, the head's steps and the
torchvision and Pillow versions, so a changed file, head or library builds
another cache. Files live in ``$DMLBENCH_CACHE/images/``: ``KEY.u8`` (the
images, back to back) and ``KEY.npz`` (sorted paths, byte offsets, shapes),
written last and atomically, so a killed build leaves no cache that looks
complete. Workers of a sweep that start together build it once: the first
holds a lock, the others wait and read it.

Memory stays bounded: the images are read through the operating system's
page cache, never loaded into a process, and the build writes one image at
a time. ``data.loader.cache_max_gb`` caps the file; a dataset whose decoded
head is larger is decoded from its files instead, with one warning, and a
marker keeps other processes from trying again under the same cap.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
from torch.utils.data import DataLoader, Dataset

from bench.atomic import write_npz
from bench.data.augment import build, head_length
from bench.data.cache import cache_dir
from bench.data.fingerprint import content_fingerprint
from bench.data.images import ImageFiles, eight_bit, open_image
from bench.data.loading import one_thread, worker_message
from bench.errors import BenchError
from bench.vision import torchvision

DEFAULT_MAX_GB = 64.0
FORMAT = 1  # bumped when the files' layout changes
_log = logging.getLogger("dmlbench.data")


class ImageCache:
    """One cache: the dataset's files through one deterministic head, built on `ensure`, read by `read`.

    Holds the full list of the dataset's paths (to build) and, once opened in
    a process, the memory map and its index. It is shared by the sides whose
    heads are equal, and travels to forked loader workers with `ImageFiles`;
    each process opens the files itself, on first use.
    """

    def __init__(self, files: ImageFiles, head: list[dict[str, dict[str, Any]]], max_gb: float) -> None:
        self.paths = files.paths  # the whole dataset: any subset's path is found in it
        self.channels = int(files.channels)
        self.head = head
        self.max_bytes = int(max_gb * 1e9)
        self.key = ""  # set by `ensure`, from the files' content
        self._files = files
        self._open: tuple[np.memmap, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._absent = False  # `ensure` found it over the cap or could not write it

    # ------------------------------------------------------------------ building

    def _key(self) -> str:
        tv = torchvision()
        blob = json.dumps(
            {
                "format": FORMAT,
                "files": content_fingerprint(self._files),
                "channels": self.channels,
                "head": self.head,
                "torchvision": getattr(tv, "__version__", ""),
                "pillow": PIL.__version__,
            },
            sort_keys=True,
        )
        return hashlib.blake2b(blob.encode(), digest_size=12).hexdigest()

    def _base(self) -> Path:
        return cache_dir() / "images" / self.key

    def ensure(self, workers: int = 0) -> bool:
        """Build the cache unless it exists (or is known to pass the cap); True when it can be read."""
        if self._open is not None:
            return True
        if self._absent:
            return False
        if not self.key:
            self.key = self._key()
        base = self._base()
        if _complete(base):
            return True
        over = base.with_suffix(".over")
        if over.is_file() and _int(over.read_text()) >= self.max_bytes:
            self._absent = True
            return False
        try:
            base.parent.mkdir(parents=True, exist_ok=True)
            with open(base.with_suffix(".lock"), "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another worker building it: wait, then read it
                if _complete(base):
                    return True
                built = self._build(base, workers)
        except OSError as err:
            _log.warning(
                f"decoded-image cache not written: {base}: {err.strerror or err} "
                "(images are decoded from their files; results are the same)"
            )
            self._absent = True
            return False
        if not built:
            self._absent = True
        return built

    def _build(self, base: Path, workers: int) -> bool:
        data_tmp = base.with_name(f"{base.name}.u8.{os.getpid()}.tmp")
        order = np.argsort(self.paths, kind="stable")
        paths = self.paths[order]
        offsets = np.zeros(len(paths), dtype=np.int64)
        shapes = np.zeros((len(paths), 3), dtype=np.int64)
        options: dict[str, Any] = {"batch_size": None, "num_workers": workers}
        if workers:
            options.update(worker_init_fn=one_thread, prefetch_factor=4)
        loader: DataLoader[torch.Tensor] = DataLoader(_HeadDataset(self._files, self.head, order), **options)
        written, start, last = 0, time.monotonic(), time.monotonic()
        try:
            with open(data_tmp, "wb") as out:
                for i, image in enumerate(loader):
                    array = image.numpy()
                    if written + array.nbytes > self.max_bytes:
                        base.with_suffix(".over").write_text(str(self.max_bytes))
                        _log.warning(
                            f"decoded-image cache skipped: the images pass data.loader.cache_max_gb "
                            f"({self.max_bytes / 1e9:g} GB) after {i:,} of {len(paths):,} files; they are "
                            "decoded from their files (results are the same)"
                        )
                        return False
                    offsets[i], shapes[i] = written, array.shape
                    out.write(array.tobytes())
                    written += array.nbytes
                    if time.monotonic() - last > 30:
                        last = time.monotonic()
                        _log.info(f"decoded-image cache: {i + 1:,}/{len(paths):,} files, {written / 1e9:.2f} GB")
                out.flush()
                os.fsync(out.fileno())
            os.replace(data_tmp, base.with_suffix(".u8"))
            write_npz(base.with_suffix(".npz"), paths=paths, offsets=offsets, shapes=shapes, size=np.array([written]))
        except BenchError as err:  # a corrupt file, named in one line as decoding it later would
            raise type(err)(worker_message(str(err))) from None
        finally:
            if data_tmp.exists():
                data_tmp.unlink()
        _log.info(
            f"decoded-image cache: {len(paths):,} files, {written / 1e9:.2f} GB in "
            f"{time.monotonic() - start:.0f} s at {base.with_suffix('.u8')}"
        )
        return True

    # ------------------------------------------------------------------ reading

    def ready(self) -> bool:
        """Whether this process reads from the cache: built (by any process) and openable."""
        if self._open is not None:
            return True
        if self._absent or not self.key:
            return False
        base = self._base()
        if not _complete(base):
            return False
        with np.load(base.with_suffix(".npz"), allow_pickle=False) as index:
            paths, offsets, shapes = index["paths"], index["offsets"], index["shapes"]
        self._open = (np.memmap(base.with_suffix(".u8"), dtype=np.uint8, mode="r"), paths, offsets, shapes)
        return True

    def read(self, path: str) -> torch.Tensor:
        """The file's image after the head: a uint8 (C, H, W) tensor (a copy, not a view of the map)."""
        assert self._open is not None
        data, paths, offsets, shapes = self._open
        row = int(np.searchsorted(paths, path))
        if row >= len(paths) or paths[row] != path:
            raise BenchError(f"decoded-image cache {self._base()}: no entry for {path}; delete the cache to rebuild")
        c, h, w = (int(v) for v in shapes[row])
        start = int(offsets[row])
        return torch.from_numpy(np.array(data[start : start + c * h * w]).reshape(c, h, w))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (spawned workers) without the open map: each process opens its own."""
        return {**self.__dict__, "_open": None}


class _HeadDataset(Dataset[torch.Tensor]):
    """File ``order[i]`` decoded and passed through the head, as uint8 (C, H, W): what the cache stores."""

    def __init__(self, files: ImageFiles, head: list[dict[str, dict[str, Any]]], order: np.ndarray) -> None:
        self.files, self.head, self.order = files, head, order
        self._pipeline: Any = None

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._pipeline is None:
            self._pipeline = build(self.head, "train", to_float=False)
        file = self.files.file(int(self.order[i]))
        with open_image(file) as img:
            pil = eight_bit(img, self.files.channels, file)
        return self._pipeline(pil).as_subclass(torch.Tensor).contiguous()


def _complete(base: Path) -> bool:
    """The index (written last) exists and the image file has the size it records."""
    index, data = base.with_suffix(".npz"), base.with_suffix(".u8")
    if not (index.is_file() and data.is_file()):
        return False
    try:
        with np.load(index, allow_pickle=False) as f:
            return int(f["size"][0]) == data.stat().st_size
    except Exception:  # noqa: BLE001 - a damaged index is no cache: it is rebuilt
        return False


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        return 0


def attach(files: ImageFiles, loader: Mapping[str, Any]) -> ImageFiles:
    """`files` with a cache for each side whose pipeline exists, when ``data.loader.cache`` is on.

    When one side's head starts the other's (CUB's ``Resize`` for training,
    ``Resize`` + ``CenterCrop`` for evaluation), both use the shorter one and
    share a cache: the images are stored once and the longer side runs its
    remaining head steps on them. A dataset without ``data.augment`` has
    nothing to cache: refused in one line.
    """
    if not loader.get("cache"):
        return files
    sides = {side: items for side, items in files.augment.items() if items}
    if not sides:
        raise BenchError(
            "data.loader.cache: the cache holds images through the start of data.augment, "
            "and this dataset has no data.augment pipeline (give one, or leave the cache off)"
        )
    max_gb = loader.get("cache_max_gb")
    max_gb = DEFAULT_MAX_GB if max_gb is None else float(max_gb)
    heads = {side: [dict(item) for item in items[: head_length(items)]] for side, items in sides.items()}
    if len(heads) == 2:
        short, long = sorted(heads.values(), key=len)
        if long[: len(short)] == short:
            heads = {side: short for side in heads}
    caches: dict[str, ImageCache] = {}
    by_head: dict[str, ImageCache] = {}
    for side, head in heads.items():
        name = json.dumps(head, sort_keys=True)
        if name not in by_head:
            by_head[name] = ImageCache(files, head, max_gb)
        caches[side] = by_head[name]
    return files.with_options(cache=caches)
