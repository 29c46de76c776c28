"""Peak memory of a `dmlbench train` run on a folder of N generated JPEGs: does it grow with N?

Writes N small JPEGs (class sub-folders, 50 images a class by default) to
a temporary folder, runs a short ``dmlbench train`` on it (half the classes
held out as test classes, so the run also embeds and scores them) in a
fresh process, and reports that process's peak resident memory (``VmHWM``
of /proc/self/status, read as it ends) and the largest of its loader
workers (``getrusage(RUSAGE_CHILDREN).ru_maxrss``).

    .venv/bin/python scripts/measure_rss.py --images 5000 50000 [--iterations 200] [--workers 2]

``--code DIR`` runs another checkout's ``bench`` (say, the commit before
lazy loading) with the same interpreter, for a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

RUNNER = """
import json, resource, sys
from bench.cli import main
rc = main(sys.argv[1:])
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"rc": rc, "vmhwm_mb": int(status["VmHWM"].split()[0]) / 1024,
                  "children_max_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def write_jpegs(root: Path, images: int, per_class: int, side: int, seed: int = 0) -> None:
    """`images` JPEGs of side x side, `per_class` to a class, each class around its own colour."""
    rng = np.random.default_rng(seed)
    classes = -(-images // per_class)
    for c in range(classes):
        folder = root / f"class{c:05d}"
        folder.mkdir(parents=True)
        base = rng.integers(0, 256, 3)
        for i in range(min(per_class, images - c * per_class)):
            pixels = np.clip(base + rng.integers(-60, 60, (side, side, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, "RGB").save(folder / f"{i:04d}.jpg", quality=90)


def measure(folder: Path, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    command = [
        "train",
        "--data",
        f"folder:{folder}",
        "--split",
        "0.5",
        "--size",
        str(args.side),
        "--trunk",
        "conv4",
        "--embedding-dim",
        "64",
        "--P",
        "32",
        "--K",
        "4",
        "--iterations",
        str(args.iterations),
        "--threads",
        "1",
        "--tracking-uri",
        str(workdir / "mlflow.db"),
        "--quiet",
        "--format",
        "json",
    ]
    if args.code is None:
        command += ["--workers", str(args.workers)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if args.code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.code), env.get("PYTHONPATH")]))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *command],
        env=env,
        cwd=args.code or None,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"dmlbench train failed ({done.returncode}):\n{done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["rc"] != 0:
        sys.exit(f"dmlbench train exited {out['rc']}:\n{done.stderr[-2000:]}")
    out["seconds"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[5000, 50000])
    parser.add_argument("--per-class", type=int, default=50)
    parser.add_argument("--side", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2, help="loader workers of the run")
    parser.add_argument("--code", type=Path, default=None, help="a checkout whose bench/ to run instead")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dmlbench-rss-") as tmp:
        for n in args.images:
            folder = Path(tmp) / f"jpegs{n}"
            started = time.perf_counter()
            write_jpegs(folder, n, args.per_class, args.side)
            print(f"wrote {n} JPEGs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            row = {"images": n, **measure(folder, args, Path(tmp))}
            rows.append(row)
            print(
                f"{n:>7} images: peak RSS {row['vmhwm_mb']:.0f} MB (largest worker {row['children_max_mb']:.0f} MB), "
                f"{row['seconds']:.0f} s",
                flush=True,
            )
    if len(rows) > 1:
        print(
            f"ratio of peak RSS, {rows[-1]['images']} vs {rows[0]['images']} images: "
            f"{rows[-1]['vmhwm_mb'] / rows[0]['vmhwm_mb']:.2f}x"
        )


if __name__ == "__main__":
    main()
