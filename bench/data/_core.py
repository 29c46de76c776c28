"""What every dataset of dmlbench shares: the container, where data lives, the cache, resizing.

Each loader returns a `LabeledData`, finds its files through `resolve_root`,
resizes through `resize_area` (so the same pixels give the same tensors,
whichever file format they came from) and keeps expensive preprocessing in
`cached_arrays`.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from bench.atomic import atomic_file
from bench.errors import BenchError

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA_REL = Path("..") / "shared" / "data"


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
            raise BenchError(
                f"{self.name}: y must have shape (N,) = ({self.x.shape[0]},), got {tuple(self.y.shape)}"
            )
        for key, values in self.per_sample.items():
            if not isinstance(values, torch.Tensor) or values.shape[:1] != self.y.shape:
                raise BenchError(f"{self.name}: per_sample[{key!r}] must be a tensor of {len(self.y)} values")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def lazy(self) -> bool:
        """Whether `x` is image files decoded on demand rather than a tensor in memory."""
        from bench.data.images import ImageFiles

        return isinstance(self.x, ImageFiles)

    @property
    def classes(self) -> tuple[int, ...]:
        """The sorted class ids present, as plain ints (what splits and fingerprints take)."""
        return tuple(int(c) for c in torch.unique(self.y).tolist())

    def subset(self, classes: Iterable[int]) -> "LabeledData":
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

    def where(self, mask: torch.Tensor) -> "LabeledData":
        """The samples a boolean mask (or index tensor) selects, with their per-sample facts."""
        return LabeledData(self.x[mask], self.y[mask], self.name, dict(self.meta),
                           {k: v[mask] for k, v in self.per_sample.items()})


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of {value.dtype}"
    return type(value).__name__


# --------------------------------------------------------------------------- data roots


def candidate_roots(explicit: str | Path | None = None) -> list[Path]:
    """Where data may live, in the order it is looked up.

    An explicit root is the only candidate when given: a user who names a
    folder wants that folder, and a typo must not silently load other data.
    Otherwise: ``$DMLBENCH_DATA``; ``../shared/data`` seen from the current
    directory (what a user running from their checkout means by the
    relative path), then seen from the repository root (so the same
    command works from any sub-folder or an installed entry point); and
    ``./data`` last.
    """
    if explicit is not None and str(explicit) != "":
        return [Path(explicit).expanduser()]
    roots: list[Path] = []
    env = os.environ.get("DMLBENCH_DATA")
    if env:
        roots.append(Path(env).expanduser())
    relative = [Path.cwd() / SHARED_DATA_REL, REPO_ROOT / SHARED_DATA_REL, Path.cwd() / "data"]
    roots += [Path(os.path.normpath(r)) for r in relative]
    unique: list[Path] = []
    for root in roots:
        if not any(_same(root, seen) for seen in unique):
            unique.append(root)
    return unique


def _same(a: Path, b: Path) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def resolve_root(
    explicit: str | Path | None = None,
    dataset: str = "omniglot",
    files: Sequence[str] = ("images_background.npz", "images_evaluation.npz"),
    *,
    extra_roots: Sequence[Path] = (),
    hint: str = "",
) -> Path:
    """Return the first data root whose ``<root>/<dataset>/`` holds every one of `files`.

    Each dataset is looked up on its own, so Omniglot may come from the
    shared folder and another dataset from ``./data``. `extra_roots` come
    after the usual candidates, even after an explicit root: they are a
    system-wide install of that one dataset (a Debian package, say), which
    an explicit root meant for other data should not hide. `hint` opens the
    error, for datasets a package manager can install.
    """
    roots = candidate_roots(explicit) + list(extra_roots)
    for root in roots:
        if all((root / dataset / f).is_file() for f in files):
            return root
    names = " and ".join(files) if len(files) <= 2 else ", ".join(files[:-1]) + " and " + files[-1]
    where = str(candidate_roots(explicit)[0]) if explicit else "$DMLBENCH_DATA"
    looked = ", ".join(str(r / dataset) for r in roots)
    prefix = f"{hint}, or " if hint else ""
    raise BenchError(
        f"{dataset} not found: {prefix}put {names} under {where}/{dataset}/ (looked in: {looked})"
    )


# --------------------------------------------------------------------------- hashing


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes: a few ms for Omniglot's files, and immune to copied mtimes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str) -> str:
    """Return the file's sha256, or a BenchError when it is not the published one."""
    actual = file_sha256(path)
    if actual != expected:
        raise BenchError(
            f"{path}: sha256 {actual[:16]}... differs from the published {expected[:16]}...; "
            "the file is corrupt or another version: download it again"
        )
    return actual


# --------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    """``$DMLBENCH_CACHE``, else ``$XDG_CACHE_HOME/dmlbench``, else ``~/.cache/dmlbench``."""
    env = os.environ.get("DMLBENCH_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dmlbench"


def cache_path(name: str, key: Mapping[str, Any]) -> Path:
    """The cache file for `key`: any change of source hash or setting gives another file."""
    blob = json.dumps(dict(key), sort_keys=True, default=str).encode()
    return cache_dir() / f"{name}-{hashlib.sha256(blob).hexdigest()[:20]}.npz"


def _digest(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """crc32 over names, shapes, dtypes and bytes: catches truncation and bit rot, in ~15 ms per 60 MB."""
    crc = 0
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        crc = zlib.crc32(f"{name}:{a.dtype.str}:{a.shape};".encode(), crc)
        crc = zlib.crc32(a.reshape(-1).view(np.uint8).data, crc)
    return np.array([crc], dtype=np.uint32)


def read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays stored at `path`, or None when absent or damaged in any way."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        stored = arrays.pop("__digest__")
        if not np.array_equal(stored, _digest(arrays)):
            return None
        return arrays
    except Exception:  # any unreadable file is simply rebuilt
        return None


def write_cache(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write atomically (temp file in the same folder, fsync, rename): a killed process leaves no half file."""
    with atomic_file(path, "wb") as f:
        np.savez(f, allow_pickle=False, __digest__=_digest(arrays), **arrays)  # read back without pickle too


def cached_arrays(
    name: str, key: Mapping[str, Any], build: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Return the cached arrays for `key`, building and storing them on a miss or a damaged file.

    A cache that cannot be written (read-only home, full disk) costs speed,
    never correctness: the built arrays are returned with a warning.
    """
    path = cache_path(name, key)
    arrays = read_cache(path)
    if arrays is not None:
        return arrays
    arrays = build()
    try:
        write_cache(path, arrays)
    except OSError as err:
        warnings.warn(f"dmlbench cache not written ({path}): {err}", stacklevel=2)
    return arrays


# --------------------------------------------------------------------------- resizing


def _area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of exact area (box) resampling along one axis.

    Output pixel i covers [i*s, (i+1)*s) input pixels, s = n_in/n_out; each
    input pixel contributes its overlap. Rows sum to 1, so [0, 1] stays
    [0, 1] and thin strokes fade to grey instead of vanishing (which nearest
    or non-antialiased bilinear sampling would do at 105 -> 28).
    """
    scale = n_in / n_out
    starts = np.arange(n_out)[:, None] * scale
    ends = starts + scale
    left = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(ends, left + 1) - np.maximum(starts, left), 0.0, None)
    return (overlap / scale).astype(np.float32)


def fit_square(images: np.ndarray, mode: str) -> np.ndarray:
    """(N, C, H, W) made square before resizing, as the protocol's ``data.resize`` says.

    ``stretch`` keeps every pixel and changes the aspect ratio; ``pad`` keeps
    the aspect ratio and adds zeros (black) around the short side, centred;
    ``center_crop`` keeps the aspect ratio and drops the ends of the long side.
    """
    h, w = images.shape[-2:]
    if mode == "stretch" or h == w:
        return images
    if mode == "pad":
        side = max(h, w)
        top, left = (side - h) // 2, (side - w) // 2
        out = np.zeros((*images.shape[:-2], side, side), dtype=images.dtype)
        out[..., top : top + h, left : left + w] = images
        return out
    if mode == "center_crop":
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        return images[..., top : top + side, left : left + side]
    raise BenchError(f"data.resize: expected one of stretch, pad, center_crop, got {mode!r}")


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


def resize_area(
    images: np.ndarray, size: int, convert: Callable[[np.ndarray], np.ndarray] | None = None, chunk: int = 1024
) -> np.ndarray:
    """Resize (N, C, H, W) images to (N, C, size, size) by area averaging, in chunks.

    `convert` maps a chunk of raw values to float32 in [0, 1] (for example
    bool paper to float ink), so the full-resolution float copy, 850 MB for
    Omniglot's background set, never exists at once.
    """
    if size < 1:
        raise BenchError(f"image size must be a positive number of pixels, got {size}")
    n, c, h, w = images.shape
    rows = torch.from_numpy(_area_matrix(h, size))
    cols = torch.from_numpy(_area_matrix(w, size))
    out = np.empty((n, c, size, size), dtype=np.float32)
    for start in range(0, n, chunk):
        block = images[start : start + chunk]
        block = convert(block) if convert is not None else block
        t = torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32))
        if (h, w) != (size, size):
            t = (rows @ t @ cols.T).clamp_(0.0, 1.0)  # (size, H) @ (.., H, W) @ (W, size); clamp float rounding
        out[start : start + chunk] = t.numpy()
    return out
