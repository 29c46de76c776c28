"""A fingerprint of the data a run reads, so that a sweep on changed data never reuses old records.

Class-id fingerprints (`bench.data.splits`) say *which* classes a split
holds; this says *what* their samples are. Two cases, chosen for cost:

* **Data in memory** (arrays read from ``.npz``, idx, Omniglot's converted
  images, ...): BLAKE2b over the tensor's bytes and the labels, exactly what
  training reads. Omniglot's two sets at 28x28 (32,460 images) hash in about
  0.1 s.
* **Image files read on demand** (`ImageFiles`: folders, CUB, Cars, SOP,
  In-shop, Market): each file's relative path and the BLAKE2b of its bytes,
  plus the decode options and `DECODE_RULES`. The per-file digests are kept
  in the cache (``$DMLBENCH_CACHE/fingerprints/``) keyed by path and by what
  ``stat`` says of the file: size, modification time, and the change time,
  inode and device, which no rewrite can keep (``touch -r``, ``cp -p`` and
  ``rsync -a`` restore the modification time, never the change time). Only
  a new or changed file is read again: the first run reads every file once
  (SOP's 120,053 JPEGs, 3 GB: seconds, less than one epoch of decoding),
  later runs one ``stat`` a file. A digest is not kept while the file's
  times are within `bench.data.cache.RACY_NS` of the moment it was read (a rewrite in the
  same tick of a coarse clock would keep every time). Content, not times,
  is hashed, so two machines with their own copies of the same files agree.
  What the cache can still miss: bytes changed under a file system that
  does not keep change times or inode numbers (some network and FUSE
  mounts), or written to the disk below the file system.

Labels and per-sample facts are hashed in both cases. The digest is stable
across machines and checkouts: paths are taken relative to the dataset's
root, never absolute.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.atomic import write_json
from bench.data.cache import cache_dir, settled, stat_key
from bench.data.images import DECODE_RULES, ImageFiles

__all__ = ["content_fingerprint"]

DIGEST_SIZE = 16  # bytes: 32 hex characters


def content_fingerprint(*parts: Any) -> str:
    """One digest over the data of every part (`LabeledData`, `QueryGallery`, Lake's runs, None), in order."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    for part in parts:
        _update(h, part)
    return h.hexdigest()


def _update(h: Any, value: Any) -> None:
    if value is None:
        h.update(b"none;")
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"tensor {t.dtype} {tuple(t.shape)};".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes())
    elif isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        h.update(f"array {a.dtype} {a.shape};".encode())
        h.update(a.tobytes())
    elif isinstance(value, ImageFiles):
        _files(h, value)
    elif isinstance(value, (list, tuple)):
        h.update(f"seq {len(value)};".encode())
        for item in value:
            _update(h, item)
    elif hasattr(value, "x") and hasattr(value, "y"):  # LabeledData
        h.update(b"data;")
        _update(h, value.x)
        _update(h, value.y)
        for key in sorted(getattr(value, "per_sample", {}) or {}):
            h.update(f"sample {key};".encode())
            _update(h, value.per_sample[key])
    elif hasattr(value, "query") and hasattr(value, "gallery"):  # QueryGallery
        h.update(b"query-gallery;")
        for part in (
            value.query,
            value.gallery,
            getattr(value, "query_ids", None),
            getattr(value, "gallery_ids", None),
        ):
            _update(h, part)
    elif hasattr(value, "__dict__"):  # a small record (a one-shot run): its fields in order
        h.update(f"{type(value).__name__};".encode())
        for key in sorted(vars(value)):
            h.update(f"{key}=".encode())
            _update(h, vars(value)[key])
    else:
        h.update(f"{type(value).__name__} {value!r};".encode())


def _files(h: Any, files: ImageFiles) -> None:
    """Relative path and content digest of every file, and how it is decoded (digests cached by stat)."""
    h.update(
        f"files {len(files)} size={files.size} resize={files.resize} channels={files.channels} "
        f"decode={DECODE_RULES};".encode()
    )
    root = Path(files.root)
    store = (
        cache_dir()
        / "fingerprints"
        / (hashlib.blake2b(str(root.resolve()).encode(), digest_size=8).hexdigest() + ".json")
    )
    try:
        known: dict[str, list[Any]] = json.loads(store.read_text())
    except (OSError, ValueError):  # none yet, or a half-written one from a killed process: rebuilt
        known = {}
    changed = False
    for rel in files.paths.tolist():
        try:
            st = os.stat(root / rel)
        except OSError:
            h.update(f"{rel}\0missing\n".encode())
            continue
        key = stat_key(st)
        entry = known.get(rel)
        if not (isinstance(entry, list) and len(entry) == len(key) + 1 and entry[:-1] == key):
            entry = [*key, _file_digest(root / rel)]
            if settled(st):
                known[rel] = entry
                changed = True
            else:  # written moments ago: a rewrite within the clock's tick could keep every time, so not kept
                changed = known.pop(rel, None) is not None or changed
        h.update(f"{rel}\0{entry[-1]}\n".encode())
    if changed:
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            write_json(store, known)
        except OSError:  # a read-only or full cache: the fingerprint is still right, only slower next time
            pass


def _file_digest(path: Path) -> str:
    d = hashlib.blake2b(digest_size=DIGEST_SIZE)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            d.update(block)
    return d.hexdigest()
