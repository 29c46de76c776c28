"""Every image file of a dataset decoded once before anything trains, so a damaged one is named by `validate`.

Reading a file's header (what loading does) finds a file that is no image;
a file cut short (a copy interrupted, a download truncated) or a mode whose
values are out of range (`bench.data.images`) shows only when its pixels
are decoded, which a sweep does mid-run. `check_files` decodes each file in
threads (Pillow releases the GIL while decoding; a JPEG is decoded at an
eighth of its size, which still reads every byte of its data) and keeps
the files that decoded in ``$DMLBENCH_CACHE/decoded/``, keyed like the
fingerprint's digests (`bench.data.fingerprint.stat_key`) and by the value
rules (`DECODE_RULES`): a later check decodes only a new or changed file,
one ``stat`` a file otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image

from bench.atomic import write_json
from bench.data.cache import cache_dir, settled, stat_key
from bench.data.images import (
    DECODE_RULES,
    GRAY_MODES,
    ImageFiles,
    check_pixels,
    convert_mode,
    pil_open,
    scale_wide,
)
from bench.errors import BenchError

MAX_THREADS = 8


def check_files(sets: Iterable[ImageFiles], threads: int | None = None) -> int:
    """Decode every file of `sets` not known to decode; one line naming the first that fails (in path order,
    with how many others failed). Returns how many files were decoded now."""
    decoded = 0
    for files in sets:
        decoded += _check_one(files, threads)
    return decoded


def _check_one(files: ImageFiles, threads: int | None) -> int:
    root = Path(files.root)
    store = (
        cache_dir() / "decoded" / (hashlib.blake2b(str(root.resolve()).encode(), digest_size=8).hexdigest() + ".json")
    )
    try:
        known: dict[str, list[Any]] = json.loads(store.read_text())
    except (OSError, ValueError):  # none yet, or damaged: everything is decoded again
        known = {}
    todo: list[tuple[str, os.stat_result]] = []
    for rel in sorted(set(files.paths.tolist())):
        try:
            st = os.stat(root / rel)
        except OSError:
            raise BenchError(f"missing image file {root / rel}") from None
        if known.get(rel) != [*stat_key(st), DECODE_RULES]:
            todo.append((rel, st))
    if not todo:
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = max(1, min(MAX_THREADS, threads or cpus, len(todo)))
    with ThreadPoolExecutor(workers) as pool:
        errors = list(pool.map(lambda item: _decode(root / item[0]), todo))
    failed = [e for e in errors if e is not None]
    for (rel, st), error in zip(todo, errors):
        if error is None and settled(st):
            known[rel] = [*stat_key(st), DECODE_RULES]
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        write_json(store, known)
    except OSError:  # a read-only cache: the check is still made, every time
        pass
    if failed:
        more = f" (and {len(failed) - 1} other file(s) of {root})" if len(failed) > 1 else ""
        raise BenchError(f"{failed[0]}{more}")
    return len(todo)


def _decode(file: Path) -> str | None:
    """None when `file` decodes as a sweep would read it (pixels and value range), else the one-line reason."""
    try:
        with pil_open(file) as img:
            check_pixels(img, file)
            if img.format == "JPEG":  # an eighth of the size: every byte of the entropy-coded data is still read
                img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
            if img.mode.startswith(("I", "F")):
                scale_wide(img, file)
            else:
                convert_mode(img, "L" if img.mode in GRAY_MODES else "RGB", file)
        return None
    except BenchError as err:
        return str(err)
    except FileNotFoundError:
        return f"missing image file {file}"
    except Image.DecompressionBombError as err:
        return f"image {file} refused as a decompression bomb: {err}"
    except Exception as err:  # noqa: BLE001 - any failure to decode is this file's, named in one line
        return f"corrupt or unreadable image {file} ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
