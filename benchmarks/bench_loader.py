"""Which bounds a run on image files: the loader (decode + augment) or the trunk's training step?

Generates a folder of JPEGs (``--side`` px, class sub-folders), then, in
alternation ``--repeats`` times (the machine's noise hits each alike):

* the loader alone: images/s of PK batches decoded and augmented with the
  Reality Check's training pipeline (RandomResizedCrop ``--crop`` with scale
  0.16-1, horizontal flip) by 0 workers (in this process) and by ``--workers``;
* decode only, on the same files through the same loader and workers: each
  file opened, decoded by Pillow and made a uint8 tensor (``ToImage``), what
  every pipeline starts with; the full pipeline's rate over it is the
  pipeline's cost (the goal: within 1.5x);
* the decoded-image cache (``data.loader.cache``), on the same files through
  the same loader and workers: built once first (its time printed), then
  only the pipeline after its deterministic head runs a sample (``--resize
  N`` puts CUB's ``Resize`` before the crop, the head the cache stores;
  without it the whole decoded image is stored);
* augmentation on the device (``data.loader.augment_on: device``), on the
  same files with ``--workers``: the workers decode (and run the ``--resize``
  head), the crop and flip run on ``--device`` in this process;
* the training step alone: images/s of `bench.training.train` on the same
  batch shape from tensors already in memory (the difference of a long and
  a short run, so start-up drops out).

Medians are printed; when the loader with N workers delivers fewer images
a second than the step consumes, the loader bounds the run.

    .venv/bin/python benchmarks/bench_loader.py [--trunk conv4] [--device cuda] [--workers 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from bench.data import LabeledData, load
from bench.data.images import open_image
from bench.data.loading import ImageDataset, default_workers, loader_options, stream, train_batches
from bench.data.samplers import PKBatchSampler, PKSampler
from bench.training import TrainConfig, train


def write_jpegs(root: Path, images: int, classes: int, side: int, height: int | None = None) -> None:
    """``images`` JPEGs ``side`` wide and ``height`` (default: ``side``) high in ``classes`` folders."""
    rng = np.random.default_rng(0)
    height = height or side
    for i in range(images):
        folder = root / f"c{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        # smooth noise compresses like a photo, not like white noise (which JPEG decodes far slower)
        small = rng.integers(0, 256, (height // 8, side // 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize((side, height), Image.BILINEAR).save(folder / f"{i:05d}.jpg", quality=90)


class DecodeOnly(ImageDataset):
    """The file decoded and made a uint8 tensor, nothing else: what any pipeline starts from."""

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, int]:
        from bench.vision import torchvision

        torchvision()  # the one import of torchvision, beside the CPU torch wheel
        from torchvision.transforms.v2.functional import to_image

        index = int(key[2]) if isinstance(key, tuple) else int(key)
        with open_image(self.files.file(index)) as img:
            return to_image(img.convert("RGB")).as_subclass(torch.Tensor), index


def loader_rate(
    data: LabeledData, workers: int, batches: int, P: int, K: int, device: torch.device, decode_only: bool = False
) -> float:
    """Images a second delivered on `device`, after the first batch (worker start-up excluded)."""
    files = data.x.with_options(loader={**data.x.loader, "workers": workers})
    _, labels = torch.unique(data.y, return_inverse=True)
    sampler = PKBatchSampler(PKSampler(labels, P, K, seed=0), 0, batches + 1)
    it = (
        stream(DataLoader(DecodeOnly(files, True), batch_sampler=sampler, **loader_options(files, device)), device)
        if decode_only
        else train_batches(files, sampler, seed=0, device=device)
    )
    next(it)
    start = time.perf_counter()
    count = sum(len(xb) for xb, _ in it)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count / (time.perf_counter() - start)


def step_rate(trunk: str, shape: tuple[int, ...], steps: int, P: int, K: int, device: str, precision: str) -> float:
    """Images a second of training steps on tensors in memory: (long run - short run) / extra steps."""
    g = torch.Generator().manual_seed(0)
    data = LabeledData(torch.rand((P * 4, *shape), generator=g), torch.arange(P).repeat_interleave(4), "random")
    seconds = []
    for iterations in (2, 2 + steps):
        config = TrainConfig(
            trunk=trunk,
            embedding_dim=128,
            loss="triplet",
            P=P,
            K=K,
            iterations=iterations,
            device=device,
            precision=precision,
        )
        start = time.perf_counter()
        train(config, data)
        seconds.append(time.perf_counter() - start)
    return steps * P * K / max(seconds[1] - seconds[0], 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--classes", type=int, default=32)
    parser.add_argument("--side", type=int, default=500, help="width of the generated JPEGs (CUB's are ~500)")
    parser.add_argument("--height", type=int, default=375, help="height of the generated JPEGs")
    parser.add_argument("--crop", type=int, default=227, help="RandomResizedCrop size = data.image_size")
    parser.add_argument("--P", type=int, default=8)
    parser.add_argument("--K", type=int, default=4)
    parser.add_argument("--batches", type=int, default=10, help="batches timed per loader measurement")
    parser.add_argument("--steps", type=int, default=3, help="training steps timed per step measurement")
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--trunk", default="conv4", help="trunk name (any of `dmlbench list --kind trunk`)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads of this process")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--resize", type=int, default=None, help="a Resize to this side before the crop")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    head = [{"Resize": {"size": args.resize}}] if args.resize else []
    crop = [{"RandomResizedCrop": {"size": args.crop, "scale": [0.16, 1.0]}}, "RandomHorizontalFlip"]
    pipeline = {"train": head + crop}
    with tempfile.TemporaryDirectory(prefix="dmlbench-loader-") as tmp:
        write_jpegs(Path(tmp) / "images", args.images, args.classes, args.side, args.height)
        os.environ["DMLBENCH_CACHE"] = str(Path(tmp) / "cache")
        data = load(f"folder:{tmp}/images", size=args.crop, augment=pipeline)
        cached = load(f"folder:{tmp}/images", size=args.crop, augment=pipeline, loader={"cache": True})
        on_device = load(f"folder:{tmp}/images", size=args.crop, augment=pipeline, loader={"augment_on": "device"})
        start = time.perf_counter()
        assert cached.x.cache["train"].ensure(args.workers), "the cache was not built"
        build_s = time.perf_counter() - start
        cache_mb = sum(f.stat().st_size for f in (Path(tmp) / "cache" / "images").glob("*.u8")) / 1e6
        rates: dict[str, list[float]] = {
            "decode only, 0 workers": [],
            "loader, 0 workers": [],
            "cache, 0 workers": [],
            f"decode only, {args.workers} workers": [],
            f"loader, {args.workers} workers": [],
            f"cache, {args.workers} workers": [],
            f"augment on {args.device}, {args.workers} workers": [],
            f"{args.trunk} step": [],
        }
        ratios: dict[int, list[float]] = {0: [], args.workers: []}
        cache_ratios: dict[int, list[float]] = {0: [], args.workers: []}
        for _ in range(args.repeats):  # decode only, the full pipeline and the cache alternate
            for workers in (0, args.workers):
                decoded = loader_rate(data, workers, args.batches, args.P, args.K, device, decode_only=True)
                full = loader_rate(data, workers, args.batches, args.P, args.K, device)
                from_cache = loader_rate(cached, workers, args.batches, args.P, args.K, device)
                rates[f"decode only, {workers} workers"].append(decoded)
                rates[f"loader, {workers} workers"].append(full)
                rates[f"cache, {workers} workers"].append(from_cache)
                ratios[workers].append(decoded / full)
                cache_ratios[workers].append(from_cache / full)
            rates[f"augment on {args.device}, {args.workers} workers"].append(
                loader_rate(on_device, args.workers, args.batches, args.P, args.K, device)
            )
            rates[f"{args.trunk} step"].append(
                step_rate(
                    args.trunk, (3, args.crop, args.crop), args.steps, args.P, args.K, args.device, args.precision
                )
            )
    print(
        f"{platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.1f}; "
        f"{args.images} JPEGs {args.side}x{args.height} -> {f'Resize {args.resize} + ' if args.resize else ''}"
        f"RandomResizedCrop {args.crop} + flip, batch "
        f"{args.P}x{args.K}, device {args.device}, {torch.get_num_threads()} torch thread(s), "
        f"median of {args.repeats}"
    )
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        workers = int(name.split(", ")[1].split()[0]) if "workers" in name else 0
        per = f"  ({value / workers:.1f} a worker)" if workers else ""
        print(f"  {name:<28} {value:8.1f} images/s{per}")
    for workers, values in ratios.items():
        print(f"  full pipeline / decode only, {workers} workers: {statistics.median(values):.2f}x the time")
    for workers, values in cache_ratios.items():
        print(f"  cache / full pipeline, {workers} workers: {statistics.median(values):.2f}x the images a second")
    print(f"  the cache: built in {build_s:.1f} s by {args.workers} workers, {cache_mb:.1f} MB")
    loader, step = medians[f"loader, {args.workers} workers"], medians[f"{args.trunk} step"]
    bound = "the loader" if loader < step else "the training step"
    print(f"bound by {bound}: the loader with {args.workers} workers gives {loader / step:.2f}x what the step takes")


if __name__ == "__main__":
    main()
