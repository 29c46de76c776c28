"""Image files to batches: a `Dataset` over `ImageFiles`, decoded in `DataLoader` worker processes.

Training batches come from the PK sampler used as a batch sampler
(`bench.data.samplers.PKBatchSampler`), whose items carry (step, slot, index):
each sample's augmentation is seeded from (run seed, step, slot), so the
same seed gives the same images with 0, 2 or 16 workers, and a run resumed
at step s sees the batches it would have seen. Embedding streams the files
through the same loader with the evaluation pipeline, a batch at a time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from bench.data.images import ImageFiles, sample_seed
from bench.errors import BenchError

MAX_DEFAULT_WORKERS = 8  # beyond this a small trunk's step, not decoding, bounds a run
EVAL_SEED = -1  # the evaluation pipeline is deterministic; its seed only makes that certain


class ImageDataset(Dataset):
    """Decodes one file per item: an int (evaluation) or (step, slot, index) from the PK batch sampler.

    Holds the `ImageFiles` (paths and options), never decoded images. The
    global RNG is forked around each decode, so workers=0 leaves the training
    process's RNG untouched.
    """

    def __init__(self, files: ImageFiles, train: bool, seed: int = 0) -> None:
        self.files, self.train, self.seed = files, bool(train), int(seed)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, int]:
        if isinstance(key, tuple):
            step, slot, index = key
        else:
            step, slot, index = EVAL_SEED, int(key), int(key)
        with torch.random.fork_rng(devices=[]):
            # the CPU generator alone, as torch.manual_seed seeds it (the same images): torch.manual_seed also
            # queues a seed for every CUDA device, recording a stack trace each time CUDA is not initialised,
            # a cost per sample that `benchmarks/bench_loader.py`'s pipeline shows
            torch.default_generator.manual_seed(sample_seed(self.seed, step, slot))
            return self.files.decode(index, self.train), index


def default_workers() -> int:
    """One worker per core this process may run on, at most `MAX_DEFAULT_WORKERS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


def loader_options(files: ImageFiles, device: torch.device) -> dict[str, Any]:
    """DataLoader arguments from ``data.loader``: workers (None: `default_workers`), pinned memory (None: on CUDA)."""
    workers = files.loader.get("workers")
    pin = files.loader.get("pin_memory")
    workers = default_workers() if workers is None else int(workers)
    options: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": device.type == "cuda" if pin is None else bool(pin),
    }
    if workers:
        options.update(worker_init_fn=one_thread, prefetch_factor=4)
    return options


def one_thread(_: int) -> None:
    """A worker decodes one image at a time: torch's intra-op threads would only fight the other workers."""
    torch.set_num_threads(1)


def stream(loader: DataLoader, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, indices) on `device`, copied without blocking; a worker's BenchError as its own one line."""
    non_blocking = device.type == "cuda"
    for xb, idx in _delivered(loader):
        yield xb.to(device, non_blocking=non_blocking), idx.to(device, non_blocking=non_blocking)


def _delivered(loader: DataLoader) -> Iterator[Any]:
    """The loader's batches as its workers deliver them; a worker's BenchError as its own one line."""
    iterator = iter(loader)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except BenchError as err:
            raise type(err)(worker_message(str(err))) from None
        yield batch


def worker_message(text: str) -> str:
    """The original message inside DataLoader's "Caught BenchError in DataLoader worker process 0 ... Traceback"."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) > 1:
        match = re.match(r"^[\w.]*Error: (.*)$", lines[-1])
        if match:
            return match.group(1)
    return text


def ensure_cache(files: ImageFiles, side: str, workers: int) -> None:
    """Build the side's decoded-image cache (``data.loader.cache``) here, before workers fork, unless it exists.

    Built once per dataset and head, by `workers` processes; a cache that
    cannot be built leaves the images decoded from their files.
    """
    cached = files.cache.get(side)
    if cached is not None:
        cached.ensure(workers)


def train_loader(files: ImageFiles, batch_sampler: Any, seed: int, device: torch.device) -> DataLoader:
    """Training batches: the train pipeline, batches as the batch sampler draws them."""
    ensure_cache(files, "train", loader_options(files, device)["num_workers"])
    return DataLoader(ImageDataset(files, True, seed), batch_sampler=batch_sampler, **loader_options(files, device))


class HeadDataset(ImageDataset):
    """Training items for augmentation on the device (``data.loader.augment_on: device``): a worker decodes
    the file through its pipeline's deterministic head (`ImageFiles.head`) and hands over the uint8 image
    with the sample's seed; `train_batches` runs the random rest on the training device."""

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, int, int, int]:  # type: ignore[override]
        step, slot, index = key
        image, start = self.files.head(index, True)
        return image, sample_seed(self.seed, step, slot), index, start


def _as_list(items: list[Any]) -> list[Any]:
    """The collate of `HeadDataset`: heads differ in size (a ``Resize`` keeps the aspect ratio), so no stack."""
    return items


def augments_on_device(files: ImageFiles) -> bool:
    """Whether ``data.loader.augment_on`` is ``device``."""
    return files.loader.get("augment_on") == "device"


def train_batches(
    files: ImageFiles, batch_sampler: Any, seed: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, indices) on `device` for the training steps the batch sampler draws.

    ``data.loader.augment_on: workers`` (the default): the workers run the
    whole pipeline (`train_loader`). ``device``: the workers run its
    deterministic head and the random rest runs here, image by image on
    `device`, each under its sample's seed, as a worker would have run it:
    on the CPU the same images bit for bit; on a GPU the same crops, flips
    and jitter (their random numbers are drawn on the CPU), resampled by
    the GPU's kernels (equal within rounding).
    """
    if not augments_on_device(files):
        yield from stream(train_loader(files, batch_sampler, seed, device), device)
        return
    ensure_cache(files, "train", loader_options(files, device)["num_workers"])
    loader = DataLoader(
        HeadDataset(files, True, seed),
        batch_sampler=batch_sampler,
        collate_fn=_as_list,
        **loader_options(files, device),
    )
    non_blocking = device.type == "cuda"
    for items in _delivered(loader):
        images = []
        for image, sample, index, start in items:
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(sample)
                images.append(files.tail(image.to(device, non_blocking=non_blocking), index, True, start))
        yield torch.stack(images), torch.tensor([item[2] for item in items], device=device)


def eval_loader(files: ImageFiles, batch_size: int, device: torch.device) -> DataLoader:
    """Every file once, in order, with the evaluation pipeline."""
    options = loader_options(files, device)
    ensure_cache(files, "eval", options["num_workers"])
    if options["num_workers"]:  # no more workers than batches
        options["num_workers"] = min(options["num_workers"], -(-len(files) // batch_size))
    return DataLoader(ImageDataset(files, False), batch_size=batch_size, shuffle=False, **options)


def decode_batch(files: ImageFiles, indices: torch.Tensor, step: int, seed: int) -> torch.Tensor:
    """One training batch decoded here, for miners that pick their own samples (no PK batch sampler)."""
    ensure_cache(files, "train", 0)
    dataset = ImageDataset(files, True, seed)
    return torch.stack([dataset[(step, slot, int(i))][0] for slot, i in enumerate(indices.tolist())])
