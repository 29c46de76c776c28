"""Omniglot (Lake et al. 2015) from its publisher's files: background and evaluation sets, Lake's 20 runs.

Where the files come from: github.com/brendenlake/omniglot, ``python/``
(``images_background.zip``, ``images_evaluation.zip``) and
``python/one-shot-classification/`` (``all_runs.zip``). Each image set is
read, under a data root's ``omniglot/`` folder, from the first of

- the zip as published (members read straight from it, nothing unpacked),
- the folder it unpacks to (``omniglot/images_background/<Alphabet>/characterNN/``),
- torchvision's copy, ``omniglot/omniglot-py/`` or the data root's own
  ``omniglot-py/`` (torchvision's ``Omniglot(root)`` keeps both the zip and
  the unpacked folder there).

The data roots are looked up as for every dataset (`bench.data.roots`).
A set is recognised by its layout and content, never by the zip's bytes
(repacked zips hold the same images): the expected numbers of alphabets,
characters and drawers, file names ``<id>_<drawer>.png`` and 105x105 images.

Ink convention: ink is 1.0 and paper 0.0. The PNGs are 1-bit, paper white;
the few-shot and DML code that trains on Omniglot mostly inverts to bright
strokes on a dark ground, as in MNIST, so that zero padding and max-pooling
see the empty page as "nothing". The same conversion serves the set images
and the run images, and so does the resize (exact area averaging,
`resize_area`), so a run image equals the evaluation image it was drawn
from, tensor for tensor.

Global class ids: the publisher's character id (``XXXX`` in ``XXXX_YY.png``,
1..1623) minus one, so background characters are 0..963 and evaluation
characters 964..1622, and both sets can meet in one record without
clashing. The publisher's ids are not in the sorted order of the alphabet
folders (Arcadian holds 1..26, Alphabet_of_the_Magi 709..728), so the ids
are read from the file names, not counted in folder order. ``meta`` holds
per class id its ``alphabet`` (the folder name) and ``class_names``
(``Alphabet/characterNN``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bench.data.cache import cached_arrays, check_sha256, stat_key
from bench.data.images import pil_open
from bench.data.labeled import LabeledData
from bench.data.resize import resize_area
from bench.data.roots import candidate_roots
from bench.errors import BenchError
from bench.metrics.fewshot import OneShotRun

DATASET = "omniglot"
TORCHVISION = "omniglot-py"  # torchvision's Omniglot(root) folder
PUBLISHER = "github.com/brendenlake/omniglot"
PREPROCESS_VERSION = 1  # bump when the conversion or the resize changes: old cache files are then ignored


@dataclass(frozen=True)
class SetShape:
    """What one published image set holds: its folder (and zip) name, first global id, counts."""

    folder: str
    offset: int  # global id of its first character (publisher's id - 1)
    n_alphabets: int
    n_characters: int


SETS = {
    "background": SetShape("images_background", 0, 30, 964),
    "evaluation": SetShape("images_evaluation", 964, 20, 659),
}
RUNS_FILE = "all_runs.zip"
RUNS_FOLDER = "all_runs"
N_RUNS = 20
SHA256 = {  # the publisher's all_runs.zip (python/one-shot-classification/), byte for byte
    RUNS_FILE: "437c1eeab0af8484112e1b4cc0f3d541ec727f7c47b9b202da738af9dfd6c325",
}
N_DRAWERS = 20
SIDE = 105
CHUNK = 1024  # images decoded and resized at a time: the full-size set never sits in memory


def paper_to_ink(paper: np.ndarray) -> np.ndarray:
    """Bool paper (True, stored as any non-zero byte) to float32 ink 1.0 / paper 0.0.

    Reads the bytes, so the result does not depend on how numpy treats
    non-canonical booleans.
    """
    raw = paper.view(np.uint8) if paper.dtype == np.bool_ else paper
    return (raw == 0).astype(np.float32)


# --------------------------------------------------------------------------- a zip or the folder it unpacks to


def _junk(name: str) -> bool:
    """Files an archiver or a desktop adds beside the data (``__MACOSX/``, ``.DS_Store``, ``._x.png``)."""
    return any(part.startswith(".") or part == "__MACOSX" for part in name.split("/"))


class Source:
    """The files of one published archive, from the zip itself or from the folder it unpacks to.

    `top` is the archive's own folder inside the zip (``images_background/``;
    ``""`` for ``all_runs.zip``, whose runs lie at the top); names are
    relative to it, with ``/`` separators, files only, archiver junk left out.
    """

    def __init__(self, path: Path, top: str, what: str) -> None:
        self.path, self.what = path, what
        self._zip: zipfile.ZipFile | None = None
        self._entries: dict[str, tuple[int, ...]] = {}  # name -> (size, CRC32) for a zip, `stat_key` for a folder
        if path.is_dir():
            for folder, _, files in os.walk(path):
                for f in files:
                    full = os.path.join(folder, f)
                    name = os.path.relpath(full, path).replace(os.sep, "/")
                    if not _junk(name):
                        self._entries[name] = tuple(stat_key(os.stat(full)))
            return
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            raise BenchError(
                f"{path}: not a readable zip ({err}): the file is truncated or not {what}; "
                f"download it again ({PUBLISHER})"
            ) from None
        self._members: dict[str, zipfile.ZipInfo] = {}
        for info in self._zip.infolist():
            if not info.is_dir() and info.filename.startswith(top) and not _junk(info.filename):
                name = info.filename[len(top) :]
                self._members[name] = info
                self._entries[name] = (info.file_size, info.CRC)

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *_: object) -> None:
        if self._zip is not None:
            self._zip.close()

    @property
    def is_zip(self) -> bool:
        return self._zip is not None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def read(self, name: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(self._members[name])
            return (self.path / name).read_bytes()
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, KeyError) as err:
            raise BenchError(
                f"{self.path}: cannot read {name} ({err}): the file is damaged; "
                f"download {self.what} again ({PUBLISHER})"
            ) from None

    def fingerprint(self) -> str:
        """A digest of every member's name, size and CRC32 (zip) or mtime (folder), the cache key's source.

        Cheap: a zip's central directory already lists each member's size and
        CRC32 of its uncompressed bytes, so reading it (milliseconds) gives a
        content fingerprint without decompressing anything; a changed image
        changes its CRC. A folder costs one stat per file (a fraction of a
        second for 19,280 files): a rewritten image changes its change time
        and inode even when its size and modification time are restored
        (`bench.data.fingerprint.stat_key`).
        """
        kind = "zip" if self._zip is not None else "folder"
        blob = json.dumps([kind, sorted(self._entries.items())]).encode()
        return hashlib.sha256(blob).hexdigest()

    def png(self, name: str) -> np.ndarray:
        """One image as bool paper (white True), checked to be 105x105."""
        try:
            image = pil_open(io.BytesIO(self.read(name)))
            size = image.size  # from the header: a file of another size is refused before it is decoded
            if size != (SIDE, SIDE):
                raise BenchError(f"{self.path}: {name} is {size[0]}x{size[1]}, expected {SIDE}x{SIDE}: not {self.what}")
            return np.asarray(image) if image.mode == "1" else np.asarray(image.convert("L")) != 0
        except BenchError:
            raise
        except Exception as err:
            raise BenchError(
                f"{self.path}: corrupt image {name} ({err}): download {self.what} again ({PUBLISHER})"
            ) from None


# --------------------------------------------------------------------------- where the files are


def _candidates(root: Path, name: str) -> list[Path]:
    """Where set `name` may lie under data root `root`: our folder, then torchvision's; zip before folder."""
    places = (root / DATASET, root / DATASET / TORCHVISION, root / TORCHVISION)
    return [p for place in places for p in (place / f"{name}.zip", place / name)]


def _exists(path: Path) -> bool:
    return path.is_file() if path.suffix == ".zip" else path.is_dir()


def _find(root: str | Path | None, candidates: Callable[[Path], Sequence[Path]]) -> Path | None:
    for r in candidate_roots(root):
        for path in candidates(r):
            if _exists(path):
                return path
    return None


def _not_found(
    root: str | Path | None,
    files: str,
    where_on_github: str,
    alternatives: str,
    places: Callable[[Path], Sequence[Path]],
) -> BenchError:
    """One line, in `resolve_root`'s words: which files, from where, to put where, and where we looked."""
    roots = candidate_roots(root)
    where = str(roots[0]) if root is not None and str(root) != "" else "$DMLBENCH_DATA"
    looked = ", ".join(dict.fromkeys(str(p.parent) for r in roots for p in places(r)))
    return BenchError(
        f"{DATASET} not found: put {files} ({PUBLISHER}, {where_on_github}) under "
        f"{where}/{DATASET}/ ({alternatives}) (looked in: {looked})"
    )


def find_set(split: str, root: str | Path | None = None) -> Path:
    """The zip or folder of image set `split` under the first data root that holds one."""
    shape = _shape(split)
    found = _find(root, partial(_candidates, name=shape.folder))
    if found is not None:
        return found
    missing = [
        s.folder
        for s in SETS.values()
        if s.folder == shape.folder or _find(root, partial(_candidates, name=s.folder)) is None
    ]
    files = " and ".join(f"{m}.zip" for m in missing)
    raise _not_found(
        root,
        files,
        "python/",
        "or the folders they unpack to, or torchvision's omniglot-py/",
        partial(_candidates, name=shape.folder),
    )


def _shape(split: str) -> SetShape:
    if split not in SETS:
        raise BenchError(f"unknown Omniglot set {split!r}: expected background or evaluation")
    return SETS[split]


# --------------------------------------------------------------------------- the image sets

_IMAGE = re.compile(r"^([^/]+)/(character\d\d)/(\d{4})_(\d\d)\.png$")


@dataclass(frozen=True)
class SetIndex:
    """One set's layout, read from member names alone: images in (class id, drawer) order, meta per id."""

    files: tuple[str, ...]
    alphabet: dict[int, str]
    class_names: dict[int, str]


def index_set(source: Source, shape: SetShape) -> SetIndex:
    """Check the layout of `source` against `shape` and order its images by (global id, drawer).

    Checked: every image is ``<Alphabet>/characterNN/<id>_<drawer>.png``;
    a character folder holds one id and drawers 01..20; the set holds
    `shape`'s numbers of alphabets and characters, with ids offset+1 ..
    offset+n. Each failure is one line saying what differs.
    """
    what = f"Omniglot's {shape.folder}"
    pngs = [n for n in source.names() if n.lower().endswith(".png")]
    if not pngs:
        inside = f" inside {shape.folder}/" if source.is_zip else ""
        raise BenchError(
            f"{source.path}: no images{inside} in the layout <Alphabet>/characterNN/<id>_<drawer>.png: not {what}"
        )
    by_folder: dict[tuple[str, str], dict[int, str]] = {}  # (alphabet, characterNN) -> drawer -> name
    ids: dict[tuple[str, str], int] = {}
    for name in pngs:
        m = _IMAGE.match(name)
        if m is None:
            raise BenchError(
                f"{source.path}: unexpected file {name}: {what} holds only <Alphabet>/characterNN/<id>_<drawer>.png"
            )
        key, number, drawer = (m.group(1), m.group(2)), int(m.group(3)), int(m.group(4))
        if ids.setdefault(key, number) != number:
            raise BenchError(
                f"{source.path}: {key[0]}/{key[1]} mixes character ids {ids[key]:04d} and {number:04d}: not {what}"
            )
        by_folder.setdefault(key, {})[drawer] = name
    alphabets = {a for a, _ in by_folder}
    if (len(alphabets), len(by_folder)) != (shape.n_alphabets, shape.n_characters):
        raise BenchError(
            f"{source.path}: {len(by_folder)} characters in {len(alphabets)} alphabets, expected "
            f"{shape.n_characters} in {shape.n_alphabets} ({what}): the file is incomplete or "
            "another dataset"
        )
    expected_ids = set(range(shape.offset + 1, shape.offset + shape.n_characters + 1))
    if set(ids.values()) != expected_ids:
        odd = min(set(ids.values()) ^ expected_ids)
        raise BenchError(
            f"{source.path}: character ids are not {min(expected_ids):04d}..{max(expected_ids):04d} "
            f"(first odd one: {odd:04d}): not {what}"
        )
    drawers = set(range(1, N_DRAWERS + 1))
    for key, files in by_folder.items():
        if set(files) != drawers:
            raise BenchError(
                f"{source.path}: {key[0]}/{key[1]} has {len(files)} drawings, expected drawers "
                f"01..{N_DRAWERS:02d}: the file is incomplete"
            )
    order = sorted(by_folder, key=lambda k: ids[k])
    return SetIndex(
        files=tuple(by_folder[k][d] for k in order for d in sorted(drawers)),
        alphabet={ids[k] - 1: k[0] for k in order},
        class_names={ids[k] - 1: f"{k[0]}/{k[1]}" for k in order},
    )


def convert(source: Source, files: Sequence[str], size: int) -> np.ndarray:
    """Decode `files` (1-bit PNG, paper white) to ink 1.0 and area-resize to (N, 1, size, size) float32."""
    out = np.empty((len(files), 1, size, size), dtype=np.float32)
    for start in range(0, len(files), CHUNK):
        paper = np.stack([source.png(n) for n in files[start : start + CHUNK]])[:, None]
        out[start : start + CHUNK] = resize_area(paper, size, convert=paper_to_ink)
    return out


def load_omniglot(split: str, root: str | Path | None = None, size: int = 28) -> LabeledData:
    """The background or evaluation set as (N, 1, size, size) ink images, N = characters x 20.

    The converted tensors are cached (`cached_arrays`) under a key of the
    source's `Source.fingerprint` (member names, sizes and CRC32s of a zip,
    names and `stat_key`s of a folder), `size` and `PREPROCESS_VERSION`.
    The layout is checked on every load (names only, milliseconds); the
    images are decoded and checked on a cache miss.
    """
    shape = _shape(split)
    path = find_set(split, root)
    what = f"Omniglot's {shape.folder}" + (".zip" if path.suffix == ".zip" else "")
    with Source(path, f"{shape.folder}/", what) as source:
        index = index_set(source, shape)
        key = {"source": source.fingerprint(), "size": size, "version": PREPROCESS_VERSION}
        x = cached_arrays(f"omniglot-{split}-{size}", key, lambda: {"x": convert(source, index.files, size)})["x"]
    ids = range(shape.offset, shape.offset + shape.n_characters)
    y = np.repeat(np.arange(ids.start, ids.stop, dtype=np.int64), N_DRAWERS)
    meta = {"alphabet": dict(index.alphabet), "class_names": dict(index.class_names), "source": str(path), "ink": 1.0}
    return LabeledData(torch.from_numpy(x), torch.from_numpy(y), f"omniglot:{split}", meta)


# --------------------------------------------------------------------------- Lake's runs

_RUN_LINE = re.compile(r"^(run\d+)/test/(item\d+\.png)\s+(run\d+)/training/(class\d+\.png)$")


def _run_candidates(root: Path) -> list[Path]:
    return [root / DATASET / RUNS_FILE, root / DATASET / RUNS_FOLDER]


def load_lake_runs(root: str | Path | None = None, size: int = 28) -> list[OneShotRun]:
    """Lake et al.'s 20 published 20-way one-shot runs, preprocessed like the set images.

    Read from ``omniglot/all_runs.zip`` (checked against the publisher's
    sha256: the file is the original release's, byte for byte, and the hash
    keys the cache) or from the folder it unpacks to, ``omniglot/all_runs/``
    (``run01/`` ... inside; cache keyed by names, sizes and mtimes).
    Each run: ``train_x`` the 20 training images (``classNN.png`` in order),
    ``test_x`` the 20 test images (``itemNN.png`` in order), ``answer[i]``
    the position in ``train_x`` of the class of test image ``i``, read from
    the run's class_labels.txt. Images are (1, size, size), ink 1.0.
    """
    path = _find(root, _run_candidates)
    if path is None:
        raise _not_found(
            root,
            RUNS_FILE,
            "python/one-shot-classification/",
            f"or unzip it into {RUNS_FOLDER}/ there",
            _run_candidates,
        )
    with Source(path, "", f"Lake's {RUNS_FILE}") as source:
        fingerprint = check_sha256(path, SHA256[RUNS_FILE]) if path.is_file() else source.fingerprint()
        key = {"source": fingerprint, "size": size, "version": PREPROCESS_VERSION}
        arrays = cached_arrays(f"omniglot-runs-{size}", key, lambda: _read_runs(source, size))
    train, test, answer = (torch.from_numpy(arrays[k]) for k in ("train", "test", "answer"))
    names = [str(n) for n in arrays["names"]]
    return [OneShotRun(train[r], test[r], answer[r], names[r]) for r in range(train.shape[0])]


def _read_runs(source: Source, size: int) -> dict[str, np.ndarray]:
    members = source.names()
    runs = sorted({n.split("/")[0] for n in members if n.endswith("/class_labels.txt") and n.count("/") == 1})
    if len(runs) != N_RUNS:
        raise BenchError(
            f"{source.path}: {len(runs)} runs with a class_labels.txt, expected {N_RUNS}: not {source.what}"
        )
    train, test, answer = [], [], []
    for run in runs:
        train_files = sorted(n for n in members if n.startswith(f"{run}/training/") and n.endswith(".png"))
        test_files = sorted(n for n in members if n.startswith(f"{run}/test/") and n.endswith(".png"))
        if (len(train_files), len(test_files)) != (20, 20):
            raise BenchError(
                f"{source.path}: {run} has {len(train_files)} training and {len(test_files)} test "
                "images, expected 20 and 20"
            )
        pairs = _run_labels(source.read(f"{run}/class_labels.txt").decode(), run, source.path)
        position = {name: i for i, name in enumerate(train_files)}
        try:
            answer.append([position[pairs[name]] for name in test_files])
        except KeyError as err:
            raise BenchError(f"{source.path}: {run}/class_labels.txt has no valid entry for {err}") from err
        train.append(np.stack([source.png(n) for n in train_files]))
        test.append(np.stack([source.png(n) for n in test_files]))
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
