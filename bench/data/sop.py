"""Stanford Online Products as published: ``Stanford_Online_Products/Ebay_train.txt`` and ``Ebay_test.txt``.

Each file starts with the header ``image_id class_id super_class_id path``;
paths (``bicycle_final/111085122871_0.JPG``) are relative to the folder.
The split is the publisher's: 11,318 train products (59,551 images) and
11,316 test products (60,502 images), ids 1..22,634 across both files.
"""

from __future__ import annotations

from pathlib import Path

from bench.data._layout import Layout, check_split, index_rows, integer, malformed, nonempty
from bench.data.files import FileIndex

LAYOUT = Layout(
    "sop",
    "Stanford_Online_Products",
    ("Ebay_train.txt", "Ebay_test.txt"),
    "unzip Stanford_Online_Products.zip into {where}",
)
HEADER = ["image_id", "class_id", "super_class_id", "path"]
SPLITS = ("train", "test")


def read_sop(root: Path, split: str) -> FileIndex:
    """The `split` of SOP under data root `root`; class id = class_id - 1, ``super_class`` per sample (0-based)."""
    check_split(LAYOUT.family, split, SPLITS)
    folder = LAYOUT.require(root)
    file = folder / f"Ebay_{split}.txt"
    paths: list[str] = []
    labels: list[int] = []
    supers: list[int] = []
    rows = index_rows(file)
    line, header = next(rows, (1, []))
    if header != HEADER:
        raise malformed(LAYOUT.family, file, line, f"expected the header '{' '.join(HEADER)}'")
    for line, fields in rows:
        if len(fields) != 4:
            raise malformed(LAYOUT.family, file, line, f"expected 4 fields ({' '.join(HEADER)}), got {len(fields)}")
        product = integer(LAYOUT.family, file, line, "class_id", fields[1])
        super_class = integer(LAYOUT.family, file, line, "super_class_id", fields[2])
        if product < 1 or super_class < 1:
            raise malformed(LAYOUT.family, file, line, "class_id and super_class_id start at 1")
        paths.append(fields[3])
        labels.append(product - 1)
        supers.append(super_class - 1)
    name = f"{LAYOUT.family}:{split}"
    nonempty(name, paths, str(file))
    LAYOUT.check_images(root, paths)
    return FileIndex(folder, tuple(paths), tuple(labels), name, per_sample={"super_class": tuple(supers)})
