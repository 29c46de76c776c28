"""Omniglot (Lake et al. 2015): background and evaluation sets, and Lake's 20 one-shot runs.

Ink convention: ink is 1.0 and paper 0.0. The files store paper as True
(and the run PNGs paper as white); the few-shot and DML code that trains
on Omniglot mostly inverts to bright strokes on a dark ground, as in MNIST,
so that zero padding and max-pooling see the empty page as "nothing". The
same conversion serves the .npz arrays and the run PNGs, and so does the
resize (exact area averaging, `resize_area`), so a run image equals the
evaluation image it was drawn from, tensor for tensor.

Global class ids: background character c is id c (0..963), evaluation
character c is 964 + c (964..1622), so both sets can meet in one record
without clashing. Source files are checked against the published sha256
(the table in the data folder's README) on every load: hashing takes a few
milliseconds and the hash also keys the preprocessed-tensor cache.
"""

from __future__ import annotations

import csv
import io
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from bench.data.cache import cached_arrays, check_sha256
from bench.data.labeled import LabeledData
from bench.data.resize import resize_area
from bench.data.roots import resolve_root
from bench.errors import BenchError

if TYPE_CHECKING:
    from bench.metrics.fewshot import OneShotRun

DATASET = "omniglot"
PREPROCESS_VERSION = 1  # bump when the conversion or the resize changes: old cache files are then ignored
SETS = {"background": ("images_background.npz", 0, 964), "evaluation": ("images_evaluation.npz", 964, 659)}
RUNS_FILE = "all_runs.zip"
ALPHABETS_FILE = "alphabets.csv"
SHA256 = {  # from the README of the Omniglot data folder
    "images_background.npz": "8bf84167413cd00beacdce3fe582f780ab538d8dbef043a6d688f2527bbce199",
    "images_evaluation.npz": "0b84c7ffd94c4841c0040e529c86a82eaaccb986d8eadad5673f7991b7475276",
    RUNS_FILE: "437c1eeab0af8484112e1b4cc0f3d541ec727f7c47b9b202da738af9dfd6c325",
}
N_DRAWERS = 20
SIDE = 105


def paper_to_ink(paper: np.ndarray) -> np.ndarray:
    """Bool paper (True, stored as any non-zero byte) to float32 ink 1.0 / paper 0.0.

    Reads the bytes (the README: True is stored as 255), so the result does
    not depend on how numpy treats non-canonical booleans.
    """
    raw = paper.view(np.uint8) if paper.dtype == np.bool_ else paper
    return (raw == 0).astype(np.float32)


def load_omniglot(split: str, root: str | Path | None = None, size: int = 28) -> LabeledData:
    """The background or evaluation set as (N, 1, size, size) ink images, N = characters x 20."""
    if split not in SETS:
        raise BenchError(f"unknown Omniglot set {split!r}: expected background or evaluation")
    filename, offset, n_classes = SETS[split]
    base = resolve_root(root, DATASET, (filename, ALPHABETS_FILE)) / DATASET
    source = base / filename
    sha = check_sha256(source, SHA256[filename])

    def build() -> dict[str, np.ndarray]:
        with np.load(source, allow_pickle=False) as f:
            images = f["images"]
        if images.shape != (n_classes, N_DRAWERS, SIDE, SIDE):
            expected = (n_classes, N_DRAWERS, SIDE, SIDE)
            raise BenchError(f"{source}: images have shape {images.shape}, expected {expected}")
        x = resize_area(images.reshape(-1, 1, SIDE, SIDE), size, convert=paper_to_ink)
        return {"x": x}

    key = {"source": sha, "size": size, "version": PREPROCESS_VERSION}
    x = cached_arrays(f"omniglot-{split}-{size}", key, build)["x"]
    y = np.repeat(np.arange(offset, offset + n_classes, dtype=np.int64), N_DRAWERS)
    alphabet, names = _class_meta(base / ALPHABETS_FILE)
    ids = range(offset, offset + n_classes)
    meta = {
        "alphabet": {c: alphabet[c] for c in ids},
        "class_names": {c: names[c] for c in ids},
        "source": str(source),
        "ink": 1.0,
    }
    return LabeledData(torch.from_numpy(x), torch.from_numpy(y), f"omniglot:{split}", meta)


def _class_meta(path: Path) -> tuple[dict[int, str], dict[int, str]]:
    """Alphabet and ``Alphabet/characterNN`` name per global class id, from alphabets.csv.

    Original character id ``k`` (1..1623) is global class ``k - 1``: the
    background ids 1..964 and the evaluation ids 965..1623 line up with the
    0..963 / 964..1622 numbering without a shift.
    """
    alphabet: dict[int, str] = {}
    names: dict[int, str] = {}
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                first, last = int(row["first_character_id"]), int(row["last_character_id"])
                for k in range(first, last + 1):
                    alphabet[k - 1] = row["alphabet"]
                    names[k - 1] = f"{row['alphabet']}/character{k - first + 1:02d}"
    except (KeyError, ValueError) as err:
        raise BenchError(f"{path}: unreadable alphabet table ({err})") from err
    if sorted(alphabet) != list(range(1623)):
        raise BenchError(f"{path}: alphabet table covers {len(alphabet)} of the 1623 character ids")
    return alphabet, names


# --------------------------------------------------------------------------- Lake's runs

_RUN_LINE = re.compile(r"^(run\d+)/test/(item\d+\.png)\s+(run\d+)/training/(class\d+\.png)$")


def load_lake_runs(root: str | Path | None = None, size: int = 28) -> list["OneShotRun"]:
    """Lake et al.'s 20 published 20-way one-shot runs, preprocessed like the .npz images.

    Each run: ``train_x`` the 20 training images (``classNN.png`` in order),
    ``test_x`` the 20 test images (``itemNN.png`` in order), ``answer[i]``
    the position in ``train_x`` of the class of test image ``i``, read from
    the run's class_labels.txt. Images are (1, size, size), ink 1.0.
    """
    from bench.metrics.fewshot import OneShotRun  # the metrics package owns the episode type

    source = resolve_root(root, DATASET, (RUNS_FILE,)) / DATASET / RUNS_FILE
    sha = check_sha256(source, SHA256[RUNS_FILE])
    key = {"source": sha, "size": size, "version": PREPROCESS_VERSION}
    arrays = cached_arrays(f"omniglot-runs-{size}", key, lambda: _read_runs(source, size))
    train, test, answer = (torch.from_numpy(arrays[k]) for k in ("train", "test", "answer"))
    names = [str(n) for n in arrays["names"]]
    return [OneShotRun(train[r], test[r], answer[r], names[r]) for r in range(train.shape[0])]


def _read_runs(source: Path, size: int) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(source) as z:
        runs = sorted({n.split("/")[0] for n in z.namelist() if n.endswith("class_labels.txt")})
        train, test, answer = [], [], []
        for run in runs:
            train_files = sorted(n for n in z.namelist() if n.startswith(f"{run}/training/") and n.endswith(".png"))
            test_files = sorted(n for n in z.namelist() if n.startswith(f"{run}/test/") and n.endswith(".png"))
            pairs = _run_labels(z.read(f"{run}/class_labels.txt").decode(), run, source)
            position = {name: i for i, name in enumerate(train_files)}
            try:
                answer.append([position[pairs[name]] for name in test_files])
            except KeyError as err:
                raise BenchError(f"{source}: {run}/class_labels.txt has no valid entry for {err}") from err
            train.append(np.stack([_read_png(z, n, source) for n in train_files]))
            test.append(np.stack([_read_png(z, n, source) for n in test_files]))
    paper_train, paper_test = np.stack(train), np.stack(test)  # (runs, 20, H, W) bool
    r, n = paper_train.shape[:2]

    def prep(paper: np.ndarray) -> np.ndarray:
        return resize_area(paper.reshape(-1, 1, SIDE, SIDE), size, convert=paper_to_ink).reshape(r, n, 1, size, size)

    return {
        "train": prep(paper_train),
        "test": prep(paper_test),
        "answer": np.asarray(answer, dtype=np.int64),
        "names": np.asarray(runs, dtype=str),
    }


def _run_labels(text: str, run: str, source: Path) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for line in filter(None, (ln.strip() for ln in text.splitlines())):
        m = _RUN_LINE.match(line)
        if not m or m.group(1) != run or m.group(3) != run:
            raise BenchError(f"{source}: unexpected line in {run}/class_labels.txt: {line!r}")
        pairs[f"{run}/test/{m.group(2)}"] = f"{run}/training/{m.group(4)}"
    return pairs


def _read_png(z: zipfile.ZipFile, name: str, source: Path) -> np.ndarray:
    """A run PNG as bool paper, the .npz's own convention, so both go through `paper_to_ink`."""
    try:
        gray = np.asarray(Image.open(io.BytesIO(z.read(name))).convert("L"))
    except Exception as err:
        raise BenchError(f"{source}: corrupt image {name} ({err})") from err
    if gray.shape != (SIDE, SIDE):
        raise BenchError(f"{source}: {name} is {gray.shape[1]}x{gray.shape[0]}, expected {SIDE}x{SIDE}")
    return gray != 0
