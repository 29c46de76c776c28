"""The decoded-image cache (``data.loader.cache``): the same images, bit for bit, decoded once and read back.

Everything is real: Pillow writes JPEGs of several shapes, the cache is
built by loader worker processes into ``$DMLBENCH_CACHE`` (a private folder
per test), and batches are drawn through the training loader with and
without it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench import data as datasets
from bench.cli import main
from bench.data.augment import head_length
from bench.data.loading import ImageDataset, eval_loader, train_loader
from bench.data.samplers import PKBatchSampler, PKSampler
from bench.errors import BenchError
from bench.evaluation import embed
from bench.protocol import parse_protocol

AUGMENT = {
    "train": [
        {"Resize": {"size": 20}},
        {"RandomResizedCrop": {"size": 12, "scale": [0.3, 1.0]}},
        "RandomHorizontalFlip",
        {"ColorJitter": {"brightness": 0.3}},
    ],
    "eval": [
        {"Resize": {"size": 20}},
        {"CenterCrop": {"size": 12}},
        {"Normalize": {"mean": [0.5] * 3, "std": [0.2] * 3}},
    ],
}


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("DMLBENCH_CACHE", str(folder))
    return folder


def photos(root: Path, classes: int = 4, per_class: int = 4, seed: int = 0) -> Path:
    """Class folders of JPEGs of several shapes (landscape, portrait, square) and one grey PNG."""
    rng = np.random.default_rng(seed)
    shapes = [(31, 23), (22, 34), (27, 27), (40, 18)]
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            w, h = shapes[(c + i) % len(shapes)]
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            Image.fromarray(pixels, "RGB").save(root / f"c{c}" / f"{i}.jpg", quality=90)
    Image.fromarray(rng.integers(0, 256, (25, 30), dtype=np.uint8), "L").save(root / "c0" / "grey.png")
    return root


def load(root: Path, cache: bool, workers: int = 0, augment: dict = AUGMENT, **loader: object) -> datasets.LabeledData:
    return datasets.load(
        f"folder:{root}", size=12, augment=augment, loader={"workers": workers, "cache": cache, **loader}
    )


def train_batches(data: datasets.LabeledData, seed: int = 3, steps: int = 4) -> list[torch.Tensor]:
    _, labels = torch.unique(data.y, return_inverse=True)
    sampler = PKBatchSampler(PKSampler(labels, 2, 2, seed=seed), 0, steps)
    return [xb.clone() for xb, _ in train_loader(data.x, sampler, seed, torch.device("cpu"))]


def cache_files(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "images").glob("*") if p.suffix in (".u8", ".npz"))


def test_the_head_is_the_leading_steps_that_draw_no_random_number() -> None:
    assert head_length(AUGMENT["train"]) == 1
    assert head_length(AUGMENT["eval"]) == 2
    assert head_length([{"RandomResizedCrop": {"size": 8}}, {"Resize": {"size": 8}}]) == 0
    assert head_length([{"Pad": {"padding": 2}}, {"Grayscale": {}}, {"Normalize": {}}]) == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_cached_training_batches_equal_decoded_ones_bit_for_bit(tmp_path: Path, own_cache: Path, workers: int) -> None:
    root = photos(tmp_path / "pool")
    plain = train_batches(load(root, cache=False, workers=workers))
    assert cache_files(own_cache) == []
    cached_data = load(root, cache=True, workers=workers)
    cached = train_batches(cached_data)
    assert len(cache_files(own_cache)) == 2  # one cache, built by the loader's workers
    assert all(torch.equal(a, b) for a, b in zip(plain, cached, strict=True))
    assert cached_data.x.cache["train"].ready()  # this process read from it (workers=0) or can
    # a second run reads what the first built
    again = train_batches(load(root, cache=True, workers=workers))
    assert all(torch.equal(a, b) for a, b in zip(plain, again, strict=True))


def test_cached_embeddings_and_a_subset_equal_decoded_ones(tmp_path: Path, own_cache: Path) -> None:
    root = photos(tmp_path / "pool")
    augment = {**AUGMENT, "eval": [{"Resize": {"size": 16}}, {"CenterCrop": {"size": 12}}]}
    plain, cached = load(root, cache=False, augment=augment), load(root, cache=True, augment=augment)
    assert cached.x.cache["train"] is not cached.x.cache["eval"]  # the heads differ: two caches
    keep = torch.arange(len(plain.y)) % 3 != 0
    a, b = ([xb for xb, _ in eval_loader(data.x[keep], 4, torch.device("cpu"))] for data in (plain, cached))
    assert torch.equal(torch.cat(a), torch.cat(b))
    assert len(cache_files(own_cache)) == 2  # the eval head's cache only: the train side was never loaded
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 12 * 12, 4))
    a = embed(model, plain.x, batch_size=5)
    b = embed(model, cached.x, batch_size=5)
    assert torch.equal(a, b)


def test_a_head_that_starts_the_other_sides_head_is_one_shared_cache(tmp_path: Path, own_cache: Path) -> None:
    root = photos(tmp_path / "pool")
    plain, data = load(root, cache=False), load(root, cache=True)  # Resize, and Resize + CenterCrop
    assert data.x.cache["train"] is data.x.cache["eval"] and len(data.x.cache["eval"].head) == 1
    train_batches(data)
    evaluated = [torch.cat([xb for xb, _ in eval_loader(d.x, 8, torch.device("cpu"))]) for d in (plain, data)]
    assert torch.equal(*evaluated)
    assert len(cache_files(own_cache)) == 2


def test_a_pipeline_without_a_head_caches_whole_decoded_images(tmp_path: Path, own_cache: Path) -> None:
    root = photos(tmp_path / "pool")
    augment = {
        "train": [{"RandomResizedCrop": {"size": 12}}, "RandomHorizontalFlip"],
        "eval": [{"Resize": {"size": [12, 12]}}],
    }
    plain, cached = load(root, cache=False, augment=augment), load(root, cache=True, augment=augment)
    a, b = train_batches(plain), train_batches(cached)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    u8 = next((own_cache / "images").glob("*.u8"))
    pixels = sum(int(np.prod(Image.open(p).size)) for p in root.rglob("*.*"))
    assert u8.stat().st_size == 3 * pixels  # every file, whole, as uint8 RGB (the grey one made RGB, as decoded)


def test_a_changed_file_builds_another_cache_with_its_new_pixels(tmp_path: Path, own_cache: Path) -> None:
    root = photos(tmp_path / "pool")
    train_batches(load(root, cache=True))
    first = cache_files(own_cache)
    target = root / "c1" / "2.jpg"
    Image.fromarray(np.full((23, 31, 3), 200, dtype=np.uint8), "RGB").save(target, quality=90)
    os.utime(target, ns=(1, 1))
    changed = load(root, cache=True)
    assert torch.equal(torch.cat(train_batches(changed)), torch.cat(train_batches(load(root, cache=False))))
    assert len(cache_files(own_cache)) == 4 and set(first) < set(cache_files(own_cache))


def test_a_damaged_cache_is_rebuilt_not_read(tmp_path: Path, own_cache: Path) -> None:
    root = photos(tmp_path / "pool")
    plain = train_batches(load(root, cache=False))
    train_batches(load(root, cache=True))
    u8 = next((own_cache / "images").glob("*.u8"))
    u8.write_bytes(u8.read_bytes()[:-10])  # a truncated file (a disk filled mid-copy)
    again = train_batches(load(root, cache=True))
    assert all(torch.equal(a, b) for a, b in zip(plain, again, strict=True))
    assert u8.stat().st_size > 0 and (own_cache / "images" / (u8.stem + ".npz")).is_file()
    assert len(np.fromfile(u8, dtype=np.uint8)) == int(np.load(u8.with_suffix(".npz"))["size"][0])


def test_over_the_cap_the_images_come_from_their_files_with_one_warning(
    tmp_path: Path, own_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = photos(tmp_path / "pool")
    plain = train_batches(load(root, cache=False))
    with caplog.at_level(logging.WARNING, logger="dmlbench.data"):
        small = train_batches(load(root, cache=True, cache_max_gb=1e-6))  # 1,000 bytes
    assert all(torch.equal(a, b) for a, b in zip(plain, small, strict=True))
    warnings = [r.getMessage() for r in caplog.records if "cache_max_gb" in r.getMessage()]
    assert len(warnings) == 1 and "decoded from their files" in warnings[0]
    assert cache_files(own_cache) == [] and list((own_cache / "images").glob("*.tmp")) == []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dmlbench.data"):
        train_batches(load(root, cache=True, cache_max_gb=1e-6))  # the marker: no second try, no second warning
    assert not [r for r in caplog.records if "cache_max_gb" in r.getMessage()]
    train_batches(load(root, cache=True, cache_max_gb=1.0))  # a larger cap builds it
    assert len(cache_files(own_cache)) == 2


def _build(root: str, cache: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    os.environ["DMLBENCH_CACHE"] = cache
    data = load(Path(root), cache=True)
    handle = data.x.cache["train"]
    queue.put(handle.ensure(0))


def test_two_processes_starting_together_build_one_cache(tmp_path: Path, own_cache: Path) -> None:
    root = photos(tmp_path / "pool", per_class=12)
    queue: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()  # type: ignore[type-arg]
    procs = [
        multiprocessing.get_context("fork").Process(target=_build, args=(str(root), str(own_cache), queue))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [queue.get(timeout=5) for _ in procs] == [True, True]
    assert len(cache_files(own_cache)) == 2 and list((own_cache / "images").glob("*.tmp")) == []
    plain = train_batches(load(root, cache=False))
    assert all(torch.equal(a, b) for a, b in zip(plain, train_batches(load(root, cache=True)), strict=True))


def test_the_cache_without_a_pipeline_is_one_line(tmp_path: Path) -> None:
    root = photos(tmp_path / "pool")
    with pytest.raises(BenchError, match=r"^data.loader.cache: .*no data.augment pipeline"):
        datasets.load(f"folder:{root}", size=12, loader={"cache": True})
    datasets.load(f"folder:{root}", size=12, loader={"cache": False})  # off: nothing to refuse


def test_a_sample_from_the_cache_equals_its_decoded_self_for_any_seed(tmp_path: Path) -> None:
    root = photos(tmp_path / "pool")
    plain, cached = load(root, cache=False), load(root, cache=True)
    cached.x.cache["train"].ensure(0)
    a, b = ImageDataset(plain.x, True, seed=11), ImageDataset(cached.x, True, seed=11)
    for key in [(0, 0, 0), (5, 3, 16), (9, 1, 7)]:
        assert torch.equal(a[key][0], b[key][0])


def test_the_images_are_read_from_the_cache_once_built(tmp_path: Path, own_cache: Path) -> None:
    root = photos(tmp_path / "pool")
    plain = torch.cat(train_batches(load(root, cache=False)))
    assert torch.equal(torch.cat(train_batches(load(root, cache=True))), plain)
    u8 = next((own_cache / "images").glob("*.u8"))
    u8.write_bytes(bytes(255 - b for b in u8.read_bytes()))  # same size, every pixel inverted
    assert not torch.equal(torch.cat(train_batches(load(root, cache=True))), plain)


PROTOCOL = """
name: cached
seed: 0
data:
  pool: folder:{pool}
  split: {{test_classes: 2, seed: 0}}
  image_size: 12
  augment:
    train: [{{Resize: {{size: 20}}}}, {{RandomResizedCrop: {{size: 12, scale: [0.5, 1.0]}}}}, RandomHorizontalFlip]
    eval: [{{Resize: {{size: 20}}}}, {{CenterCrop: {{size: 12}}}}]
  loader: {{workers: 1, {loader}}}
  validation: {{folds: 2, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [16]}}, embedding_dim: 8, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 3}}
evaluation: {{metrics: [precision_at_1, map_at_r], primary: map_at_r}}
tuning: {{trials: 1, startup_trials: 1}}
final: {{seeds: 1}}
grid:
  losses: [{{name: contrastive}}]
"""


def test_a_sweep_with_the_cache_or_augmenting_on_the_device_records_what_one_without_records(
    tmp_path: Path, own_cache: Path
) -> None:
    pool = photos(tmp_path / "pool", classes=6)
    finals = {}
    loaders = {"plain": "cache: false", "cache": "cache: true", "device": "cache: false, augment_on: device"}
    for name, loader in loaders.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(PROTOCOL.format(pool=pool, loader=loader))
        out = tmp_path / name
        args = ["run", str(path), "--results-dir", str(out), "--storage", f"sqlite:///{out}.db"]
        assert main([*args, "--tracking-uri", str(out / "mlflow.db"), "--threads", "1", "--quiet"]) == 0
        finals[name] = (out / "cached" / "finals.csv").read_text()
    hashes = {parse_protocol((tmp_path / f"{name}.yaml").read_text()).hash for name in loaders}
    assert len(hashes) == 1  # loader settings: not in the hash
    assert len(cache_files(own_cache)) == 2  # one cache for both sides (Resize starts both heads)

    def scores(text: str) -> list[str]:  # the score columns; run ids and times differ between runs
        rows = [line.split(",") for line in text.strip().splitlines()]
        keep = [i for i, name in enumerate(rows[0]) if name.startswith(("map_at_r", "precision_at_1"))]
        assert keep
        return [",".join(row[i] for i in keep) for row in rows]

    assert scores(finals["cache"]) == scores(finals["plain"]) == scores(finals["device"])


@pytest.mark.parametrize(("workers", "cache"), [(0, False), (2, False), (0, True), (2, True)])
def test_augmenting_on_the_device_gives_the_workers_images_bit_for_bit(
    tmp_path: Path, own_cache: Path, workers: int, cache: bool
) -> None:
    """``data.loader.augment_on: device``: workers send the deterministic head's uint8 image (decoded, or from
    the cache) and the random rest runs on the training device under each sample's seed; on the CPU that is
    the image a worker makes, bit for bit, at every step, for any seed."""
    from bench.data.loading import augments_on_device
    from bench.data.loading import train_batches as batches_of

    root = photos(tmp_path / "pool")
    for seed in (3, 11):
        plain = train_batches(load(root, cache=False, workers=workers), seed=seed)
        data = load(root, cache=cache, workers=workers, augment_on="device")
        assert augments_on_device(data.x)
        _, labels = torch.unique(data.y, return_inverse=True)
        sampler = PKBatchSampler(PKSampler(labels, 2, 2, seed=seed), 0, 4)
        got = [(xb.clone(), idx) for xb, idx in batches_of(data.x, sampler, seed, torch.device("cpu"))]
        assert len(got) == len(plain) == 4
        assert all(torch.equal(a, b) for a, (b, _) in zip(plain, got, strict=True))
        assert all(xb.dtype == torch.float32 and xb.shape == (4, 3, 12, 12) for xb, _ in got)
        assert not torch.equal(got[0][0], got[1][0])  # the steps differ: the seeds reach the device's steps


def test_augmenting_on_the_device_without_a_training_pipeline_is_one_line(tmp_path: Path) -> None:
    root = photos(tmp_path / "pool")
    with pytest.raises(BenchError, match=r"augment_on: device runs data.augment.train's random steps .* no data"):
        datasets.load(f"folder:{root}", size=12, augment={"eval": AUGMENT["eval"]}, loader={"augment_on": "device"})
    with pytest.raises(BenchError, match="augment_on"):
        parse_protocol(PROTOCOL.format(pool=root, loader="augment_on: gpu"))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupt_file_met_while_building_is_one_line_naming_it(tmp_path: Path, own_cache: Path, workers: int) -> None:
    root = photos(tmp_path / "pool")
    (root / "c2" / "1.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(BenchError) as err:
        train_batches(load(root, cache=True, workers=workers))
    assert str(err.value) == f"corrupt or unreadable image {root / 'c2' / '1.jpg'} (UnidentifiedImageError)"
    assert cache_files(own_cache) == [] and list((own_cache / "images").glob("*.tmp")) == []
