"""Image files read lazily: decoded in loader workers, augmented as the protocol names it, seeded.

Everything is real: Pillow writes small JPEGs here, the loader's worker
processes decode them, torchvision's transforms.v2 augment them, and a
protocol on them runs through `dmlbench run` to a leaderboard.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench import data as datasets
from bench.cli import main
from bench.data.files import FileIndex, labeled_from_index
from bench.data.images import ImageFiles
from bench.data.loading import ImageDataset
from bench.errors import BenchError
from bench.evaluation import embed
from bench.protocol import parse_protocol
from bench.training import TrainConfig, _batches, train

AUGMENT = {
    "train": [
        {"RandomResizedCrop": {"size": 12, "scale": [0.3, 1.0]}},
        "RandomHorizontalFlip",
        {"ColorJitter": {"brightness": 0.3}},
    ],
    "eval": [{"Resize": {"size": 14}}, {"CenterCrop": {"size": 12}}],
}

PROTOCOL = """
name: jpegs
seed: 0
data:
  pool: folder:{pool}
  split: {{test_classes: 3, seed: 0}}
  image_size: 12
  augment:
    train: [{{RandomResizedCrop: {{size: 12, scale: [0.5, 1.0]}}}}, RandomHorizontalFlip]
    eval: [{{Resize: {{size: [12, 12]}}}}]
  loader: {{workers: {workers}}}
  validation: {{folds: 2, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [16]}}, embedding_dim: 8, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 3}}
evaluation: {{metrics: [precision_at_1, map_at_r], primary: map_at_r}}
tuning: {{trials: 1, startup_trials: 1}}
final: {{seeds: 1}}
grid:
  losses: [{{name: contrastive}}]
"""


def jpeg_folder(
    root: Path, classes: int = 6, per_class: int = 5, size: tuple[int, int] = (16, 20), seed: int = 0
) -> Path:
    """Class sub-folders of small colour JPEGs, each class its own hue (so there is something to learn)."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            base = np.array([40 * c % 256, 255 - 30 * c % 256, 128], dtype=np.int64)
            pixels = np.clip(base + rng.integers(-40, 40, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, "RGB").save(root / f"c{c}" / f"{i}.jpg", quality=90)
    return root


def protocol_with_augment(tmp_path: Path, pool: Path, augment: dict) -> Path:
    """PROTOCOL on ``pool`` with ``augment`` for its pipelines, written to tmp_path/p.yaml."""
    text = PROTOCOL.format(pool=pool, workers=0).replace(
        "  augment:\n    train: [{RandomResizedCrop: {size: 12, scale: [0.5, 1.0]}}, RandomHorizontalFlip]\n"
        "    eval: [{Resize: {size: [12, 12]}}]\n",
        f"  augment: {json.dumps(augment)}\n",
    )
    assert "augment: {" in text
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def folder_data(root: Path, workers: int, augment: dict | None = AUGMENT) -> datasets.LabeledData:
    return datasets.load(f"folder:{root}", size=12, augment=augment, loader={"workers": workers})


def batches(data: datasets.LabeledData, seed: int, steps: int, start: int = 0) -> list[tuple[torch.Tensor, ...]]:
    config = TrainConfig(P=3, K=2, iterations=steps, seed=seed)
    _, labels = torch.unique(data.y, return_inverse=True)
    return [(xb.clone(), idx.clone()) for xb, idx in _batches(data.x, labels, config, torch.device("cpu"), start)]


# --------------------------------------------------------------------------- lazy, seeded, worker-independent


def test_a_folder_is_read_lazily_and_decodes_as_the_in_memory_loader_did(tmp_path: Path) -> None:
    root = jpeg_folder(tmp_path / "f", classes=2, per_class=2)
    data = datasets.load(f"folder:{root}", size=6)
    assert isinstance(data.x, ImageFiles) and data.x.shape == (4, 3, 6, 6)
    # the old path: Pillow's floats, area-resampled in one go (bench.data.resize.resize_area)
    from bench.data.resize import resize_area

    pixels = np.asarray(Image.open(root / "c1" / "0.jpg").convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255
    assert torch.equal(data.x[2], torch.from_numpy(resize_area(pixels[None], 6)[0]))
    sub = data.subset([1])
    assert isinstance(sub.x, ImageFiles) and list(sub.x.paths) == ["c1/0.jpg", "c1/1.jpg"]


def test_same_seed_gives_the_same_batches_and_augmented_images_with_0_and_2_workers(tmp_path: Path) -> None:
    root = jpeg_folder(tmp_path / "f")
    zero = batches(folder_data(root, 0), seed=5, steps=4)
    two = batches(folder_data(root, 2), seed=5, steps=4)
    assert len(zero) == len(two) == 4
    for (xa, ia), (xb, ib) in zip(zero, two):
        assert torch.equal(ia, ib) and torch.equal(xa, xb)
        assert xa.shape == (6, 3, 12, 12) and xa.dtype == torch.float32
    other = batches(folder_data(root, 0), seed=6, steps=4)
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(zero, other))
    # the same index twice in a batch (or in two batches) is augmented afresh: crops differ
    plain = folder_data(root, 0, augment=None)
    assert not torch.equal(zero[0][0][0], plain.x[int(zero[0][1][0])])
    # resumed at step 2: the batches a run from step 0 saw there
    resumed = batches(folder_data(root, 2), seed=5, steps=2, start=2)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(zero[2:], resumed))


def test_training_and_embedding_do_not_depend_on_the_number_of_workers(tmp_path: Path) -> None:
    root = jpeg_folder(tmp_path / "f")
    config = dict(trunk="mlp", trunk_params={"hidden": [16]}, embedding_dim=8, P=3, K=2, iterations=4, seed=2)
    runs = [train(TrainConfig(**config), folder_data(root, w)) for w in (0, 2)]
    assert runs[0].final_loss == runs[1].final_loss
    embeddings = [embed(r.model, folder_data(root, w).x, batch_size=7) for r, w in zip(runs, (0, 2))]
    assert embeddings[0].shape == (30, 8) and torch.equal(embeddings[0], embeddings[1])


def test_a_dataset_level_miner_embeds_and_decodes_the_files_it_picks(tmp_path: Path) -> None:
    """The offline miner picks its own samples (no PK batch sampler): it embeds the files through the loader
    and its batches are decoded with the training pipeline, seeded as PK batches are."""
    root = jpeg_folder(tmp_path / "f")
    config = dict(
        trunk="mlp",
        trunk_params={"hidden": [16]},
        embedding_dim=8,
        P=3,
        K=2,
        iterations=3,
        seed=4,
        miner="offline",
        miner_params={"refresh_every": 2, "triplets_per_batch": 4},
    )
    losses = [train(TrainConfig(**config), folder_data(root, w)).final_loss for w in (0, 2)]
    assert losses[0] == losses[1] and np.isfinite(losses[0])


def test_the_dataset_holds_paths_not_decoded_images(tmp_path: Path) -> None:
    root = jpeg_folder(tmp_path / "f", classes=4, per_class=25)
    data = folder_data(root, 0)
    dataset = ImageDataset(data.x, train=True, seed=0)
    for i in range(len(dataset)):
        dataset[(0, i, i)]
    held = pickle.dumps(dataset)  # what a worker process receives, after every image was decoded once
    assert len(held) < 100 * len(data)  # ~ the paths; one decoded 12x12 RGB image alone is 1,728 bytes
    assert data.x.paths.dtype.kind == "U"
    assert not any(
        isinstance(v, (torch.Tensor, np.ndarray)) and v.dtype != data.x.paths.dtype for v in vars(data.x).values()
    )


def test_an_index_gives_lazy_labeled_data_with_per_sample_facts(tmp_path: Path) -> None:
    root = jpeg_folder(tmp_path / "f", classes=3, per_class=2)
    index = FileIndex(
        root,
        ("c0/0.jpg", "c0/1.jpg", "c1/0.jpg", "c1/1.jpg", "c2/0.jpg", "c2/1.jpg"),
        (7, 7, 9, 9, 11, 11),
        "fixture",
        per_sample={"camera": (1, 2, 1, 3, 2, 2)},
        class_names={7: "a", 9: "b", 11: "c"},
    )
    data = labeled_from_index(index, size=8)
    assert data.x.shape == (6, 3, 8, 8) and data.classes == (7, 9, 11)
    sub = data.subset([9, 11])
    assert sub.per_sample["camera"].tolist() == [1, 3, 2, 2] and sub.y.tolist() == [9, 9, 11, 11]
    assert sub.meta["class_names"][9] == "b" and sub.x.to_tensor().shape == (4, 3, 8, 8)
    grey = labeled_from_index(index, size=8, channels=1)
    assert grey.x[0].shape == (1, 8, 8)


# --------------------------------------------------------------------------- errors, one line each


def test_a_missing_image_file_is_one_line_naming_it_in_workers_too(tmp_path: Path) -> None:
    root = jpeg_folder(tmp_path / "f", classes=3, per_class=2)
    for workers in (0, 2):
        data = folder_data(root, workers)
        gone = root / "c1" / "0.jpg"
        gone.rename(tmp_path / "away.jpg")
        try:
            with pytest.raises(BenchError) as err:
                train(TrainConfig(trunk="mlp", embedding_dim=4, P=3, K=2, iterations=3), data)
            assert str(err.value) == f"missing image file {gone}"
        finally:
            (tmp_path / "away.jpg").rename(gone)


def test_a_pipeline_that_ends_at_another_size_is_named(tmp_path: Path) -> None:
    root = jpeg_folder(tmp_path / "f", classes=3, per_class=2)
    data = folder_data(root, 0, augment={"eval": [{"Resize": {"size": [10, 10]}}]})
    with pytest.raises(BenchError, match=r"data.augment.eval gives 3x10x10 .* the protocol wants 3x12x12"):
        data.x[0]


@pytest.mark.parametrize(
    ("augment", "message"),
    [
        ({"eval": [{"Normalize": {"mean": [0.5], "std": [0.2, 0.2]}}]}, r"data.augment.eval failed on .*\.jpg: "),
        ({"eval": [{"Resize": {"size": [10, 10]}}]}, r"data.augment.eval gives 3x10x10"),
        ({"train": [{"RandomCrop": {"size": 40}}]}, r"data.augment.train failed on .*\.jpg: ValueError: "),
        ({"eval": [{"Resize": {"size": [12, 12]}}, "Grayscale"]}, r"data.augment.eval gives 1x12x12 .* wants 3x12x12"),
    ],
)
def test_a_pipeline_refused_on_an_image_is_found_by_validate_before_a_run(
    tmp_path: Path, augment: dict, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Values torchvision accepts when it builds a transform but refuses on an image, and pipelines ending at
    another shape: one line from `validate`, and `run` refuses before recording anything."""
    root = jpeg_folder(tmp_path / "f", classes=6, per_class=3)
    side = next(iter(augment))
    other = {
        "train": {"eval": [{"Resize": {"size": [12, 12]}}]},
        "eval": {"train": [{"RandomResizedCrop": {"size": 12}}]},
    }[side]
    path = protocol_with_augment(tmp_path, root, {**augment, **other})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert re.search(message, err), err
    store = tmp_path / "store"
    assert (
        main(
            [
                "run",
                str(path),
                "--storage",
                f"sqlite:///{store / 'o.db'}",
                "--tracking-uri",
                str(store / "mlflow.db"),
                "--results-dir",
                str(store / "r"),
                "--quiet",
            ]
        )
        == 2
    )
    assert not (store / "o.db").exists() and not (store / "mlflow.db").exists()


def test_16_bit_and_float_images_are_scaled_not_clipped_by_a_pipeline(tmp_path: Path) -> None:
    """Pillow's convert() clips 16-bit grey to white and floats in [0, 1] to black: a pipeline must see the
    same image as the decoder without one (to 8-bit precision)."""
    root = tmp_path / "f"
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 65536, (12, 12)).astype(np.uint16)).save(root / f"c{c}" / f"{i}.png")
            Image.fromarray(rng.random((12, 12)).astype(np.float32), mode="F").save(root / f"c{c}" / f"{i}.tif")
    plain = datasets.load(f"folder:{root}", size=12, channels=1)
    piped = datasets.load(f"folder:{root}", size=12, channels=1, augment={"eval": [{"CenterCrop": {"size": 12}}]})
    assert len(plain) == 8
    for i in range(len(plain)):
        a, b = plain.x[i], piped.x[i]
        assert 0.3 < float(a.mean()) < 0.7
        assert float((a - b).abs().max()) <= 0.5 / 255 + 1e-6


@pytest.mark.parametrize(
    ("augment", "message"),
    [
        ({"train": ["RandomFlop"]}, r"data.augment.train\[0\]: unknown transform 'RandomFlop'"),
        (
            {"train": [{"RandomResizedCrop": {"sizee": 12}}]},
            r"data.augment.train\[0\]: RandomResizedCrop has no parameter 'sizee'",
        ),
        ({"eval": ["Resize", {"CenterCrop": {"size": -3}}]}, r"data.augment.eval\[0\]: Resize\(\) refused"),
        (
            {"train": ["RandomHorizontalFlip", {"ColorJitter": {"brightness": -1}}]},
            r"data.augment.train\[1\]: ColorJitter\(brightness=-1\) refused",
        ),
    ],
)
def test_a_bad_transform_is_one_line_at_validate_time(
    tmp_path: Path, augment: dict, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.data.augment import check

    with pytest.raises(BenchError, match=message) as err:
        check(augment)
    assert "\n" not in str(err.value)
    root = jpeg_folder(tmp_path / "f", classes=2, per_class=2)
    path = protocol_with_augment(tmp_path, root, augment)
    assert main(["validate", str(path)]) == 2
    assert "data.augment" in capsys.readouterr().err


def test_augment_on_data_held_in_memory_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((8, 6, 6), np.uint8), y=np.repeat(np.arange(2), 4))
    with pytest.raises(BenchError, match="held in memory.*data.augmentation"):
        datasets.load(f"npz:{tmp_path / 'd.npz'}", size=6, augment={"train": ["RandomHorizontalFlip"]})


# --------------------------------------------------------------------------- protocol and end to end


def test_augment_is_in_the_hash_and_loader_settings_are_not(tmp_path: Path) -> None:
    text = PROTOCOL.format(pool=tmp_path, workers=0)
    base = parse_protocol(text)
    assert base.doc["data"]["augment"]["train"][1] == {"RandomHorizontalFlip": {}}  # bare names written out
    assert parse_protocol(text.replace("RandomHorizontalFlip]", "{RandomHorizontalFlip: {}}]")).hash == base.hash
    assert parse_protocol(text.replace("workers: 0", "workers: 4")).hash == base.hash
    assert parse_protocol(text.replace("  loader: {workers: 0}\n", "")).hash == base.hash
    assert parse_protocol(text.replace("scale: [0.5, 1.0]", "scale: [0.2, 1.0]")).hash != base.hash


def test_a_jpeg_folder_protocol_runs_through_dmlbench_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = jpeg_folder(tmp_path / "pool", classes=7, per_class=4)
    path = tmp_path / "p.yaml"
    path.write_text(PROTOCOL.format(pool=pool, workers=1))
    assert main(["plan", str(path)]) == 0
    assert "train pipeline RandomResizedCrop > RandomHorizontalFlip, eval pipeline Resize" in capsys.readouterr().out
    results = tmp_path / "results"
    assert (
        main(
            [
                "run",
                str(path),
                "--results-dir",
                str(results),
                "--storage",
                f"sqlite:///{tmp_path}/o.db",
                "--tracking-uri",
                str(tmp_path / "mlflow.db"),
                "--threads",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["leaderboard", str(results / "jpegs")]) == 0
    assert "contrastive+none" in (results / "jpegs" / "leaderboard.md").read_text()
    manifest = json.loads((results / "jpegs" / "manifest.json").read_text())
    assert "RandomResizedCrop" in manifest["protocol_text"]  # the pipeline is recorded with the sweep
    assert manifest["protocol_hash"] == parse_protocol(path.read_text()).hash


def test_dmlbench_train_records_its_augment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = jpeg_folder(tmp_path / "pool", classes=4, per_class=3)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert (
        main(
            [
                "train",
                "--data",
                f"folder:{pool}",
                "--split",
                "2",
                "--trunk",
                "mlp",
                "--embedding-dim",
                "4",
                "--size",
                "8",
                "--P",
                "2",
                "--K",
                "2",
                "--iterations",
                "2",
                "--threads",
                "1",
                "--workers",
                "0",
                "--augment",
                "{train: [RandomHorizontalFlip, {RandomCrop: {size: 8, padding: 1}}]}",
                "--tracking-uri",
                uri,
                "--format",
                "json",
                "--quiet",
            ]
        )
        == 0
    )
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    import mlflow

    params = mlflow.tracking.MlflowClient(uri).get_run(run_id).data.params
    assert json.loads(params["augment"]) == {
        "train": [{"RandomHorizontalFlip": {}}, {"RandomCrop": {"size": 8, "padding": 1}}]
    }
    assert (
        main(
            [
                "train",
                "--data",
                f"folder:{pool}",
                "--split",
                "2",
                "--augment",
                "{train: [Blur]}",
                "--tracking-uri",
                uri,
                "--quiet",
            ]
        )
        == 2
    )
    assert "unknown transform 'Blur'" in capsys.readouterr().err


def test_a_sample_is_augmented_as_torch_manual_seed_of_its_seed_would_and_leaves_the_rng_alone(tmp_path: Path) -> None:
    """The loader seeds the CPU generator alone (torch.manual_seed's stack-recording CUDA call was a quarter of a
    sample's time): the same images as seeding through torch.manual_seed, the global RNG untouched."""
    from bench.data.images import sample_seed
    from bench.data.loading import ImageDataset

    data = folder_data(jpeg_folder(tmp_path / "f"), 0)
    dataset = ImageDataset(data.x, True, seed=7)
    before = torch.get_rng_state()
    got = [dataset[(step, slot, index)][0] for step, slot, index in ((0, 0, 3), (0, 1, 3), (5, 2, 11))]
    assert torch.equal(torch.get_rng_state(), before)
    for (step, slot, index), image in zip(((0, 0, 3), (0, 1, 3), (5, 2, 11)), got):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(7, step, slot))
            assert torch.equal(image, data.x.decode(index, train=True))
    assert not torch.equal(got[0], got[1])  # two slots, two crops of one image
