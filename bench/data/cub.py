"""CUB-200-2011 as Caltech ships it: ``CUB_200_2011/images.txt``, ``image_class_labels.txt``, ``images/``.

The metric-learning split (Song et al. 2016, the Reality Check) is by
class: species 1-100 train, 101-200 test. The archive's own
``train_test_split.txt`` is a classification split over the same 200
species and is not used.
"""

from __future__ import annotations

from pathlib import Path

from bench.data._layout import Layout, check_split, index_rows, integer, malformed, nonempty
from bench.data.files import FileIndex
from bench.errors import BenchError

LAYOUT = Layout(
    "cub200",
    "CUB_200_2011",
    ("images.txt", "image_class_labels.txt", "images/"),
    "unpack CUB_200_2011.tgz into {where}",
)
SPLITS = {"train": range(1, 101), "test": range(101, 201)}


def read_cub200(root: Path, split: str) -> FileIndex:
    """The `split` of CUB-200-2011 under data root `root`; class id = species id - 1 (0..199)."""
    check_split(LAYOUT.family, split, tuple(SPLITS))
    folder = LAYOUT.require(root)
    images = _id_column(folder / "images.txt", "image path")
    classes = _id_column(folder / "image_class_labels.txt", "class id")
    if images.keys() != classes.keys():
        odd = min(images.keys() ^ classes.keys())
        has, lacks = (
            ("images.txt", "image_class_labels.txt") if odd in images else ("image_class_labels.txt", "images.txt")
        )
        raise BenchError(
            f"cub200: image id {odd} is in {folder / has} but not in {lacks}: "
            "the two files come from different releases"
        )
    wanted = SPLITS[split]
    paths, labels, names = [], [], {}
    for image_id, (_, path) in images.items():
        class_line, class_text = classes[image_id]
        species = integer(LAYOUT.family, folder / "image_class_labels.txt", class_line, "class id", class_text)
        if not 1 <= species <= 200:
            raise malformed(
                LAYOUT.family, folder / "image_class_labels.txt", class_line, f"class id {species} is outside 1..200"
            )
        if species in wanted:
            paths.append(f"images/{path}")
            labels.append(species - 1)
            names[species - 1] = path.split("/")[0]
    name = f"{LAYOUT.family}:{split}"
    nonempty(name, paths, f"classes {wanted.start}-{wanted.stop - 1} in {folder / 'image_class_labels.txt'}")
    LAYOUT.check_images(root, paths)
    return FileIndex(folder, tuple(paths), tuple(labels), name, class_names=names)


def _id_column(file: Path, what: str) -> dict[int, tuple[int, str]]:
    """``<image_id> <value>`` lines as {image id: (line number, value)}, ids unique."""
    rows: dict[int, tuple[int, str]] = {}
    for line, fields in index_rows(file):
        if len(fields) != 2:
            raise malformed(LAYOUT.family, file, line, f"expected '<image_id> <{what}>', got {len(fields)} fields")
        image_id = integer(LAYOUT.family, file, line, "image id", fields[0])
        if image_id in rows:
            raise malformed(LAYOUT.family, file, line, f"image id {image_id} repeats line {rows[image_id][0]}")
        rows[image_id] = (line, fields[1])
    return rows
