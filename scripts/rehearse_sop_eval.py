"""An evaluation rehearsal at Stanford Online Products' size: one test evaluation of ``reality-check-sop.yaml``.

SOP's test side is the largest of the field protocols: 60,502 images of 11,316 products, ranked each against
all the others with Recall@k up to k = 1,000. Every final seed and every floor seed of the real protocol
evaluates it; this script times one such evaluation here at real size.

1. ``--generate``: writes a SOP-shaped data root (``Stanford_Online_Products/`` with ``Ebay_train.txt`` and
   ``Ebay_test.txt`` in the publisher's format, ``<super>_final/<product>_<k>.JPG`` files): SOP's counts
   (train: 11,318 products, 59,551 images; test: 11,316 products, 60,502 images; 2-12 images a product)
   and eBay-listing-sized JPEGs (300-640 pixels on the long side: an assumption, SOP's own sizes vary).
   Only the test images are drawn: the train files are hard links to them, since an evaluation reads no
   training image (the reader still checks that every listed file exists). The pixels are synthetic.
2. ``--run``: the real protocol with ``model.pretrained: null`` (BN-Inception initialised at random: the
   published weights are not on this machine) and ``--device``; it prepares the data as a sweep does,
   then scores one floor seed (`bench.sweep.floor.floor_row`: the untrained trunk embeds the test side
   through the evaluation loader and every metric of the protocol is computed, exactly a floor seed's
   work, a final seed's too but for its training) in this process, and prints the wall time by part, the
   peak memory (this process and the loader's workers) and `dmlbench plan`'s estimate of the same
   evaluation (`bench.plan.cost`: the trunk's embedding and the loader timed here just before, as `plan`
   times them; plan's training steps are not timed, an evaluation trains nothing).

    .venv/bin/python scripts/rehearse_sop_eval.py --root /tmp/sop-rehearsal --generate --run --threads 2

It is a timing and memory rehearsal, not a result: nothing it scores is written anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image, ImageDraw

from bench.plan.cost import (
    OVERHEAD_S_PER_RUN,
    _test_eval_s,
    _test_metrics_s,
    bounded_by_loader,
    dataset_size,
    measured_cost,
    sized_test,
)
from bench.plan.measure import measure_loader, measure_trunk
from bench.protocol.load import parse_protocol
from bench.sweep.floor import floor_row
from bench.sweep.prepare import prepare

REPO = Path(__file__).resolve().parents[1]
SUPER = ("bicycle", "cabinet", "chair", "coffee_maker", "fan", "kettle", "lamp", "mug", "sofa", "stapler",
         "table", "toaster")  # fmt: skip
TRAIN = (11_318, 59_551)  # products, images
TEST = (11_316, 60_502)


def product_counts(products: int, images: int, rng: random.Random) -> list[int]:
    """Images per product, each 2-12, summing to ``images`` (SOP's range; the mean is the split's)."""
    counts = [2] * products
    extra = images - 2 * products
    while extra > 0:
        i = rng.randrange(products)
        if counts[i] < 12:
            counts[i] += 1
            extra -= 1
    return counts


def _image(rng: random.Random, nrng: np.random.Generator) -> Image.Image:
    """A listing-sized picture: a smooth colour field on a light background, a few shapes."""
    long = rng.randint(300, 640)
    short = int(long * rng.uniform(0.6, 1.0))
    w, h = (long, short) if rng.random() < 0.5 else (short, long)
    coarse = nrng.integers(120, 256, (5, 5, 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(1, 3)):
        x0, y0 = rng.randrange(w - 20), rng.randrange(h - 20)
        box = (x0, y0, rng.randint(x0 + 10, w), rng.randint(y0 + 10, h))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=tuple(rng.randrange(256) for _ in range(3)))
    return img


def generate(root: Path, seed: int = 0, train: tuple[int, int] = TRAIN, test: tuple[int, int] = TEST) -> dict:
    """Write the SOP-shaped folder under ``root``; returns the images per split."""
    folder = root / "Stanford_Online_Products"
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    drawn: list[Path] = []
    product = 0
    written = {}
    for split, (products, images) in (("test", test), ("train", train)):
        lines = ["image_id class_id super_class_id path"]
        for count in product_counts(products, images, rng):
            product += 1
            super_class = (product - 1) % len(SUPER) + 1
            for k in range(count):
                relative = f"{SUPER[super_class - 1]}_final/{111085100000 + product}_{k}.JPG"
                path = folder / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                if split == "test":
                    _image(rng, nrng).save(path, "JPEG", quality=85)
                    drawn.append(path)
                elif not path.exists():
                    os.link(drawn[(len(lines) - 1) % len(drawn)], path)
                lines.append(f"{len(lines)} {product} {super_class} {relative}")
        written[split] = len(lines) - 1
        (folder / f"Ebay_{split}.txt").write_text("\n".join(lines) + "\n")
    return written


def rehearsal_protocol(device: str) -> dict:
    """The real protocol, its trunk initialised at random and on ``device``; nothing else differs."""
    spec = yaml.safe_load((REPO / "protocols" / "reality-check-sop.yaml").read_text())
    spec["name"] = "reality-check-sop-EVAL-REHEARSAL-random-init"
    spec["model"]["pretrained"] = None
    spec["training"]["device"] = device
    return spec


def _peak_mb() -> dict[str, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"process_mb": round(own, 1), "largest_loader_worker_mb": round(children, 1)}


def run(root: Path, device: str, threads: int | None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    protocol = parse_protocol(yaml.safe_dump(rehearsal_protocol(device), sort_keys=False), "sop-eval-rehearsal")
    out: dict = {"threads": torch.get_num_threads(), "device": device}
    began = time.perf_counter()
    prepared = prepare(protocol, str(root))
    out["prepare_s"] = round(time.perf_counter() - began, 1)
    out["test_images"] = len(prepared.test.y)
    began = time.perf_counter()
    # the embedding only: an evaluation trains nothing, and one BN-Inception step at SOP's batch takes minutes
    cost = measured_cost(protocol, measure_trunk(protocol, threads=threads, train_steps=False))
    rate, source = measure_loader(protocol, str(root))  # plan's own: the training loader's rate timed here
    cost, _ = bounded_by_loader(protocol, cost, rate, source)  # on the CPU: each evaluated image decoded too
    out["plan_loader_images_per_s"] = None if rate is None else round(rate, 1)
    out["plan_timing_s"] = round(time.perf_counter() - began, 1)
    out["plan_test_images"] = int(dataset_size(sized_test(protocol.spec.data.test), protocol.spec.data.test_classes)[1])
    out["plan_embed_ms_per_image"] = round(cost.embed_s * 1000, 2)
    out["plan_eval_s"] = round(_test_eval_s(protocol, cost) + OVERHEAD_S_PER_RUN * cost.slowdown, 1)
    out["plan_metrics_s"] = round(_test_metrics_s(protocol, cost), 1)
    load = os.getloadavg()[0]
    cpu0 = time.process_time()
    began = time.perf_counter()
    row = floor_row(protocol, prepared, protocol.final_seeds[0])
    out["eval_s"] = round(time.perf_counter() - began, 1)
    out["eval_cpu_s"] = round(time.process_time() - cpu0, 1)
    out["load_before"] = round(load, 2)
    # plan sizes SOP by its published counts: a ratio only where the generated test side has them
    same = out["test_images"] == out["plan_test_images"]
    out["measured_over_plan"] = round(out["eval_s"] / out["plan_eval_s"], 2) if same else None
    out["metrics"] = {k: v for k, v in row.items() if isinstance(v, float)}
    out["peak"] = _peak_mb()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="data root (outside the repository)")
    parser.add_argument("--generate", action="store_true")
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    root = args.root.resolve()
    if REPO in root.parents or root == REPO:
        sys.exit("--root must be outside the repository")
    if args.generate:
        began = time.perf_counter()
        written = generate(root)
        print(json.dumps({"generated": written, "seconds": round(time.perf_counter() - began, 1)}), flush=True)
    if args.run:
        print(json.dumps(run(root, args.device, args.threads), indent=1), flush=True)


if __name__ == "__main__":
    main()
