"""A user's own data: an image folder (one sub-folder per class) or an .npz with ``x`` and ``y``.

Both go through the same checks as the built-in datasets, so a protocol
can swap Omniglot for its own data without surprises: images become
float32 in [0, 1] at ``size x size`` (area resampling; a non-square image
is stretched, padded or centre-cropped as ``data.resize`` says), labels
int64, at least two classes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bench.data.files import FileIndex, labeled_from_index
from bench.data.labeled import LabeledData
from bench.data.resize import fit_square, resize_area
from bench.errors import BenchError

log = logging.getLogger("dmlbench.data")


def image_suffixes() -> frozenset[str]:
    """The file extensions Pillow reads (``.png``, ``.jpg``, ``.pgm``, ...), lower case, with the dot."""
    return frozenset(suffix.lower() for suffix in Image.registered_extensions())


def load_folder(path: str | Path, size: int = 28, resize: str = "stretch") -> LabeledData:
    """Images under ``path/<class>/``, class ids 0.. in sorted folder-name order, read lazily.

    Nothing is decoded here (`bench.data.files.labeled_from_index`); each
    image's header is read, so channels are decided for the whole set (one
    colour image makes every image RGB, grey ones repeated over three
    channels, else all are one channel) and a file with an image extension
    that does not decode is named now. Which files count is `folder_index`'s
    rule; the number skipped is in ``meta["skipped_files"]``.
    """
    return labeled_from_index(folder_index(path), size, resize, scan_channels=True)


def folder_index(path: str | Path) -> FileIndex:
    """The `FileIndex` of a folder of class sub-folders (hidden entries skipped, broken links named).

    One rule for what is an image: a file whose extension is one Pillow reads
    (`image_suffixes`, any case). Hidden files and folders (a leading ``.``:
    ``.DS_Store``) are skipped; any other file without such an extension
    (``README.txt``, ``Thumbs.db``, ``labels.csv``) in a class folder is
    skipped and counted, and so is any file beside the class folders (an image
    there is in no class); each count is told once as a notice; a file with an
    image extension that does not decode is an error naming it (when its
    header is read, or when it is decoded).
    """
    root = Path(path)
    if not root.is_dir():
        raise BenchError(f"image folder {root} does not exist")
    _check_links(root)
    class_dirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if len(class_dirs) < 2:
        raise BenchError(f"image folder {root} has {len(class_dirs)} class sub-folder(s); at least 2 are needed")
    suffixes = image_suffixes()
    beside = [f for f in root.iterdir() if f.is_file() and not f.name.startswith(".")]  # in no class folder
    skipped: list[Path] = []
    paths: list[str] = []
    labels: list[int] = []
    for label, class_dir in enumerate(class_dirs):
        _check_links(class_dir)
        nested = sorted(f.name for f in class_dir.iterdir() if f.is_dir() and not f.name.startswith("."))
        if nested:  # its images would be left out without a word
            raise BenchError(
                f"class folder {class_dir} holds a sub-folder {nested[0]!r}: a class is one folder of "
                "images; move its images up, or make it a class of its own"
            )
        visible = [f for f in class_dir.iterdir() if f.is_file() and not f.name.startswith(".")]
        files = sorted(f.name for f in visible if f.suffix.lower() in suffixes)
        skipped += [f for f in visible if f.suffix.lower() not in suffixes]
        if not files:
            raise BenchError(
                f"class folder {class_dir} holds no images"
                + (
                    f" (skipped {len(visible)} file(s) without an image extension, e.g. "
                    f"{sorted(f.name for f in visible)[0]})"
                    if visible
                    else ""
                )
            )
        paths += [f"{class_dir.name}/{name}" for name in files]
        labels += [label] * len(files)
    for group, why in ((skipped, "without an image extension"), (beside, "beside the class folders, in none")):
        if group:
            names = sorted({f.name for f in group})
            log.info(
                f"folder:{root}: skipped {len(group)} file(s) {why} "
                f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
            )
    return FileIndex(
        root,
        tuple(paths),
        tuple(labels),
        f"folder:{root}",
        class_names={i: d.name for i, d in enumerate(class_dirs)},
        skipped=len(skipped) + len(beside),
    )


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


def load_npz(path: str | Path, size: int = 28, resize: str = "stretch", layout: str | None = None) -> LabeledData:
    """``x`` of shape (N, H, W), (N, C, H, W) or (N, D) and ``y`` of shape (N,), optionally ``camera`` (N,).

    Images (3-D or 4-D ``x``) are uint8 (0..255), bool, or floats in [0, 1],
    and are resized to ``size``; vectors (2-D ``x``) are kept as given, since
    features have no natural range. `layout` (``data.layout``) says how a 4-D
    ``x`` is ordered: ``nhwc`` is transposed to (N, C, H, W); None reads
    (N, C, H, W) and refuses a shape that looks channels-last (`check_layout`).
    """
    file = Path(path)
    if not file.is_file():
        raise BenchError(f"npz file {file} does not exist")
    try:
        with np.load(file, allow_pickle=False) as f:
            if "x" not in f.files or "y" not in f.files:
                raise BenchError(f"{file}: needs arrays named x and y, found {', '.join(f.files) or 'none'}")
            x, y = f["x"], f["y"]
            camera = f["camera"] if "camera" in f.files else None
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
    if x.ndim == 4:
        x = check_layout(x, layout, file)
    if x.ndim == 2:
        if not np.issubdtype(x.dtype, np.number):
            raise BenchError(f"{file}: vectors x must be finite numbers, got {x.dtype}")
        problem = _non_finite(x)
        if problem:
            raise BenchError(f"{file}: vectors x hold {problem}: replace those values or drop those samples")
        xs = x.astype(np.float32)
    else:
        images = x[:, None] if x.ndim == 3 else x
        xs = resize_area(fit_square(images, resize), size, convert=lambda b: _image_values(b, file))
    meta: dict = {"source": str(file)}
    per_sample = {}
    if camera is not None:  # re-ID data: the camera of each sample, for the Market-1501 evaluation rules
        if camera.shape != y.shape or not np.issubdtype(camera.dtype, np.integer):
            raise BenchError(
                f"{file}: camera must hold one integer per sample, shape {y.shape}, got {camera.dtype} {camera.shape}"
            )
        per_sample["camera"] = torch.from_numpy(camera.astype(np.int64))
    return LabeledData(torch.from_numpy(xs), torch.from_numpy(y.astype(np.int64)), f"npz:{file}", meta, per_sample)


CHANNEL_COUNTS = (1, 3, 4)  # grey, RGB, RGBA: what a channel axis of an image array holds


def check_layout(x: np.ndarray, layout: str | None, file: Path) -> np.ndarray:
    """A 4-D ``x`` as (N, C, H, W). ``nhwc``: transposed (a view). ``nchw``: as it is. None: as it is, unless
    its last axis holds 1, 3 or 4 and its second does not (an (N, 32, 32, 3) array): read as NCHW that is
    32 channels of 32 x 3 pixels, trained on without a word, so it is refused and the way out named."""
    if layout == "nhwc":
        return x.transpose(0, 3, 1, 2)
    if layout is None and x.shape[3] in CHANNEL_COUNTS and x.shape[1] not in CHANNEL_COUNTS:
        n, h, w, c = x.shape
        raise BenchError(
            f"{file}: x has shape {x.shape}, which looks channels-last (N, H, W, C); images are read as "
            f"(N, C, H, W) = ({n}, {c}, {h}, {w}): save np.transpose(x, (0, 3, 1, 2)), or set data.layout: "
            "nhwc (train: --layout nhwc; nchw if the second axis really is the channels)"
        )
    return x


def _check_label_range(y: np.ndarray, file: Path) -> None:
    """Class ids must become distinct int64 values: a float id of 1e30 or inf, or a uint64 beyond int64,
    would wrap on conversion and silently merge classes, so they are refused. Float ids must be exact
    integers (|y| < 2^53)."""
    if y.dtype.kind == "f":
        finite = np.isfinite(y)
        if not finite.all() or np.abs(y).max() >= 2**53:
            bad = y[~finite][0] if not finite.all() else y[np.abs(y) >= 2**53][0]
            raise BenchError(
                f"{file}: class id {bad!r} in y is not an exact integer: use ids below 2^53 "
                "(int64 ids, or floats holding small integers)"
            )
    elif y.dtype.kind == "u" and y.size and int(y.max()) > np.iinfo(np.int64).max:
        raise BenchError(f"{file}: class id {int(y.max())} in y does not fit in int64: renumber the classes")


def _non_finite(values: np.ndarray) -> str | None:
    """What a float array holds that no image or vector may: NaN or infinities, named and counted; None if
    every value is finite."""
    if values.dtype.kind != "f" or not values.size:
        return None
    nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
    parts = [f"{nan} NaN value(s)" if nan else "", f"{inf} infinite value(s)" if inf else ""]
    return " and ".join(p for p in parts if p) or None


def _image_values(block: np.ndarray, file: Path) -> np.ndarray:
    if block.dtype == np.uint8:
        return block.astype(np.float32) / 255.0
    if block.dtype == np.bool_:
        return block.astype(np.float32)
    if block.dtype.kind == "f":
        problem = _non_finite(block)
        if problem:
            raise BenchError(f"{file}: float images hold {problem}: replace those values or drop those samples")
        if block.size and not (block.min() >= 0 and block.max() <= 1):
            raise BenchError(
                f"{file}: float images must lie in [0, 1], these lie in [{block.min():g}, {block.max():g}]; "
                "scale them first"
            )
        return block.astype(np.float32)
    raise BenchError(f"{file}: images must be uint8, bool or float in [0, 1], got {block.dtype}")
