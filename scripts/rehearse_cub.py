"""A field-size rehearsal of ``protocols/reality-check-cub.yaml``: CUB's shape, a random BN-Inception.

1. ``--generate``: writes a CUB-shaped data root (``CUB_200_2011/`` with ``images.txt``,
   ``image_class_labels.txt``, ``train_test_split.txt``, ``classes.txt``, ``bounding_boxes.txt`` and
   ``images/<class>/<file>.jpg``): 11,788 JPEGs in 200 classes, 5,864 in species 1-100 and 5,924 in
   101-200 (CUB's counts), of CUB's typical sizes (500 pixels on the long side, the other 250-500;
   smooth colour fields with shapes, so files are photo-sized, not noise-sized). The pixels are
   synthetic: nothing learned here means anything.
2. ``--protocol``: writes the rehearsal protocol, the real one with these changes only: the name
   says REHEARSAL, ``model.pretrained: null`` (BN-Inception initialised at random; the published
   weights are not on this machine, and a missing weights file is an error, never a silent
   fallback), one cell, one trial, two validation folds (``validation.use: 2``, the fewest the folds mode takes), ``--iterations``
   with early-stopping checks every ``--check-every``, one final seed in the folds mode (so the
   concatenated evaluation over the whole test set runs), and ``--device``.
3. ``--run``: runs it (``dmlbench run``) in a fresh process under ``/usr/bin/time -v``, then prints
   the manifest's time accounting, the peak RSS, and ``dmlbench plan``'s estimate of the same protocol.

    .venv/bin/python scripts/rehearse_cub.py --root /tmp/cub-rehearsal --generate --protocol --run

Every result of such a run is labelled by its protocol's name (``reality-check-cub-REHEARSAL-random-init``):
it is a timing and memory rehearsal, not a result.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parents[1]
TRAIN_COUNTS = [59] * 64 + [58] * 36  # 5,864 images in species 1-100
TEST_COUNTS = [60] * 24 + [59] * 76  # 5,924 in species 101-200
NAME = "reality-check-cub-REHEARSAL-random-init"


def _image(rng: random.Random, nrng: np.random.Generator) -> Image.Image:
    """A CUB-sized picture: a smooth colour field (a coarse random grid upsampled) and a few shapes."""
    long, short = 500, rng.randint(250, 500)
    w, h = (long, short) if rng.random() < 0.8 else (short, long)
    coarse = nrng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(1, 4)):
        x0, y0 = rng.randrange(w - 20), rng.randrange(h - 20)
        box = (x0, y0, rng.randint(x0 + 10, w), rng.randint(y0 + 10, h))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=tuple(rng.randrange(256) for _ in range(3)))
    return img


def generate(root: Path, seed: int = 0, counts: list[int] | None = None) -> int:
    """Write the CUB-shaped folder under `root` (`counts`: images of species 1, 2, ...; CUB's by default);
    returns the number of images (11,788)."""
    folder = root / "CUB_200_2011"
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    lines: dict[str, list[str]] = {k: [] for k in ("images", "labels", "split", "classes", "boxes")}
    image_id = 0
    for species, count in enumerate(TRAIN_COUNTS + TEST_COUNTS if counts is None else counts, start=1):
        name = f"{species:03d}.Bird_{species}"
        lines["classes"].append(f"{species} {name}")
        (folder / "images" / name).mkdir(parents=True, exist_ok=True)
        for k in range(count):
            image_id += 1
            relative = f"{name}/Bird_{species}_{k + 1:04d}_{image_id}.jpg"
            img = _image(rng, nrng)
            img.save(folder / "images" / relative, "JPEG", quality=85)
            w, h = img.size
            lines["images"].append(f"{image_id} {relative}")
            lines["labels"].append(f"{image_id} {species}")
            lines["split"].append(f"{image_id} {int(k % 2 == 0)}")
            lines["boxes"].append(f"{image_id} {w * 0.1:.1f} {h * 0.1:.1f} {w * 0.8:.1f} {h * 0.8:.1f}")
    for file, key in (
        ("images.txt", "images"),
        ("image_class_labels.txt", "labels"),
        ("train_test_split.txt", "split"),
        ("classes.txt", "classes"),
        ("bounding_boxes.txt", "boxes"),
    ):
        (folder / file).write_text("\n".join(lines[key]) + "\n")
    return image_id


def rehearsal_protocol(iterations: int, check_every: int, device: str, loss: str) -> dict:
    """The real protocol with the rehearsal's changes (see the module docstring); nothing else differs."""
    spec = yaml.safe_load((REPO / "protocols" / "reality-check-cub.yaml").read_text())
    spec["name"] = NAME
    spec["description"] = (
        "REHEARSAL ONLY: reality-check-cub at real size on CUB-shaped synthetic images, BN-Inception "
        "initialised at random (no published weights): timing and memory, not a result"
    )
    spec["model"]["pretrained"] = None
    spec["data"]["validation"]["use"] = 2  # the folds mode needs two: their concatenation is the test model
    spec["training"]["iterations"] = iterations
    spec["training"]["device"] = device
    spec["training"]["early_stopping"] = {
        "metric": "map_at_r",
        "check_every": check_every,
        "patience": 5,
        "max_iterations": iterations,
    }
    spec["tuning"] = {"trials": 1, "startup_trials": 1, "pruner": {"type": "none"}}
    spec["final"] = {"seeds": 1, "mode": "folds"}
    spec["grid"] = {
        "losses": [m for m in spec["grid"]["losses"] if m["name"] == loss][:1],
        "miners": [{"name": "none"}],
    }
    return spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="data root (outside the repository)")
    parser.add_argument("--generate", action="store_true")
    parser.add_argument("--protocol", action="store_true")
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--check-every", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--loss", default="contrastive")
    parser.add_argument("--store", type=Path, default=None, help="run store (default: ROOT/store)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for plan and run")
    args = parser.parse_args()
    root = args.root.resolve()
    if REPO in root.parents or root == REPO:
        sys.exit("--root must be outside the repository")
    if args.generate:
        start = time.perf_counter()
        n = generate(root)
        print(json.dumps({"generated": n, "seconds": round(time.perf_counter() - start, 1), "root": str(root)}))
    protocol = root / f"{NAME}.yaml"
    if args.protocol:
        text = yaml.safe_dump(
            rehearsal_protocol(args.iterations, args.check_every, args.device, args.loss), sort_keys=False
        )
        protocol.write_text(
            "# REHEARSAL ONLY (scripts/rehearse_cub.py): random BN-Inception, synthetic images.\n" + text
        )
        print(json.dumps({"protocol": str(protocol)}))
    if args.run:
        store = (args.store or root / "store").resolve()
        store.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "DMLBENCH_DATA": str(root)}
        dml = str(Path(sys.executable).with_name("dmlbench"))
        threads = ["--threads", str(args.threads)] if args.threads else []
        plan = subprocess.run(
            [dml, "plan", str(protocol), "--data-root", str(root), *threads], capture_output=True, text=True, env=env
        )
        print(plan.stdout + plan.stderr, flush=True)
        sweep = [
            "--storage",
            f"sqlite:///{store}/optuna.db",
            "--tracking-uri",
            str(store / "mlflow.db"),
            "--results-dir",
            str(store / "results"),
            "--data-root",
            str(root),
            *threads,
        ]
        start = time.perf_counter()
        run = subprocess.run(
            ["/usr/bin/time", "-v", dml, "run", str(protocol), *sweep], capture_output=True, text=True, env=env
        )
        print(json.dumps({"rc": run.returncode, "wall_s": round(time.perf_counter() - start, 1)}))
        print(run.stdout[-6000:])
        print(run.stderr[-8000:])


if __name__ == "__main__":
    main()
