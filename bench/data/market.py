"""Market-1501 as published: ``Market-1501-v15.09.15/bounding_box_train/``, ``query/``, ``bounding_box_test/``.

No index file: each image's name is its record, ``PPPP_cCsS_FFFFFF_NN.jpg``
(person, camera 1-6, sequence, frame, box), as in ``0002_c1s1_000451_03.jpg``.
Person ``-1`` (written ``-1_c1s1_...``) marks junk boxes and ``0000``
distractors; both occur only in the gallery (``bounding_box_test``), where
the Market-1501 evaluation ignores junk and counts distractors as wrong
matches, so both are kept here with their ids. Windows' ``Thumbs.db`` and
other non-JPEG files in the folders are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.data._layout import Layout, check_split, nonempty
from bench.data.files import FileIndex
from bench.errors import BenchError

SPLITS = {"train": "bounding_box_train", "query": "query", "gallery": "bounding_box_test"}
LAYOUT = Layout(
    "market1501",
    "Market-1501-v15.09.15",
    tuple(f"{d}/" for d in SPLITS.values()),
    "unzip Market-1501-v15.09.15.zip into {where}",
)
_NAME = re.compile(r"(-1|\d{4})_c([1-6])s(\d+)_(\d{6})_(\d{2})\.jpg", re.IGNORECASE)


def read_market1501(root: Path, split: str) -> FileIndex:
    """The `split` of Market-1501 under data root `root`; class id = person id (-1 junk, 0 distractor),
    ``camera`` (1-6) per sample; files in sorted name order."""
    check_split(LAYOUT.family, split, tuple(SPLITS))
    folder = LAYOUT.require(root)
    directory = folder / SPLITS[split]
    paths, labels, cameras = [], [], []
    for file in sorted(p for p in directory.iterdir() if p.suffix.lower() == ".jpg"):
        match = _NAME.fullmatch(file.name)
        if match is None:
            raise BenchError(f"market1501: {file}: name is not of the form PPPP_cCsS_FFFFFF_NN.jpg")
        paths.append(f"{SPLITS[split]}/{file.name}")
        labels.append(int(match.group(1)))
        cameras.append(int(match.group(2)))
    name = f"{LAYOUT.family}:{split}"
    nonempty(name, paths, f"no .jpg in {directory}")
    return FileIndex(folder, tuple(paths), tuple(labels), name, per_sample={"camera": tuple(cameras)})
