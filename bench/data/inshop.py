"""DeepFashion In-shop Clothes Retrieval as published: ``inshop/Eval/list_eval_partition.txt`` and ``img/``.

The partition file's first line is the image count (52,712), the second
the header ``image_name item_id evaluation_status``, then one image per
line (``img/WOMEN/Dresses/id_00000002/02_1_front.jpg id_00000002 train``),
columns padded with runs of spaces. Status ``train`` (3,997 items, 25,882
images), ``query`` (14,218) and ``gallery`` (12,612): the query and gallery
images show the same 3,985 test items.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.data._layout import Layout, check_split, index_rows, integer, malformed, nonempty
from bench.data.files import FileIndex

LAYOUT = Layout(
    "inshop",
    "inshop",
    ("Eval/list_eval_partition.txt", "img/"),
    "unzip img.zip into {where}/inshop and put list_eval_partition.txt in {where}/inshop/Eval/",
)
HEADER = ["image_name", "item_id", "evaluation_status"]
SPLITS = ("train", "query", "gallery")
_ITEM = re.compile(r"id_(\d+)")


def read_inshop(root: Path, split: str) -> FileIndex:
    """The `split` of In-shop under data root `root`; class id = the item id's number (``id_00000002`` -> 2)."""
    check_split(LAYOUT.family, split, SPLITS)
    folder = LAYOUT.require(root)
    file = folder / "Eval" / "list_eval_partition.txt"
    rows = index_rows(file)
    line, count = next(rows, (1, []))
    if len(count) != 1 or not count[0].isdigit():
        raise malformed(LAYOUT.family, file, line, "the first line must be the number of images")
    line, header = next(rows, (line + 1, []))
    if header != HEADER:
        raise malformed(LAYOUT.family, file, line, f"expected the header '{' '.join(HEADER)}'")
    paths, labels, names, listed = [], [], {}, 0
    for line, fields in rows:
        if len(fields) != 3:
            raise malformed(LAYOUT.family, file, line, f"expected 3 fields ({' '.join(HEADER)}), got {len(fields)}")
        image, item, status = fields
        match = _ITEM.fullmatch(item)
        if match is None:
            raise malformed(LAYOUT.family, file, line, f"item id {item!r} is not of the form id_<number>")
        if status not in SPLITS:
            raise malformed(
                LAYOUT.family, file, line, f"evaluation_status {status!r} is not one of {', '.join(SPLITS)}"
            )
        listed += 1
        if status == split:
            label = integer(LAYOUT.family, file, line, "item id", match.group(1))
            paths.append(image)
            labels.append(label)
            names[label] = item
    if listed != int(count[0]):
        raise malformed(LAYOUT.family, file, 1, f"says {count[0]} images but lists {listed} (truncated or edited?)")
    name = f"{LAYOUT.family}:{split}"
    nonempty(name, paths, str(file))
    LAYOUT.check_images(root, paths)
    return FileIndex(folder, tuple(paths), tuple(labels), name, class_names=names)
