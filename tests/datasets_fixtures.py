"""Tiny copies of the published dataset layouts, written into a test's folder.

Each writer lays out a few classes of small JPEGs (random colour, a random
rectangle or ellipse, odd sizes) and the index files exactly as the
publishers ship them: same file names, headers, column order and id
conventions (CUB's ``001.Name/`` folders, Cars196's ``cars_annos.mat``
struct array written with scipy, SOP's ``Ebay_*.txt``, In-shop's count line
and padded columns, Market-1501's ``PPPP_cCsS_FFFFFF_NN.jpg`` names with
junk ``-1`` and ``0000`` distractors and a ``Thumbs.db``). Each returns
what it wrote, {split: [(path relative to the dataset folder, class id
as the reader must give it)]}, for the tests to compare against.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import scipy.io
from PIL import Image, ImageDraw

Written = dict[str, list[tuple[str, int]]]
SOP_SUPER = (
    "bicycle",
    "cabinet",
    "chair",
    "coffee_maker",
    "fan",
    "kettle",
    "lamp",
    "mug",
    "sofa",
    "stapler",
    "table",
    "toaster",
)


def jpeg(path: Path, rng: random.Random, grey: bool = False) -> None:
    """A small JPEG: random background, one shape of another colour, a size between 10 and 24 pixels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w, h = rng.randint(10, 24), rng.randint(10, 24)
    img = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    (x0, x1), (y0, y1) = sorted(rng.sample(range(w), 2)), sorted(rng.sample(range(h), 2))
    shape = draw.rectangle if rng.random() < 0.5 else draw.ellipse
    shape((x0, y0, x1, y1), fill=tuple(rng.randrange(256) for _ in range(3)))
    (img.convert("L") if grey else img).save(path, "JPEG", quality=90)


def write_cub(
    root: Path, classes: tuple[int, ...] = (1, 2, 3, 101, 102, 103), per_class: int = 3, seed: int = 0
) -> Written:
    """``CUB_200_2011/`` with `per_class` images of each species in `classes` (ids 1..200), one of them grey."""
    rng = random.Random(seed)
    folder = root / "CUB_200_2011"
    written: Written = {"train": [], "test": []}
    images, labels, split_lines, class_lines = [], [], [], []
    image_id = 0
    for species in classes:
        name = f"{species:03d}.Bird_{species}"
        class_lines.append(f"{species} {name}")
        for k in range(per_class):
            image_id += 1
            relative = f"{name}/Bird_{species}_{k + 1:04d}_{7000 + image_id}.jpg"
            jpeg(folder / "images" / relative, rng, grey=image_id == 2)
            images.append(f"{image_id} {relative}")
            labels.append(f"{image_id} {species}")
            split_lines.append(f"{image_id} {k % 2}")
            written["train" if species <= 100 else "test"].append((f"images/{relative}", species - 1))
    for file, lines in (
        ("images.txt", images),
        ("image_class_labels.txt", labels),
        ("train_test_split.txt", split_lines),
        ("classes.txt", class_lines),
    ):
        (folder / file).write_text("\n".join(lines) + "\n")
    return written


def write_cars(
    root: Path, classes: tuple[int, ...] = (1, 2, 98, 99, 100, 196), per_class: int = 3, seed: int = 1
) -> Written:
    """``cars196/car_ims/NNNNNN.jpg`` and ``cars_annos.mat`` (a 1 x N ``annotations`` struct array and a
    1 x 196 ``class_names`` cell, as Stanford's file), for `per_class` images of each class in `classes`."""
    rng = random.Random(seed)
    folder = root / "cars196"
    fields = ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test")
    entries = []
    written: Written = {"train": [], "test": []}
    number = 0
    for car_class in classes:
        for k in range(per_class):
            number += 1
            relative = f"car_ims/{number:06d}.jpg"
            jpeg(folder / relative, rng)
            box = [np.array([[v]], dtype=np.uint16) for v in (1, 2, 9, 9)]
            entries.append(
                (
                    np.array([relative]),
                    *box,
                    np.array([[car_class]], dtype=np.uint8),
                    np.array([[k % 2]], dtype=np.uint8),
                )
            )
            written["train" if car_class <= 98 else "test"].append((relative, car_class - 1))
    annotations = np.empty((1, len(entries)), dtype=[(f, object) for f in fields])
    for i, entry in enumerate(entries):
        annotations[0, i] = entry
    class_names = np.empty((1, 196), dtype=object)
    for i in range(196):
        class_names[0, i] = np.array([f"Maker Model {i + 1} 2012"])
    scipy.io.savemat(folder / "cars_annos.mat", {"annotations": annotations, "class_names": class_names})
    return written


def write_sop(
    root: Path, train_products: int = 4, test_products: int = 3, per_product: int = 2, seed: int = 2
) -> Written:
    """``Stanford_Online_Products/`` with ``Ebay_train.txt``/``Ebay_test.txt``: products numbered 1.. across
    both files (test ids after train ids, as published), super-classes cycling over the twelve categories."""
    rng = random.Random(seed)
    folder = root / "Stanford_Online_Products"
    written: Written = {"train": [], "test": []}
    product = 0
    for split, count in (("train", train_products), ("test", test_products)):
        lines = ["image_id class_id super_class_id path"]
        for _ in range(count):
            product += 1
            super_class = (product - 1) % len(SOP_SUPER) + 1
            for k in range(per_product):
                relative = f"{SOP_SUPER[super_class - 1]}_final/{111085122800 + product}_{k}.JPG"
                jpeg(folder / relative, rng)
                lines.append(f"{len(lines)} {product} {super_class} {relative}")
                written[split].append((relative, product - 1))
        (folder / f"Ebay_{split}.txt").write_text("\n".join(lines) + "\n")
    return written


def write_inshop(
    root: Path, train_items: tuple[int, ...] = (1, 4, 5), test_items: tuple[int, ...] = (2, 3, 7), seed: int = 3
) -> Written:
    """``inshop/Eval/list_eval_partition.txt`` (count line, header, columns padded with spaces) and
    ``img/<GENDER>/<Category>/id_NNNNNNNN/NN_V_view.jpg``: three images of each train item, and of each
    test item one query and two gallery images."""
    rng = random.Random(seed)
    folder = root / "inshop"
    written: Written = {"train": [], "query": [], "gallery": []}
    rows = []
    views = ("front", "side", "back")
    for item in sorted(train_items + test_items):
        statuses = ["train"] * 3 if item in train_items else ["query", "gallery", "gallery"]
        gender, category = ("WOMEN", "Dresses") if item % 2 else ("MEN", "Denim")
        for k, status in enumerate(statuses):
            relative = f"img/{gender}/{category}/id_{item:08d}/{k + 1:02d}_{k + 1}_{views[k]}.jpg"
            jpeg(folder / relative, rng)
            rows.append(f"{relative:<70}id_{item:08d}          {status}")
            written[status].append((relative, item))
    (folder / "Eval").mkdir(parents=True, exist_ok=True)
    text = [str(len(rows)), "image_name item_id evaluation_status", *rows]
    (folder / "Eval" / "list_eval_partition.txt").write_text("\n".join(text) + "\n")
    return written


def write_market(
    root: Path, train_ids: tuple[int, ...] = (2, 7, 11), test_ids: tuple[int, ...] = (1, 3, 5), seed: int = 4
) -> Written:
    """``Market-1501-v15.09.15/`` with ``bounding_box_train/`` (train persons on cameras 1-3),
    ``query/`` (each test person once, camera 1) and ``bounding_box_test/`` (each test person on cameras
    1, 2 and 4, two junk ``-1`` boxes, two ``0000`` distractors), plus a ``Thumbs.db`` in every folder."""
    rng = random.Random(seed)
    folder = root / "Market-1501-v15.09.15"
    written: Written = {"train": [], "query": [], "gallery": []}
    frame = 0

    def box(split: str, directory: str, person: int, camera: int) -> None:
        nonlocal frame
        frame += 151
        pid = "-1" if person == -1 else f"{person:04d}"
        name = f"{pid}_c{camera}s{rng.randint(1, 6)}_{frame:06d}_{rng.randint(0, 8):02d}.jpg"
        jpeg(folder / directory / name, rng)
        written[split].append((f"{directory}/{name}", person))

    for person in train_ids:
        for camera in (1, 2, 3):
            box("train", "bounding_box_train", person, camera)
    for person in test_ids:
        box("query", "query", person, 1)
        for camera in (1, 2, 4):
            box("gallery", "bounding_box_test", person, camera)
    for person, camera in ((-1, 1), (-1, 3), (0, 2), (0, 5)):
        box("gallery", "bounding_box_test", person, camera)
    for directory in ("bounding_box_train", "query", "bounding_box_test"):
        (folder / directory / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0 not an image")
    for split in written:
        written[split].sort()
    return written


# The field's shipped protocols at the scale of a test (tests/protocol/test_field_protocols.py's module
# docstring): kept here, beside the fixtures they run on, so that any test module can import them.
def _shrink(value: Any, floor: int = 32) -> Any:
    """Every image size in a pipeline or data.image_size divided by 4 (227 -> 56, [256, 128] -> [64, 32])."""
    if isinstance(value, list):
        return [_shrink(v, floor) for v in value]
    return max(floor, int(value) // 4)  # ResNets need 32 pixels a side


def tiny(doc: dict[str, Any]) -> dict[str, Any]:
    """The shipped protocol at the scale of a test (tests/protocol/test_field_protocols.py)."""
    doc["name"] += "-tiny"
    data = doc["data"]
    bninception = doc["model"]["trunk"] == "bninception"
    floor = 64 if bninception else 32  # 227 / 4 = 56 does not fit BN-Inception's stride-2 blocks; 64 does
    data["image_size"] = _shrink(data["image_size"], floor)
    for side in data.get("augment", {}).values():
        for item in side:
            for params in item.values():
                if isinstance(params, dict) and "size" in params:
                    params["size"] = _shrink(params["size"], floor)
    folds = doc["final"].get("mode") == "folds"  # the Reality Check's fold models: two, each stopping on its fold
    data["validation"] = {"folds": 2, "use": 2 if folds else 1}
    data["loader"] = {"workers": 0}
    doc["model"].update(trunk="bninception" if bninception else "resnet18", pretrained=None, embedding_dim=8)
    doc["training"].update(device="cpu", iterations=2, P=2, K=2)
    if not bninception and doc["training"].get("precision") == "bf16":
        # a random ResNet-18 on 2 x 2 images of 64x32 in bf16 on a CPU with AMX (oneDNN's kernels) gets NaN
        # weights from its first Adam step, where AVX2's bf16 and fp32 do not: the variant checks the
        # protocol's shape, so it trains in fp32 there (known issue, docs/hostile-input.md)
        doc["training"]["precision"] = "fp32"
    if doc["training"].get("early_stopping"):
        doc["training"]["early_stopping"].update(check_every=1, patience=1, max_iterations=2)
    doc["evaluation"]["ks"] = [1, 2]  # a fixture's few test images: Recall@1000 would be 1 for every method
    doc["tuning"] = {"trials": 1, "startup_trials": 1, "pruner": {"type": "none"}}
    doc["final"] = {"seeds": 1, **({"mode": "folds"} if folds else {})}
    first = doc["grid"]["losses"][0]
    first["miners"] = first.get("miners", ["none"])[:1]
    doc["grid"]["losses"] = [first]
    doc["grid"]["miners"] = [m for m in doc["grid"]["miners"] if m.get("label", m["name"]) in first["miners"]]
    return doc
