"""Three inputs that gave a wrong answer with exit 0 (issue 33), each reproduced as a user met it.

* two same-size images swap their bytes between classes and get their times back (``touch -r``): the digest
  cache trusted size and mtime, so the fingerprint, and `run`'s "nothing trained now", were the old ones;
* an .npz of channels-last images (N, 32, 32, 3) was read as 32 channels of 32 x 3 pixels;
* a 32-bit integer TIFF (Pillow mode I) holding 0-255 was divided by 65535.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench import data as datasets
from bench.cli import main
from bench.data import cache
from bench.data.fingerprint import content_fingerprint
from bench.data.images import eight_bit, read_image
from bench.errors import BenchError

# --------------------------------------------------------------------------- content changed, size and times kept


def _pgm_folder(root: Path, classes: int = 4, per_class: int = 4, seed: int = 0) -> Path:
    """Uncompressed 8 x 8 PGMs: every file has the same size, whatever its pixels."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(40 + 50 * c + rng.integers(-10, 10, (8, 8)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, "L").save(root / f"c{c}" / f"{i}.pgm")
    return root


def _swap_keeping_times(a: Path, b: Path) -> None:
    """Exchange two files' bytes in place, then give each its old times back (what ``touch -r`` does)."""
    stats = {p: p.stat() for p in (a, b)}
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    for p, st in stats.items():
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (p.stat().st_size, p.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_bytes_swapped_between_classes_with_times_restored_change_the_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache, "RACY_NS", 0)  # the files were written a moment ago: keep their digests anyway
    root = _pgm_folder(tmp_path / "imgs")
    a, b = root / "c0" / "1.pgm", root / "c3" / "2.pgm"
    assert a.stat().st_size == b.stat().st_size and a.read_bytes() != b.read_bytes()
    before = content_fingerprint(datasets.load(f"folder:{root}", size=8))
    stores = list((cache.cache_dir() / "fingerprints").glob("*.json"))
    known = json.loads(max(stores, key=lambda p: p.stat().st_mtime_ns).read_text())
    assert "c0/1.pgm" in known  # the digest was cached, keyed by its stat: the case the old key missed
    _swap_keeping_times(a, b)
    after = content_fingerprint(datasets.load(f"folder:{root}", size=8))
    assert after != before
    _swap_keeping_times(a, b)  # swapped back: the same content, the same fingerprint (re-read, not remembered)
    assert content_fingerprint(datasets.load(f"folder:{root}", size=8)) == before


def test_a_file_changed_moments_ago_is_not_remembered(tmp_path: Path) -> None:
    """A clock that keeps times to the second could let a second rewrite in that second keep every time:
    a file younger than `RACY_NS` is hashed each time, never cached."""
    root = _pgm_folder(tmp_path / "fresh", classes=2, per_class=2)
    content_fingerprint(datasets.load(f"folder:{root}", size=8))
    name = hashlib.blake2b(str(root.resolve()).encode(), digest_size=8).hexdigest()
    store = cache.cache_dir() / "fingerprints" / f"{name}.json"
    assert not store.exists() or json.loads(store.read_text()) == {}
    st = (root / "c0" / "0.pgm").stat()
    assert not cache.settled(st)
    os.utime(root / "c0" / "0.pgm", ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))
    assert not cache.settled((root / "c0" / "0.pgm").stat())  # an old mtime, but the change time is now


def test_run_after_the_swap_trains_anew_and_never_reports_the_old_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cache, "RACY_NS", 0)
    train, test = _pgm_folder(tmp_path / "train"), _pgm_folder(tmp_path / "test", classes=3, seed=1)
    protocol = tmp_path / "p.yaml"
    protocol.write_text(
        f"name: swap\ndata: {{train: 'folder:{train}', test: 'folder:{test}', image_size: 8,\n"
        "       validation: {folds: 2, use: 1}}\n"
        "model: {trunk: mlp, trunk_params: {hidden: [16]}, embedding_dim: 8, normalize: true}\n"
        "training: {optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 2}\n"
        "evaluation: {metrics: [precision_at_1, map_at_r], primary: map_at_r}\n"
        "tuning: {trials: 1, startup_trials: 1}\nfinal: {seeds: 1}\ngrid: {losses: [{name: contrastive}]}\n"
    )
    results = tmp_path / "results"
    common = [
        *("--results-dir", str(results), "--storage", f"sqlite:///{tmp_path}/o.db"),
        *("--tracking-uri", str(tmp_path / "mlflow.db"), "--threads", "1", "--quiet"),
    ]
    assert main(["run", str(protocol), *common]) == 0
    first = json.loads((results / "swap" / "manifest.json").read_text())
    _swap_keeping_times(train / "c0" / "1.pgm", train / "c3" / "2.pgm")
    caplog.set_level("INFO", logger="dmlbench")
    assert main(["run", str(protocol), *common]) == 0
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "nothing trained now" not in said
    second = json.loads((results / "swap" / "manifest.json").read_text())
    assert second["data_fingerprint"] != first["data_fingerprint"]
    moved = [p for p in results.iterdir() if p.name.startswith("swap@")]
    assert len(moved) == 1  # the old table kept aside, not reported as this data's


# --------------------------------------------------------------------------- channels-last arrays


def _npz(path: Path, x: np.ndarray, classes: int = 4) -> Path:
    np.savez(path, x=x, y=np.repeat(np.arange(classes), len(x) // classes))
    return path


def test_channels_last_npz_is_refused_in_one_line_naming_the_way_out(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    nhwc = rng.integers(0, 256, (8, 32, 32, 3)).astype(np.uint8)
    file = _npz(tmp_path / "x.npz", nhwc)
    with pytest.raises(BenchError) as err:
        datasets.load(f"npz:{file}", size=16)
    message = str(err.value)
    assert "\n" not in message and "(8, 32, 32, 3)" in message and "np.transpose(x, (0, 3, 1, 2))" in message
    assert "data.layout: nhwc" in message
    declared = datasets.load(f"npz:{file}", size=16, layout="nhwc")
    converted = datasets.load(f"npz:{_npz(tmp_path / 'nchw.npz', nhwc.transpose(0, 3, 1, 2))}", size=16)
    assert tuple(declared.x.shape) == (8, 3, 16, 16)
    assert torch.equal(declared.x, converted.x)  # declared or converted: the same tensors
    as_stored = datasets.load(f"npz:{file}", size=16, layout="nchw")  # said to be 32 channels: taken at its word
    assert tuple(as_stored.x.shape) == (8, 32, 16, 16)
    for shape in ((8, 3, 32, 32), (8, 1, 5, 5), (8, 4, 6, 3), (8, 7, 6, 5)):  # NCHW, or not channels-last
        assert (
            tuple(datasets.load(f"npz:{_npz(tmp_path / 'ok.npz', np.zeros(shape, np.uint8))}", size=4).x.shape)[1]
            == (shape[1])
        )
    with pytest.raises(BenchError, match="looks channels-last"):
        datasets.load(f"npz:{_npz(tmp_path / 'g.npz', np.zeros((8, 28, 28, 1), np.uint8))}", size=4)


def test_a_declared_layout_reaches_the_loader_through_the_protocol(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(1)
    for side, classes in (("train", 8), ("test", 4)):
        _npz(tmp_path / f"{side}.npz", rng.integers(0, 256, (classes * 4, 12, 12, 3)).astype(np.uint8), classes)
    text = (
        "name: nhwc\ndata: {train: npz:train.npz, test: npz:test.npz, image_size: 16, LAYOUT"
        "validation: {folds: 2, use: 1}}\nmodel: {trunk: conv4, embedding_dim: 8, normalize: true}\n"
        "training: {optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 2}\n"
        "evaluation: {metrics: [map_at_r], primary: map_at_r}\ntuning: {trials: 1}\nfinal: {seeds: 1}\n"
        "grid: {losses: [{name: triplet}]}\n"
    )
    (tmp_path / "p.yaml").write_text(text.replace("LAYOUT", ""))
    capsys.readouterr()
    assert main(["validate", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("dmlbench: error:") == 1 and "looks channels-last" in err
    (tmp_path / "p.yaml").write_text(text.replace("LAYOUT", "layout: nhwc, "))
    assert main(["validate", str(tmp_path / "p.yaml")]) == 0
    assert "inputs 3x16x16" in capsys.readouterr().out


# --------------------------------------------------------------------------- every Pillow mode by its real range

FACE = np.add.outer(np.arange(12) * 20, np.arange(10) * 3).clip(0, 255).astype(np.uint8)  # 0..255, 12 x 10


def _saved(img: Image.Image, fmt: str, tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.{fmt.lower()}"
    img.save(path, fmt)
    return path


def _grey_files(tmp: Path) -> dict[str, Path]:
    """The grey face in every grey mode a file can hold, values 0..255 in its own depth (16-bit: times 257)."""
    wide16 = FACE.astype(np.uint16) * 257
    files = {
        "L png": _saved(Image.fromarray(FACE, "L"), "PNG", tmp, "l"),
        "LA png": _saved(Image.fromarray(FACE, "L").convert("LA"), "PNG", tmp, "la"),
        "I 32-bit tiff": _saved(Image.fromarray(FACE.astype(np.int32)), "TIFF", tmp, "i32"),
        "I 32-bit unsigned tiff": _saved(Image.fromarray(FACE.astype(np.uint32)), "TIFF", tmp, "u32"),
        "I;16 png": _saved(Image.fromarray(wide16), "PNG", tmp, "i16"),
        "I;16 tiff": _saved(Image.fromarray(wide16), "TIFF", tmp, "i16"),
        "I;16B tiff": _saved(Image.fromarray(wide16.astype(">u2")), "TIFF", tmp, "i16b"),
        "I 16-bit pgm": _saved(Image.fromarray(wide16), "PPM", tmp, "i16"),
        "F tiff": _saved(Image.fromarray(FACE.astype(np.float32) / np.float32(255)), "TIFF", tmp, "f"),
    }
    return files


def test_every_grey_mode_holding_the_same_face_gives_the_same_tensor(tmp_path: Path) -> None:
    files = _grey_files(tmp_path)
    reference = read_image(files["L png"])
    modes = {name: Image.open(path).mode for name, path in files.items()}
    assert modes["I 32-bit tiff"] == "I" and modes["I 16-bit pgm"] == "I" and modes["I;16B tiff"] == "I;16B"
    assert {"L", "LA", "I", "I;16", "I;16B", "F"} <= set(modes.values())
    for name, path in files.items():
        assert np.array_equal(read_image(path), reference), name  # bit for bit
        with Image.open(path) as img:  # and through a pipeline's 8-bit start
            assert np.array_equal(np.asarray(eight_bit(img, 1, path)), FACE), name


def test_a_mode_I_face_folder_and_its_png_folder_give_the_same_tensors(tmp_path: Path) -> None:
    for kind in ("png", "tiff"):
        for c in range(2):
            (tmp_path / kind / f"c{c}").mkdir(parents=True)
            for i in range(2):
                face = np.roll(FACE, 3 * i + c, axis=1)
                img = Image.fromarray(face, "L") if kind == "png" else Image.fromarray(face.astype(np.int32))
                img.save(tmp_path / kind / f"c{c}" / f"{i}.{kind}")
    png = datasets.load(f"folder:{tmp_path / 'png'}", size=8).x.to_tensor()
    tiff = datasets.load(f"folder:{tmp_path / 'tiff'}", size=8).x.to_tensor()
    assert torch.equal(png, tiff) and png.max() > 0.5


def test_every_colour_mode_is_read_as_rgb_by_its_range(tmp_path: Path) -> None:
    rgb = np.stack([FACE, FACE[::-1], np.full_like(FACE, 77)], axis=-1)
    image = Image.fromarray(rgb, "RGB")
    reference = read_image(_saved(image, "PNG", tmp_path, "rgb"))
    exact = {
        "RGBA png": _saved(image.convert("RGBA"), "PNG", tmp_path, "rgba"),
        "CMYK tiff": _saved(image.convert("CMYK"), "TIFF", tmp_path, "cmyk"),
        "RGB tiff": _saved(image, "TIFF", tmp_path, "rgb"),
    }
    close = {  # a colour space of its own: Pillow's conversion back, within a few levels
        "YCbCr tiff": _saved(image.convert("YCbCr"), "TIFF", tmp_path, "ycbcr"),
    }
    for name, path in {**exact, **close}.items():
        with Image.open(path) as img:
            assert img.mode == name.split()[0], name
        out = read_image(path)
        assert out.shape == reference.shape, name
        tolerance = 0 if name in exact else 6 / 255
        assert np.abs(out - reference).max() <= tolerance + 1e-7, (name, np.abs(out - reference).max())
    lab = _saved(image.convert("LAB"), "TIFF", tmp_path, "lab")  # Pillow's way back is off by a tenth: refused
    with pytest.raises(BenchError, match="Pillow mode LAB is not read"):
        read_image(lab)
    palette = _saved(image.quantize(256), "PNG", tmp_path, "p")
    bilevel = _saved(Image.fromarray(FACE > 127), "PNG", tmp_path, "bilevel")
    assert Image.open(palette).mode == "P" and read_image(palette).shape == reference.shape
    assert Image.open(bilevel).mode == "1" and set(np.unique(read_image(bilevel))) == {0.0, 1.0}


@pytest.mark.parametrize(
    ("values", "fmt", "words"),
    [
        (np.array([[0, 4095]], np.int32), "TIFF", "mode I image holds values 0..4095, outside 0..255 (32-bit"),
        (np.array([[-3, 200]], np.int32), "TIFF", "mode I image holds values -3..200"),
        (np.array([[0.0, np.nan]], np.float32), "TIFF", "NaN"),
        (np.array([[0.0, 2.0]], np.float32), "TIFF", "must lie in [0, 1]"),
    ],
)
def test_a_value_outside_its_modes_range_is_one_line_naming_the_mode(
    tmp_path: Path, values: np.ndarray, fmt: str, words: str
) -> None:
    path = _saved(Image.fromarray(np.repeat(values, 4, axis=0)), fmt, tmp_path, "bad")
    with pytest.raises(BenchError) as err:
        read_image(path)
    assert words in str(err.value) and "\n" not in str(err.value) and str(path) in str(err.value)


# --------------------------------------------------------------------------- every file decoded before training


def test_every_file_is_decoded_once_and_again_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.data.decode_check import check_files

    monkeypatch.setattr(cache, "RACY_NS", 0)
    root = _pgm_folder(tmp_path / "imgs")
    files = datasets.load(f"folder:{root}", size=8).x
    assert check_files([files]) == 16
    assert check_files([files]) == 0  # remembered: one stat a file
    a, b = root / "c0" / "1.pgm", root / "c3" / "2.pgm"
    _swap_keeping_times(a, b)
    assert check_files([files]) == 2  # rewritten with their times restored: decoded again
    for cut in (a, b):
        cut.write_bytes(cut.read_bytes()[:-20])
    with pytest.raises(BenchError) as err:
        check_files([files])
    assert str(err.value).startswith(f"corrupt or unreadable image {a} (")
    assert "truncated" in str(err.value) and f"(and 1 other file(s) of {root})" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(BenchError):  # a file that failed is not remembered as good
        check_files([files])


def test_validate_no_decode_reads_headers_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for side, classes in (("train", 4), ("test", 3)):
        _pgm_folder(tmp_path / side, classes=classes, seed=classes)
    cut = tmp_path / "train" / "c2" / "3.pgm"
    cut.write_bytes(cut.read_bytes()[:-20])
    (tmp_path / "p.yaml").write_text(
        "name: cut\ndata: {train: folder:train, test: folder:test, image_size: 8, validation: {folds: 2, use: 1}}\n"
        "model: {trunk: mlp, embedding_dim: 8, normalize: true}\n"
        "training: {optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 2}\n"
        "evaluation: {metrics: [map_at_r], primary: map_at_r}\ntuning: {trials: 1}\nfinal: {seeds: 1}\n"
        "grid: {losses: [{name: triplet}]}\n"
    )
    capsys.readouterr()
    assert main(["validate", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("dmlbench: error:") == 1 and f"{cut} (" in err and "truncated" in err
    assert main(["validate", "--no-decode", str(tmp_path / "p.yaml")]) == 0


def test_omniglots_unpacked_folder_is_keyed_by_what_a_rewrite_cannot_keep(tmp_path: Path) -> None:
    """Omniglot's converted-array cache is keyed by its source's listing: for an unpacked folder, that is each
    file's `stat_key`, so two drawings swapped with their times restored are converted again."""
    from bench.data.omniglot import Source

    root = _pgm_folder(tmp_path / "images_background", classes=2, per_class=2)
    with Source(root, "images_background/", "Omniglot's images_background") as source:
        before = source.fingerprint()
    _swap_keeping_times(root / "c0" / "0.pgm", root / "c1" / "1.pgm")
    with Source(root, "images_background/", "Omniglot's images_background") as source:
        assert source.fingerprint() != before
