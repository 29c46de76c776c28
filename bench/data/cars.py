"""Cars196 as Stanford ships it for metric learning: ``cars196/cars_annos.mat`` and ``car_ims/``.

``cars_annos.mat`` (MATLAB v5, read with scipy) holds a 1 x 16,185 struct
array ``annotations`` (``relative_im_path`` such as ``car_ims/000001.jpg``,
``bbox_x1`` .. ``bbox_y2``, ``class`` 1..196, ``test``) and a 1 x 196 cell
``class_names``. The metric-learning split is by class: 1-98 train, 99-196
test; the ``test`` flag is the classification split and is not used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import scipy.io

from bench.data._layout import Layout, check_split, nonempty
from bench.data.files import FileIndex
from bench.errors import BenchError

LAYOUT = Layout(
    "cars196",
    "cars196",
    ("cars_annos.mat", "car_ims/"),
    "unpack car_ims.tgz into {where}/cars196 and put cars_annos.mat beside car_ims/",
)
SPLITS = {"train": range(1, 99), "test": range(99, 197)}
FIELDS = ("relative_im_path", "class")


def read_cars196(root: Path, split: str) -> FileIndex:
    """The `split` of Cars196 under data root `root`; class id = class - 1 (0..195)."""
    check_split(LAYOUT.family, split, tuple(SPLITS))
    folder = LAYOUT.require(root)
    file = folder / "cars_annos.mat"
    annotations, class_names = _read_mat(file)
    wanted = SPLITS[split]
    paths, labels = [], []
    for number, entry in enumerate(annotations, start=1):
        path, car_class = _entry(file, number, entry)
        if car_class in wanted:
            paths.append(path)
            labels.append(car_class - 1)
    name = f"{LAYOUT.family}:{split}"
    nonempty(name, paths, f"classes {wanted.start}-{wanted.stop - 1} in {file}")
    LAYOUT.check_images(root, paths)
    present = set(labels)
    names = {i: n for i, n in enumerate(class_names) if i in present}
    return FileIndex(folder, tuple(paths), tuple(labels), name, class_names=names)


def _read_mat(file: Path) -> tuple[np.ndarray, list[str]]:
    """The annotations as a flat struct array and the class names, or one line saying what is wrong."""
    try:
        mat = scipy.io.loadmat(file)
    except Exception as err:  # scipy raises ValueError, TypeError, OSError ... for a damaged file
        raise BenchError(
            f"cars196: {file} is not a readable MATLAB file ({type(err).__name__}): download cars_annos.mat again"
        ) from None
    annotations = mat.get("annotations")
    if not isinstance(annotations, np.ndarray) or annotations.dtype.names is None:
        raise BenchError(f"cars196: {file} has no struct array 'annotations'")
    absent = [f for f in FIELDS if f not in annotations.dtype.names]
    if absent:
        raise BenchError(f"cars196: {file}: 'annotations' lacks field(s) {', '.join(absent)}")
    try:
        names = [_text(n) for n in np.ravel(mat.get("class_names", []))]
    except ValueError:
        raise BenchError(f"cars196: {file}: 'class_names' is not a cell array of strings") from None
    return annotations.ravel(), names


def _entry(file: Path, number: int, entry: Any) -> tuple[str, int]:
    """(relative image path, class 1..196) of annotation `number`, or an error naming it."""
    try:
        path = _text(entry["relative_im_path"])
        raw = np.asarray(entry["class"]).item()
        car_class = int(raw)
        if car_class != raw:  # int() would truncate 1.5 to class 1 without a word
            raise ValueError(raw)
    except (ValueError, TypeError, IndexError):
        raise BenchError(f"cars196: {file}: annotation {number} has no single relative_im_path and class") from None
    if not path.startswith("car_ims/"):
        raise BenchError(f"cars196: {file}: annotation {number}: path {path!r} is not under car_ims/")
    if not 1 <= car_class <= 196:
        raise BenchError(f"cars196: {file}: annotation {number}: class {car_class} is outside 1..196")
    return path, car_class


def _text(value: Any) -> str:
    """A MATLAB char array as loadmat gives it (an array holding one str) as a str."""
    item = np.asarray(value).ravel()
    if item.size != 1 or not isinstance(item[0], str):
        raise ValueError(f"expected one string, got {value!r}")
    return str(item[0])
