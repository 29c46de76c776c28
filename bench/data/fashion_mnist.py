"""Fashion-MNIST (Xiao et al. 2017) from the gzipped IDX files of its original release.

Looked up like any dataset (``<root>/fashion-mnist/``), then in the
folder the Debian package ``dataset-fashion-mnist`` installs. Pixels are
kept as released (garment bright on a dark ground), scaled to [0, 1].
Parsing takes about a second, so there is no on-disk cache.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from bench.data.labeled import LabeledData
from bench.data.resize import resize_area
from bench.data.roots import resolve_root
from bench.errors import BenchError

DATASET = "fashion-mnist"
SYSTEM_ROOT = Path("/usr/share/datasets")
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
CLASS_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip


def read_idx(path: Path) -> np.ndarray:
    """An unsigned-byte IDX array (the MNIST format: magic, big-endian dims, raw bytes)."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as err:
        raise BenchError(f"{path}: not a readable gzip file ({err})") from err
    if len(data) < 4 or data[0:2] != b"\x00\x00" or data[2] != 0x08:
        raise BenchError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    if len(data) - offset != int(np.prod(dims)):
        raise BenchError(f"{path}: holds {len(data) - offset} bytes of data, its header says {dims}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def load_fashion_mnist(split: str, root: str | Path | None = None, size: int = 28) -> LabeledData:
    """The train (60000) or test (10000) split as (N, 1, size, size) images, labels 0..9."""
    if split not in FILES:
        raise BenchError(f"unknown Fashion-MNIST split {split!r}: expected train or test")
    images_file, labels_file = FILES[split]
    base = (
        resolve_root(
            root, DATASET, FILES[split], extra_roots=(SYSTEM_ROOT,), hint="run `apt-get install dataset-fashion-mnist`"
        )
        / DATASET
    )
    images, labels = read_idx(base / images_file), read_idx(base / labels_file)
    if images.ndim != 3 or labels.shape != (images.shape[0],):
        raise BenchError(f"{base}: images {images.shape} and labels {labels.shape} do not match")
    x = resize_area(images[:, None], size, convert=lambda b: b.astype(np.float32) / 255.0)
    meta = {"class_names": dict(enumerate(CLASS_NAMES)), "source": str(base)}
    return LabeledData(torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64)), f"fashion-mnist:{split}", meta)
