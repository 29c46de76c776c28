"""What the pre-flight's decode of every image file (`bench.data.decode_check`) costs, cold and remembered.

Writes ``--files`` JPEGs into a temporary folder outside the repository (``--side`` px a side, or the test
fixtures' 10-24 px with ``--side 0``; a smooth colour field with a little noise, like a product photo), waits
until their times are older than the cache's racy window, then times `check_files` with an empty cache
(every file decoded: the first `validate` or `run` on a dataset) and again (every file remembered: one
``stat`` a file), and prints files/s and what that rate means for SOP's 120,053 files.

    .venv/bin/python benchmarks/bench_decode_check.py [--files 2000] [--side 500] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

SOP_FILES = 120_053


def write(root: Path, files: int, side: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(files):
        if side:
            w, h = (int(side * f) for f in rng.uniform(0.6, 1.2, 2))
        else:
            w, h = (int(v) for v in rng.integers(10, 25, 2))
        field = Image.fromarray(rng.integers(0, 256, (h // 16 + 2, w // 16 + 2, 3)).astype(np.uint8))
        pixels = np.asarray(field.resize((w, h), Image.BICUBIC), dtype=np.float64) + rng.normal(0, 6, (h, w, 3))
        rel = f"c{i % 100}/{i}.jpg"
        (root / rel).parent.mkdir(exist_ok=True)
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(root / rel, "JPEG", quality=85)
        paths.append(rel)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--side", type=int, default=500, help="pixels a side (0: the test fixtures' 10-24)")
    parser.add_argument("--threads", type=int, default=None, help="decoding threads (default: the CPUs here)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DMLBENCH_CACHE"] = str(Path(tmp) / "cache")
        from bench.data import cache
        from bench.data.decode_check import check_files
        from bench.data.images import ImageFiles

        root = Path(tmp) / "images"
        root.mkdir()
        paths = write(root, args.files, args.side)
        size = sum((root / p).stat().st_size for p in paths) / len(paths)
        time.sleep(cache.RACY_NS / 1e9 + 0.5)  # older than the racy window: remembered once decoded
        files = ImageFiles(root, np.asarray(paths), 32)
        for label in ("cold (every file decoded)", "remembered (one stat a file)"):
            start = time.perf_counter()
            decoded = check_files([files], threads=args.threads)
            seconds = time.perf_counter() - start
            rate = len(paths) / seconds
            print(
                f"{label}: {len(paths):,} files of {size / 1e3:.1f} kB, {decoded:,} decoded in {seconds:.2f} s: "
                f"{rate:,.0f} files/s; SOP's {SOP_FILES:,} files: {SOP_FILES / rate:,.0f} s"
            )


if __name__ == "__main__":
    main()
