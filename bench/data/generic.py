"""A user's own data: an image folder (one sub-folder per class) or an .npz with ``x`` and ``y``.

Both go through the same checks as the built-in datasets, so a protocol
can swap Omniglot for its own data without surprises: images become
float32 in [0, 1] at ``size x size`` (area resampling; a non-square image
is stretched, padded or centre-cropped as ``data.resize`` says), labels
int64, at least two classes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from bench.data._core import LabeledData, fit_square, resize_area
from bench.errors import BenchError

MAX_PIXELS = 40_000_000  # a 6,000 x 6,000 photo; more is decoded into gigabytes of floats before resizing
_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F", "La"}


def load_folder(path: str | Path, size: int = 28, resize: str = "stretch") -> LabeledData:
    """Images under ``path/<class>/``, class ids 0.. in sorted folder-name order.

    Channels are decided for the whole set: one colour image makes every
    image RGB (grey ones repeated over three channels), else all are one
    channel. Alpha is dropped. Every non-hidden file in a class folder must
    be an image: a stray file is named rather than skipped, so nothing is
    left out silently.
    """
    root = Path(path)
    if not root.is_dir():
        raise BenchError(f"image folder {root} does not exist")
    _check_links(root)
    class_dirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if len(class_dirs) < 2:
        raise BenchError(f"image folder {root} has {len(class_dirs)} class sub-folder(s); at least 2 are needed")
    images: list[np.ndarray] = []
    labels: list[int] = []
    for label, class_dir in enumerate(class_dirs):
        _check_links(class_dir)
        files = sorted(f for f in class_dir.iterdir() if f.is_file() and not f.name.startswith("."))
        if not files:
            raise BenchError(f"class folder {class_dir} holds no images")
        for file in files:
            images.append(_read_image(file))
            labels.append(label)
    channels = 3 if any(im.shape[0] == 3 for im in images) else 1
    x = np.concatenate([resize_area(fit_square(_to_channels(im, channels)[None], resize), size) for im in images])
    meta = {"class_names": {i: d.name for i, d in enumerate(class_dirs)}, "source": str(root)}
    return LabeledData(torch.from_numpy(x), torch.tensor(labels, dtype=torch.int64), f"folder:{root}", meta)


def _check_links(folder: Path) -> None:
    """A symbolic link that loops or points nowhere is neither a folder nor a file, so the listing above
    would skip it without a word (a class, or an image, silently left out): name it instead."""
    for entry in folder.iterdir():
        if entry.name.startswith(".") or not entry.is_symlink():
            continue
        try:
            entry.resolve(strict=True)
        except (OSError, RuntimeError):
            raise BenchError(f"{entry}: a symbolic link that loops or points nowhere: remove or fix it") from None


def _read_image(file: Path) -> np.ndarray:
    """One image as float32 (C, H, W) in [0, 1], C = 1 for grey modes and 3 otherwise."""
    try:
        with Image.open(file) as img:  # PIL refuses more than 2 x MAX_IMAGE_PIXELS here (DecompressionBombError)
            if img.width * img.height > MAX_PIXELS:
                raise BenchError(f"image {file} declares {img.width} x {img.height} pixels, more than "
                                 f"{MAX_PIXELS:,}: refused as a possible decompression bomb")
            img.load()
            mode = img.mode
            if mode in _GRAY_MODES:
                arr = np.asarray(img if mode.startswith(("I", "F")) else img.convert("L"))
                return _scale(arr, mode, file)[None]
            return np.asarray(img.convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255.0
    except Image.DecompressionBombError as err:
        raise BenchError(f"image {file} refused as a decompression bomb: {err}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise BenchError(f"corrupt or unreadable image {file} ({type(err).__name__})") from err


def _scale(arr: np.ndarray, mode: str, file: Path) -> np.ndarray:
    if mode.startswith("I"):  # 16-bit PGM/PNG
        return arr.astype(np.float32) / 65535.0
    if mode == "F":
        if arr.min() < 0 or arr.max() > 1:
            raise BenchError(f"{file}: float image values must lie in [0, 1], found {arr.min()}..{arr.max()}")
        return arr.astype(np.float32)
    return arr.astype(np.float32) / 255.0


def _to_channels(image: np.ndarray, channels: int) -> np.ndarray:
    return np.repeat(image, channels, axis=0) if image.shape[0] != channels else image


def load_npz(path: str | Path, size: int = 28, resize: str = "stretch") -> LabeledData:
    """``x`` of shape (N, H, W), (N, C, H, W) or (N, D) and ``y`` of shape (N,).

    Images (3-D or 4-D ``x``) are uint8 (0..255), bool, or floats in [0, 1],
    and are resized to ``size``; vectors (2-D ``x``) are kept as given, since
    features have no natural range.
    """
    file = Path(path)
    if not file.is_file():
        raise BenchError(f"npz file {file} does not exist")
    try:
        with np.load(file, allow_pickle=False) as f:
            if "x" not in f.files or "y" not in f.files:
                raise BenchError(f"{file}: needs arrays named x and y, found {', '.join(f.files) or 'none'}")
            x, y = f["x"], f["y"]
    except BenchError:
        raise
    except Exception as err:
        raise BenchError(f"{file}: not a readable .npz file ({type(err).__name__})") from err
    if x.ndim not in (2, 3, 4):
        raise BenchError(f"{file}: x must have shape (N, H, W), (N, C, H, W) or (N, D), got {x.shape}")
    if y.shape != (x.shape[0],):
        raise BenchError(f"{file}: y must have shape (N,) = ({x.shape[0]},), got {y.shape}")
    if not (np.issubdtype(y.dtype, np.integer) or (y.dtype.kind == "f" and np.all(y == np.round(y)))):
        raise BenchError(f"{file}: y must hold integer class ids, got {y.dtype}")
    _check_label_range(y, file)
    if x.shape[0] == 0 or 0 in x.shape[1:]:
        raise BenchError(f"{file}: x has zero size {x.shape}: no samples or empty images")
    if len(np.unique(y)) < 2:
        raise BenchError(f"{file}: y has {len(np.unique(y))} class(es); at least 2 are needed")
    if x.ndim == 2:
        if not np.issubdtype(x.dtype, np.number) or not np.all(np.isfinite(x)):
            raise BenchError(f"{file}: vectors x must be finite numbers, got {x.dtype}")
        xs = x.astype(np.float32)
    else:
        images = x[:, None] if x.ndim == 3 else x
        xs = resize_area(fit_square(images, resize), size, convert=lambda b: _image_values(b, file))
    return LabeledData(torch.from_numpy(xs), torch.from_numpy(y.astype(np.int64)), f"npz:{file}", {"source": str(file)})


def _check_label_range(y: np.ndarray, file: Path) -> None:
    """Class ids that become distinct int64 values: a float id of 1e30 or inf, or a uint64 beyond int64,
    used to wrap on conversion and silently merge classes. Float ids must be exact integers (|y| < 2^53)."""
    if y.dtype.kind == "f":
        finite = np.isfinite(y)
        if not finite.all() or np.abs(y).max() >= 2**53:
            bad = y[~finite][0] if not finite.all() else y[np.abs(y) >= 2**53][0]
            raise BenchError(f"{file}: class id {bad!r} in y is not an exact integer: use ids below 2^53 "
                             "(int64 ids, or floats holding small integers)")
    elif y.dtype.kind == "u" and y.size and int(y.max()) > np.iinfo(np.int64).max:
        raise BenchError(f"{file}: class id {int(y.max())} in y does not fit in int64: renumber the classes")


def _image_values(block: np.ndarray, file: Path) -> np.ndarray:
    if block.dtype == np.uint8:
        return block.astype(np.float32) / 255.0
    if block.dtype == np.bool_:
        return block.astype(np.float32)
    if block.dtype.kind == "f":
        if block.size and not (np.all(np.isfinite(block)) and block.min() >= 0 and block.max() <= 1):
            raise BenchError(f"{file}: float images must lie in [0, 1]; scale them first")
        return block.astype(np.float32)
    raise BenchError(f"{file}: images must be uint8, bool or float in [0, 1], got {block.dtype}")
