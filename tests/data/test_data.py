"""Data loading on the real files: Omniglot, Lake's runs, Fashion-MNIST, and a user's folder or npz."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench.data import LabeledData, load, load_lake_runs, resolve_root
from bench.data.cache import cache_path, read_cache
from bench.data.omniglot import PREPROCESS_VERSION, paper_to_ink
from bench.data.resize import resize_area
from bench.errors import BenchError

# --------------------------------------------------------------------------- Omniglot


@pytest.fixture(scope="module")
def background(data_root: Path) -> LabeledData:
    return load("omniglot:background", root=data_root)


@pytest.fixture(scope="module")
def evaluation(data_root: Path) -> LabeledData:
    return load("omniglot:evaluation", root=data_root)


def test_background_shapes_labels_and_ink(background: LabeledData) -> None:
    assert background.x.shape == (964 * 20, 1, 28, 28)
    assert background.x.dtype == torch.float32 and background.y.dtype == torch.int64
    assert background.classes == tuple(range(964))
    assert torch.equal(torch.bincount(background.y), torch.full((964,), 20))
    assert 0.0 <= float(background.x.min()) and float(background.x.max()) <= 1.0
    # ink is 1.0: strokes cover well under half of a character's page, and the border is empty
    assert 0.02 < float(background.x.mean()) < 0.3
    assert float(background.x[:, :, 0, :].mean()) < float(background.x.mean())


def test_evaluation_ids_follow_background_and_meta_names_alphabets(evaluation: LabeledData) -> None:
    assert evaluation.x.shape == (659 * 20, 1, 28, 28)
    assert evaluation.classes == tuple(range(964, 1623))
    assert torch.equal(torch.bincount(evaluation.y - 964), torch.full((659,), 20))
    alphabet, names = evaluation.meta["alphabet"], evaluation.meta["class_names"]
    assert set(alphabet) == set(names) == set(evaluation.classes)
    assert len(set(alphabet.values())) == 20
    # the publisher's ids (file XXXX_YY.png is class XXXX - 1), not the sorted order of the folders:
    # Syriac_(Serto) (1480..1502) comes before Sylheti (1503..1530)
    assert (names[964], names[1479], names[1502], names[1622]) == (
        "Angelic/character01",
        "Syriac_(Serto)/character01",
        "Sylheti/character01",
        "ULOG/character26",
    )
    assert all(names[c].startswith(alphabet[c] + "/character") for c in evaluation.classes)


def test_background_ids_are_the_publishers_not_the_folder_order(background: LabeledData) -> None:
    names = background.meta["class_names"]
    assert (names[0], names[708], names[963]) == (
        "Arcadian/character01",
        "Alphabet_of_the_Magi/character01",
        "Tifinagh/character55",
    )
    assert len(set(background.meta["alphabet"].values())) == 30


def test_first_pixels_match_the_published_png(data_root: Path) -> None:
    """At 105x105 no resize happens: the tensor is exactly 1 - paper of the publisher's PNG."""
    import io
    import zipfile

    with zipfile.ZipFile(data_root / "omniglot" / "images_evaluation.zip") as z:
        paper = np.asarray(Image.open(io.BytesIO(z.read("images_evaluation/Angelic/character01/0965_02.png"))))
    assert paper.shape == (105, 105) and paper.dtype == np.bool_
    evaluation = load("omniglot:evaluation", root=data_root, size=105)
    assert torch.equal(evaluation.x[1, 0], torch.from_numpy(1.0 - paper.astype(np.float32)))
    assert int(evaluation.y[1]) == 964
    images = resize_area(paper[None, None], 105, convert=paper_to_ink)
    assert np.array_equal(images[0, 0], 1.0 - paper.astype(np.float32))


def test_cache_hit_is_equal_and_corrupt_cache_is_rebuilt(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DMLBENCH_CACHE", str(tmp_path))
    first = load("omniglot:evaluation", root=data_root)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"  # atomic write left no temp file behind
    cached = files[0]
    written = cached.stat()
    second = load("omniglot:evaluation", root=data_root)
    assert torch.equal(first.x, second.x) and torch.equal(first.y, second.y)
    # a hit reads the file and leaves it alone: a rebuild would have replaced it (new inode)
    again = cached.stat()
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)

    # one flipped byte inside the pixel data: the checksum notices, the loader rebuilds
    raw = bytearray(cached.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    cached.write_bytes(bytes(raw))
    assert read_cache(cached) is None
    rebuilt = load("omniglot:evaluation", root=data_root)
    assert torch.equal(rebuilt.x, first.x)
    assert read_cache(cached) is not None

    # a truncated file (a process killed mid-write without the atomic rename)
    cached.write_bytes(cached.read_bytes()[:1000])
    assert torch.equal(load("omniglot:evaluation", root=data_root).x, first.x)
    assert read_cache(cached) is not None


def test_cache_key_depends_on_size_and_source() -> None:
    base = {"source": "a" * 64, "size": 28, "version": PREPROCESS_VERSION}
    assert cache_path("omniglot", base) != cache_path("omniglot", {**base, "size": 32})
    assert cache_path("omniglot", base) != cache_path("omniglot", {**base, "source": "b" * 64})
    assert cache_path("omniglot", base) == cache_path("omniglot", dict(reversed(base.items())))


def test_a_zip_that_is_not_omniglot_fails_clearly(tmp_path: Path) -> None:
    fake = tmp_path / "omniglot"
    fake.mkdir()
    with open(fake / "images_evaluation.zip", "wb") as f:  # a zip, but of arrays
        np.savez(f, images=np.ones((2, 20, 105, 105), bool))
    with pytest.raises(
        BenchError,
        match=r"images_evaluation\.zip: no images inside images_evaluation/ .*"
        r"not Omniglot's images_evaluation",
    ):
        load("omniglot:evaluation", root=tmp_path)


def test_size_option_resizes(data_root: Path) -> None:
    small = load("omniglot:background", root=data_root, size=14)
    assert small.x.shape == (964 * 20, 1, 14, 14)


# --------------------------------------------------------------------------- Lake's runs


def test_lake_runs_are_valid_and_equal_evaluation_images(data_root: Path, evaluation: LabeledData) -> None:
    runs = load_lake_runs(root=data_root)
    assert len(runs) == 20
    assert [r.name for r in runs] == [f"run{i:02d}" for i in range(1, 21)]
    # every evaluation image by its exact bytes -> its class (preprocessing is identical, so bytes match)
    by_bytes = {img.numpy().tobytes(): int(c) for img, c in zip(evaluation.x, evaluation.y)}
    alphabet = evaluation.meta["alphabet"]
    for run in runs:
        assert run.train_x.shape == run.test_x.shape == (20, 1, 28, 28)
        assert run.answer.dtype == torch.int64
        assert sorted(run.answer.tolist()) == list(range(20))  # one test image per class
        train_cls = [by_bytes[img.numpy().tobytes()] for img in run.train_x]
        test_cls = [by_bytes[img.numpy().tobytes()] for img in run.test_x]
        assert len(set(train_cls)) == 20
        assert [train_cls[a] for a in run.answer.tolist()] == test_cls  # the answer names the right class
        assert len({alphabet[c] for c in train_cls}) == 1  # Lake's runs are within one alphabet


def test_lake_runs_cached_equal(data_root: Path) -> None:
    a, b = load_lake_runs(root=data_root), load_lake_runs(root=data_root)
    assert all(torch.equal(x.test_x, y.test_x) and torch.equal(x.answer, y.answer) for x, y in zip(a, b))


# --------------------------------------------------------------------------- where data lives


def _touch(root: Path, dataset: str, *files: str) -> Path:
    (root / dataset).mkdir(parents=True, exist_ok=True)
    for f in files:
        (root / dataset / f).write_bytes(b"")
    return root


ZIPS = ("images_background.zip", "images_evaluation.zip")


def test_root_order_explicit_then_env_then_shared_then_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env = _touch(tmp_path / "env", "omniglot", *ZIPS)
    explicit = _touch(tmp_path / "explicit", "omniglot", *ZIPS)
    shared = _touch(tmp_path / "shared" / "data", "omniglot", *ZIPS)  # ../shared/data seen from `work`
    local = _touch(work / "data", "omniglot", *ZIPS)
    monkeypatch.setenv("DMLBENCH_DATA", str(env))
    assert resolve_root(explicit) == explicit
    assert resolve_root() == env
    monkeypatch.delenv("DMLBENCH_DATA")
    assert resolve_root().resolve() == shared.resolve()
    shutil.rmtree(shared / "omniglot")
    repo_shared = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    expected_local = repo_shared if (repo_shared / "omniglot" / ZIPS[0]).is_file() else local
    assert resolve_root().resolve() == expected_local.resolve()


def test_root_is_per_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An env root without the dataset is skipped for that dataset only."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env = _touch(tmp_path / "env", "other", "a.bin")
    local = _touch(work / "data", "mine", "m.bin")
    monkeypatch.setenv("DMLBENCH_DATA", str(env))
    assert resolve_root(None, "other", ("a.bin",)) == env
    assert resolve_root(None, "mine", ("m.bin",)).resolve() == local.resolve()


def test_missing_data_is_one_line_naming_files_and_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BenchError) as err:
        resolve_root(tmp_path / "nowhere", "omniglot", ZIPS)
    message = str(err.value)
    assert "\n" not in message
    assert "omniglot not found" in message and "images_background.zip and images_evaluation.zip" in message
    assert str(tmp_path / "nowhere" / "omniglot") in message
    monkeypatch.setenv("DMLBENCH_DATA", str(tmp_path / "env"))
    expected = r"ghost not found: put g\.npz under \$DMLBENCH_DATA/ghost/ \(looked in: .*env/ghost"
    with pytest.raises(BenchError, match=expected):
        resolve_root(None, "ghost", ("g.npz",))


def test_explicit_root_is_not_second_guessed(data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMLBENCH_DATA", str(data_root))
    with pytest.raises(BenchError, match="omniglot not found"):
        load("omniglot:background", root=tmp_path)


def test_unknown_spec_lists_valid_ones() -> None:
    expected = r"unknown dataset spec 'mnist'.*omniglot:background.*fashion-mnist:test.*folder:PATH"
    with pytest.raises(BenchError, match=expected):
        load("mnist")


# --------------------------------------------------------------------------- Fashion-MNIST


def test_fashion_mnist_test_split() -> None:
    data = load("fashion-mnist:test")
    assert data.x.shape == (10000, 1, 28, 28)
    assert data.classes == tuple(range(10))
    assert torch.equal(torch.bincount(data.y), torch.full((10,), 1000))
    assert data.meta["class_names"][9] == "Ankle boot"
    assert float(data.x.min()) == 0.0 and float(data.x.max()) == 1.0


def test_fashion_mnist_system_package_is_found_beside_an_explicit_root(tmp_path: Path) -> None:
    assert len(load("fashion-mnist:test", root=tmp_path)) == 10000


def test_fashion_mnist_missing_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.data.fashion_mnist as fashion_mnist

    monkeypatch.setattr(fashion_mnist, "SYSTEM_ROOT", tmp_path / "not-installed")
    with pytest.raises(BenchError) as err:
        load("fashion-mnist:test", root=tmp_path)
    message = str(err.value)
    assert "\n" not in message and "apt-get install dataset-fashion-mnist" in message
    assert f"put t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz under {tmp_path}/fashion-mnist/" in message


# --------------------------------------------------------------------------- a user's folder


def _write(path: Path, array: np.ndarray, mode: str, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode=None).convert(mode).save(path, format=fmt)


def test_folder_with_pgm_and_png(tmp_path: Path) -> None:
    white = np.full((10, 12), 255, np.uint8)
    half = np.zeros((8, 8), np.uint8)
    half[:, :4] = 255
    _write(tmp_path / "b" / "one.pgm", white, "L", "PPM")
    _write(tmp_path / "b" / "two.png", half, "L", "PNG")
    _write(tmp_path / "a" / "x.pgm", np.zeros((20, 20), np.uint8), "L", "PPM")
    data = load(f"folder:{tmp_path}", size=4)
    assert data.x.shape == (3, 1, 4, 4)
    assert data.y.tolist() == [0, 1, 1]  # folders in sorted order: a -> 0, b -> 1
    assert data.meta["class_names"] == {0: "a", 1: "b"}
    assert torch.all(data.x[0] == 0) and torch.all(data.x[1] == 1)
    assert torch.allclose(data.x[2, 0, :, :2], torch.ones(4, 2)) and torch.all(data.x[2, 0, :, 2:] == 0)


def test_folder_mixed_grey_and_rgb_becomes_rgb(tmp_path: Path) -> None:
    red = np.zeros((6, 6, 3), np.uint8)
    red[..., 0] = 255
    _write(tmp_path / "red" / "r.png", red, "RGB", "PNG")
    _write(tmp_path / "grey" / "g.pgm", np.full((6, 6), 255, np.uint8), "L", "PPM")
    data = load(f"folder:{tmp_path}", size=6)
    assert data.x.shape == (2, 3, 6, 6)
    assert torch.all(data.x[0] == 1)  # grey repeated over the channels
    assert torch.all(data.x[1, 0] == 1) and torch.all(data.x[1, 1:] == 0)


def test_folder_corrupt_image_is_named(tmp_path: Path) -> None:
    _write(tmp_path / "a" / "ok.png", np.zeros((5, 5), np.uint8), "L", "PNG")
    _write(tmp_path / "b" / "ok.png", np.zeros((5, 5), np.uint8), "L", "PNG")
    bad = tmp_path / "b" / "broken.png"
    bad.write_bytes((tmp_path / "a" / "ok.png").read_bytes()[:30])
    with pytest.raises(BenchError, match=f"corrupt or unreadable image {bad}"):
        load(f"folder:{tmp_path}")


def test_folder_skips_and_counts_files_that_are_not_images_by_extension(tmp_path: Path, caplog) -> None:
    """One rule: no image extension -> skipped and counted (one notice); hidden -> skipped; an image
    extension that does not decode -> an error naming the file."""
    for c in "ab":
        _write(tmp_path / c / "0.png", np.zeros((5, 5), np.uint8), "L", "PNG")
        _write(tmp_path / c / "1.JPG", np.zeros((5, 5), np.uint8), "L", "JPEG")
    (tmp_path / "README.txt").write_text("my faces\n")
    (tmp_path / "a" / "notes.txt").write_text("x")
    (tmp_path / "a" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")
    (tmp_path / "b" / "labels.csv").write_text("file,label\n")
    (tmp_path / "b" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    with caplog.at_level("INFO", logger="dmlbench"):
        data = load(f"folder:{tmp_path}", size=4)
    assert len(data) == 4 and data.y.tolist() == [0, 0, 1, 1]
    assert data.meta["skipped_files"] == 4
    notices = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(notices) == 2 and "skipped 3 file(s) without an image extension" in notices[0]
    assert "skipped 1 file(s) beside the class folders, in none (README.txt)" in notices[1]
    data.x.to_tensor()  # what is left decodes
    bad = tmp_path / "b" / "broken.jpg"
    bad.write_bytes(b"not a jpeg at all")
    with pytest.raises(BenchError, match=f"corrupt or unreadable image {bad}"):
        load(f"folder:{tmp_path}", size=4)


def test_folder_class_of_only_non_images_says_what_was_skipped(tmp_path: Path) -> None:
    _write(tmp_path / "a" / "0.png", np.zeros((5, 5), np.uint8), "L", "PNG")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("x")
    with pytest.raises(
        BenchError, match=r"holds no images \(skipped 1 file\(s\) without an image extension, e.g. notes.txt"
    ):
        load(f"folder:{tmp_path}", size=4)


def test_folder_needs_two_non_empty_classes(tmp_path: Path) -> None:
    _write(tmp_path / "only" / "a.png", np.zeros((5, 5), np.uint8), "L", "PNG")
    with pytest.raises(BenchError, match="1 class sub-folder.*at least 2"):
        load(f"folder:{tmp_path}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BenchError, match=f"class folder {tmp_path / 'empty'} holds no images"):
        load(f"folder:{tmp_path}")
    with pytest.raises(BenchError, match="does not exist"):
        load(f"folder:{tmp_path / 'absent'}")


def test_folder_with_a_sub_folder_in_a_class_is_named_not_skipped(tmp_path: Path) -> None:
    for c in "ab":
        _write(tmp_path / c / "0.png", np.zeros((5, 5), np.uint8), "L", "PNG")
    _write(tmp_path / "a" / "more" / "1.png", np.zeros((5, 5), np.uint8), "L", "PNG")
    with pytest.raises(BenchError, match=f"class folder {tmp_path / 'a'} holds a sub-folder 'more'"):
        load(f"folder:{tmp_path}")


# --------------------------------------------------------------------------- a user's npz


def test_npz_shapes(tmp_path: Path) -> None:
    y = np.array([0, 0, 1, 1, 2])
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "hw.npz", x=rng.integers(0, 256, (5, 8, 8), dtype=np.uint8), y=y)
    np.savez(tmp_path / "chw.npz", x=rng.random((5, 3, 8, 8)), y=y)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(5, 7)) * 10, y=y)
    hw = load(f"npz:{tmp_path / 'hw.npz'}", size=4)
    assert hw.x.shape == (5, 1, 4, 4) and 0 <= float(hw.x.min()) and float(hw.x.max()) <= 1
    assert load(f"npz:{tmp_path / 'chw.npz'}", size=8).x.shape == (5, 3, 8, 8)
    vectors = load(f"npz:{tmp_path / 'd.npz'}")
    assert vectors.x.shape == (5, 7) and float(vectors.x.abs().max()) > 1  # vectors keep their values
    assert vectors.y.tolist() == y.tolist() and vectors.y.dtype == torch.int64


def _with(x: np.ndarray, value: float, count: int) -> np.ndarray:
    """``x`` (float32) with its first ``count`` values set to ``value``."""
    x = x.astype(np.float32)
    x.reshape(-1)[:count] = value
    return x


@pytest.mark.parametrize(
    "x, y, message",
    [
        (
            np.zeros((4, 2, 3, 5, 5)),
            np.array([0, 0, 1, 1]),
            r"x must have shape \(N, H, W\), \(N, C, H, W\) or \(N, D\), got \(4, 2, 3, 5, 5\)",
        ),
        (np.zeros((4, 5)), np.array([[0, 1], [1, 0]]), r"y must have shape \(N,\) = \(4,\), got \(2, 2\)"),
        (np.zeros((4, 5)), np.zeros(4, int), r"y has 1 class\(es\); at least 2"),
        (np.full((4, 5, 5), 2.0), np.array([0, 0, 1, 1]), r"float images must lie in \[0, 1\], these lie in \[2, 2\]"),
        # a NaN is named as NaN, not as a value outside [0, 1]
        (_with(np.full((4, 5, 5), 0.5), np.nan, 3), np.array([0, 0, 1, 1]), r"float images hold 3 NaN value\(s\):"),
        (_with(np.full((4, 5, 5), 0.5), np.inf, 1), np.array([0, 0, 1, 1]), r"hold 1 infinite value\(s\):"),
        (_with(np.full((4, 6), 0.5), np.nan, 2), np.array([0, 0, 1, 1]), r"vectors x hold 2 NaN value\(s\):"),
    ],
)
def test_npz_bad_input(tmp_path: Path, x: np.ndarray, y: np.ndarray, message: str) -> None:
    np.savez(tmp_path / "bad.npz", x=x, y=y)
    with pytest.raises(BenchError, match=message):
        load(f"npz:{tmp_path / 'bad.npz'}")


def test_npz_missing_arrays(tmp_path: Path) -> None:
    np.savez(tmp_path / "bad.npz", images=np.zeros((2, 3)))
    with pytest.raises(BenchError, match="needs arrays named x and y, found images"):
        load(f"npz:{tmp_path / 'bad.npz'}")


# --------------------------------------------------------------------------- LabeledData


def test_labeled_data_subset_and_checks() -> None:
    data = LabeledData(torch.rand(6, 3), torch.tensor([5, 5, 7, 7, 9, 9]), "toy", {"k": 1})
    assert len(data) == 6 and data.classes == (5, 7, 9)
    sub = data.subset([9, 5])
    assert sub.classes == (5, 9) and len(sub) == 4 and sub.meta == {"k": 1}
    assert torch.equal(sub.x, data.x[[0, 1, 4, 5]])
    with pytest.raises(BenchError, match="not in the data: 8"):
        data.subset([8])
    with pytest.raises(BenchError, match=r"y must have shape \(N,\) = \(6,\), got \(5,\)"):
        LabeledData(torch.rand(6, 3), torch.zeros(5, dtype=torch.int64), "toy")
    with pytest.raises(BenchError, match="y must be an int64 tensor"):
        LabeledData(torch.rand(6, 3), torch.zeros(6, dtype=torch.int32), "toy")
