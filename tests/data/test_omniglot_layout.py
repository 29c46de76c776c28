"""Omniglot from its publisher's files, on tiny copies written here in the publisher's exact layout.

github.com/brendenlake/omniglot ships ``python/images_background.zip``
holding ``images_background/<Alphabet>/characterNN/<id>_<drawer>.png``
(105x105, 1-bit, paper white; directory entries included), and the same for
``images_evaluation``; the publisher's ids are not in folder order. The
copies here have 3 and 2 alphabets, a few characters, 20 drawers, and are
read as a zip, as the unpacked folder and as torchvision's ``omniglot-py/``.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench.data import LabeledData, load, load_lake_runs, omniglot, roots
from bench.data.omniglot import SetShape, paper_to_ink
from bench.data.resize import resize_area
from bench.errors import BenchError

# alphabet -> characters, in the publisher's id order (not sorted: "Beta" holds the first ids)
BACKGROUND = {"Beta": 2, "Alpha": 3, "Gamma_(Greek)": 1}
EVALUATION = {"Zeta": 2, "Eta": 1}
SHAPES = {
    "background": SetShape("images_background", 0, len(BACKGROUND), sum(BACKGROUND.values())),
    "evaluation": SetShape("images_evaluation", 964, len(EVALUATION), sum(EVALUATION.values())),
}
SIZE = 14


@pytest.fixture(autouse=True)
def _tiny_sets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The reader expects the tiny copies' counts; each test has its own cache."""
    for split, shape in SHAPES.items():
        monkeypatch.setitem(omniglot.SETS, split, shape)
    monkeypatch.setenv("DMLBENCH_CACHE", str(tmp_path / "cache"))


def page(seed: int) -> np.ndarray:
    """A 105x105 bool page (paper True) with a few random strokes of ink."""
    rng = np.random.default_rng(seed)
    paper = np.ones((105, 105), bool)
    for _ in range(4):
        r, c = rng.integers(10, 90, 2)
        paper[r : r + rng.integers(3, 15), c : c + 3] = False
    return paper


def png(paper: np.ndarray) -> bytes:
    """A 1-bit PNG, as the publisher's (mode "1", white paper)."""
    out = io.BytesIO()
    Image.fromarray(paper.astype(np.uint8) * 255, "L").convert("1").save(out, "PNG")
    return out.getvalue()


def members(folder: str, alphabets: dict[str, int], first_id: int, seed: int = 0) -> dict[str, bytes]:
    """``folder/<Alphabet>/characterNN/<id:04d>_<drawer:02d>.png`` -> PNG bytes, ids counted in `alphabets` order."""
    files: dict[str, bytes] = {}
    number = first_id
    for alphabet, n in alphabets.items():
        for c in range(1, n + 1):
            for drawer in range(1, 21):
                files[f"{folder}/{alphabet}/character{c:02d}/{number:04d}_{drawer:02d}.png"] = png(
                    page(seed + number * 100 + drawer)
                )
            number += 1
    return files


def write_zip(path: Path, files: dict[str, bytes]) -> Path:
    """A zip with directory entries before their files, as the publisher's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        seen: set[str] = set()
        for name, data in files.items():
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i]) + "/"
                if d not in seen:
                    seen.add(d)
                    z.writestr(d, b"")
            z.writestr(name, data)
    return path


def write_folder(where: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_bytes(data)


def both_sets() -> dict[str, dict[str, bytes]]:
    return {
        "images_background": members("images_background", BACKGROUND, 1),
        "images_evaluation": members("images_evaluation", EVALUATION, 965),
    }


def as_zips(where: Path) -> Path:
    for folder, files in both_sets().items():
        write_zip(where / f"{folder}.zip", files)
    return where


def load_both(root: Path) -> dict[str, LabeledData]:
    return {split: load(f"omniglot:{split}", root=root, size=SIZE) for split in SHAPES}


# --------------------------------------------------------------------------- the three layouts agree


def test_zip_folder_and_torchvision_roots_give_identical_data(tmp_path: Path) -> None:
    zipped = tmp_path / "zipped"
    as_zips(zipped / "omniglot")
    unpacked = tmp_path / "unpacked"
    for files in both_sets().values():
        write_folder(unpacked / "omniglot", files)
    torchvision = tmp_path / "tv"  # torchvision's Omniglot(root) keeps the zips and unpacks them beside
    as_zips(torchvision / "omniglot-py")
    for files in both_sets().values():
        write_folder(torchvision / "omniglot-py", files)
    nested = tmp_path / "nested"  # torchvision pointed at <root>/omniglot, folders only
    for files in both_sets().values():
        write_folder(nested / "omniglot" / "omniglot-py", files)

    reference = load_both(zipped)
    assert reference["background"].meta["source"] == str(zipped / "omniglot" / "images_background.zip")
    for root, source in (
        (unpacked, unpacked / "omniglot" / "images_background"),
        (torchvision, torchvision / "omniglot-py" / "images_background.zip"),
        (nested, nested / "omniglot" / "omniglot-py" / "images_background"),
    ):
        other = load_both(root)
        assert other["background"].meta["source"] == str(source)
        for split in SHAPES:
            a, b = reference[split], other[split]
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
            assert a.meta["alphabet"] == b.meta["alphabet"] and a.meta["class_names"] == b.meta["class_names"]


def test_ids_are_the_publishers_and_images_follow_them(tmp_path: Path) -> None:
    data = load_both(as_zips(tmp_path / "omniglot").parent)
    bg, ev = data["background"], data["evaluation"]
    assert bg.x.shape == (6 * 20, 1, SIZE, SIZE) and ev.x.shape == (3 * 20, 1, SIZE, SIZE)
    assert bg.y.tolist() == [c for c in range(6) for _ in range(20)]
    assert ev.y.tolist() == [c for c in range(964, 967) for _ in range(20)]
    # file 0001 is class 0, whatever the folder order: Beta (ids 1-2) comes before Alpha (3-5)
    assert bg.meta["class_names"] == {
        0: "Beta/character01",
        1: "Beta/character02",
        2: "Alpha/character01",
        3: "Alpha/character02",
        4: "Alpha/character03",
        5: "Gamma_(Greek)/character01",
    }
    assert bg.meta["alphabet"] == {0: "Beta", 1: "Beta", 2: "Alpha", 3: "Alpha", 4: "Alpha", 5: "Gamma_(Greek)"}
    assert ev.meta["class_names"] == {964: "Zeta/character01", 965: "Zeta/character02", 966: "Eta/character01"}
    # sample i is (character i // 20, drawer i % 20 + 1), converted to ink and area-resized
    for split, data_, first in (("background", bg, 1), ("evaluation", ev, 965)):
        n = SHAPES[split].n_characters
        paper = np.stack([page(k * 100 + d) for k in range(first, first + n) for d in range(1, 21)])[:, None]
        expected = resize_area(paper, SIZE, convert=paper_to_ink)
        assert torch.equal(data_.x, torch.from_numpy(expected)), split
        assert float(data_.x.max()) > 0.5 and float(data_.x.mean()) < 0.2  # ink is bright on an empty page


def test_junk_beside_the_images_is_ignored(tmp_path: Path) -> None:
    files = both_sets()
    reference = load_both(as_zips(tmp_path / "clean" / "omniglot").parent)
    extra = dict(files["images_background"])
    extra["__MACOSX/images_background/Beta/._x.png"] = b"junk"
    extra["images_background/Beta/.DS_Store"] = b"junk"
    extra["images_background/Beta/character01/._0001_01.png"] = b"junk"
    write_zip(tmp_path / "junk" / "omniglot" / "images_background.zip", extra)
    assert torch.equal(load("omniglot:background", root=tmp_path / "junk", size=SIZE).x, reference["background"].x)


# --------------------------------------------------------------------------- one clear line when something is wrong


def one_line(err: pytest.ExceptionInfo[BenchError]) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_truncated_zip_is_one_line(tmp_path: Path) -> None:
    path = as_zips(tmp_path / "omniglot") / "images_background.zip"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(BenchError) as err:
        load("omniglot:background", root=tmp_path)
    message = one_line(err)
    assert str(path) in message and "not a readable zip" in message and "truncated" in message
    assert "github.com/brendenlake/omniglot" in message


def test_damaged_member_is_one_line(tmp_path: Path) -> None:
    path = as_zips(tmp_path / "omniglot") / "images_background.zip"
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("images_background/Alpha/character02/0004_07.png")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw[start + 10] ^= 0xFF  # inside the member's compressed bytes: the directory is intact
    path.write_bytes(bytes(raw))
    with pytest.raises(BenchError) as err:
        load("omniglot:background", root=tmp_path)
    message = one_line(err)
    assert "0004_07.png" in message and str(path) in message


def test_wrong_image_size_is_one_line(tmp_path: Path) -> None:
    files = both_sets()["images_background"]
    files["images_background/Alpha/character01/0003_05.png"] = png(np.ones((105, 104), bool))
    write_zip(tmp_path / "omniglot" / "images_background.zip", files)
    with pytest.raises(BenchError) as err:
        load("omniglot:background", root=tmp_path)
    assert "Alpha/character01/0003_05.png is 104x105, expected 105x105" in one_line(err)


def test_missing_set_names_the_file_and_where_it_comes_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_zip(tmp_path / "omniglot" / "images_background.zip", both_sets()["images_background"])
    with pytest.raises(BenchError) as err:
        load("omniglot:evaluation", root=tmp_path)
    message = one_line(err)
    assert message.startswith(
        f"omniglot not found: put images_evaluation.zip (github.com/brendenlake/omniglot, "
        f"python/) under {tmp_path}/omniglot/"
    )
    assert "images_background.zip" not in message  # that one is there
    assert f"looked in: {tmp_path / 'omniglot'}, {tmp_path / 'omniglot' / 'omniglot-py'}, " in message
    with pytest.raises(BenchError) as err:
        load("omniglot:background", root=tmp_path / "empty")
    assert "put images_background.zip and images_evaluation.zip (github" in one_line(err)
    # no explicit root: the place to put them is $DMLBENCH_DATA (the shared folder hidden for this check)
    monkeypatch.setenv("DMLBENCH_DATA", str(tmp_path / "empty"))
    monkeypatch.setattr(roots, "REPO_ROOT", tmp_path / "elsewhere" / "repo")
    monkeypatch.chdir(tmp_path / "omniglot")
    with pytest.raises(BenchError) as err:
        omniglot.find_set("background", None)
    assert "put images_background.zip and images_evaluation.zip" in one_line(err)
    assert "under $DMLBENCH_DATA/omniglot/" in str(err.value)


def test_the_published_counts_refuse_another_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    as_zips(tmp_path / "omniglot")
    monkeypatch.setitem(omniglot.SETS, "background", SetShape("images_background", 0, 30, 964))
    with pytest.raises(BenchError) as err:
        load("omniglot:background", root=tmp_path)
    assert "6 characters in 3 alphabets, expected 964 in 30 (Omniglot's images_background)" in one_line(err)


def test_a_missing_drawing_or_a_stray_file_is_one_line(tmp_path: Path) -> None:
    files = both_sets()["images_background"]
    del files["images_background/Gamma_(Greek)/character01/0006_13.png"]
    write_zip(tmp_path / "a" / "omniglot" / "images_background.zip", files)
    with pytest.raises(BenchError) as err:
        load("omniglot:background", root=tmp_path / "a")
    assert "Gamma_(Greek)/character01 has 19 drawings, expected drawers 01..20" in one_line(err)
    files["images_background/Gamma_(Greek)/character01/0006_13.png"] = png(page(0))
    files["images_background/Gamma_(Greek)/character01/extra.png"] = png(page(0))
    write_zip(tmp_path / "b" / "omniglot" / "images_background.zip", files)
    with pytest.raises(BenchError) as err:
        load("omniglot:background", root=tmp_path / "b")
    assert "unexpected file Gamma_(Greek)/character01/extra.png" in one_line(err)


# --------------------------------------------------------------------------- the cache follows the content


def cache_files(tmp_path: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "cache").iterdir()}


def test_cache_is_reused_until_a_zipped_image_changes(tmp_path: Path) -> None:
    files = both_sets()["images_background"]
    path = write_zip(tmp_path / "omniglot" / "images_background.zip", files)
    first = load("omniglot:background", root=tmp_path, size=SIZE)
    written = cache_files(tmp_path)
    assert len(written) == 1
    # the same images zipped again (new bytes, new mtime): the directory's names, sizes and CRCs are the same
    os.remove(path)
    write_zip(path, files)
    again = load("omniglot:background", root=tmp_path, size=SIZE)
    assert cache_files(tmp_path) == written and torch.equal(again.x, first.x)
    # one image changed: a new key, a rebuild, and the new pixels
    name = "images_background/Alpha/character01/0003_05.png"
    files[name] = png(page(12345))
    write_zip(path, files)
    changed = load("omniglot:background", root=tmp_path, size=SIZE)
    assert len(cache_files(tmp_path)) == 2
    i = 2 * 20 + 4  # class 2 (id 0003), drawer 05
    expected = resize_area(page(12345)[None, None], SIZE, convert=paper_to_ink)[0]
    assert torch.equal(changed.x[i], torch.from_numpy(expected)) and not torch.equal(changed.x[i], first.x[i])
    others = torch.ones(len(first.x), dtype=torch.bool)
    others[i] = False
    assert torch.equal(changed.x[others], first.x[others])


def test_cache_follows_a_changed_image_in_a_folder(tmp_path: Path) -> None:
    write_folder(tmp_path / "omniglot", both_sets()["images_background"])
    first = load("omniglot:background", root=tmp_path, size=SIZE)
    written = cache_files(tmp_path)
    assert torch.equal(load("omniglot:background", root=tmp_path, size=SIZE).x, first.x)
    assert cache_files(tmp_path) == written
    image = tmp_path / "omniglot" / "images_background" / "Beta" / "character02" / "0002_20.png"
    image.write_bytes(png(page(777)))
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))  # a coarse clock still moves
    changed = load("omniglot:background", root=tmp_path, size=SIZE)
    assert len(cache_files(tmp_path)) == 2
    assert not torch.equal(changed.x[39], first.x[39]) and torch.equal(changed.x[:39], first.x[:39])


# --------------------------------------------------------------------------- the real files


REAL = Path(os.environ.get("DMLBENCH_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")) / "omniglot"


def test_lake_runs_from_the_zip_equal_the_unpacked_folder(tmp_path: Path) -> None:
    if not (REAL / "all_runs.zip").is_file():
        pytest.skip("all_runs.zip not here")
    with zipfile.ZipFile(REAL / "all_runs.zip") as z:
        z.extractall(tmp_path / "omniglot" / "all_runs")  # unzip all_runs.zip -d all_runs
    zipped, unpacked = load_lake_runs(REAL.parent), load_lake_runs(tmp_path)
    assert len(zipped) == len(unpacked) == 20
    for a, b in zip(zipped, unpacked):
        assert a.name == b.name and torch.equal(a.answer, b.answer)
        assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_x, b.test_x)
    with pytest.raises(BenchError) as err:
        load_lake_runs(tmp_path / "nowhere")
    assert one_line(err).startswith(
        "omniglot not found: put all_runs.zip (github.com/brendenlake/omniglot, python/one-shot-classification/)"
    )


def test_real_background_zip_equals_the_npz_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher's zip read by the loader equals the images read straight from it here (every member,
    ordered by the character id in its name and then the drawer, labelled id - 1), at 28, on a data root of the
    two zips alone; and, where the folder still has the .npz arrays, those arrays too."""
    if not (REAL / "images_background.zip").is_file():
        pytest.fail(f"images_background.zip not under {REAL}: the tests need the real data")
    monkeypatch.setitem(omniglot.SETS, "background", SetShape("images_background", 0, 30, 964))
    data = load("omniglot:background", root=REAL.parent, size=28)
    members: list[tuple[int, int, str]] = []
    with zipfile.ZipFile(REAL / "images_background.zip") as z:
        for name in z.namelist():
            if name.endswith(".png"):
                number, drawer = Path(name).stem.split("_")
                members.append((int(number), int(drawer), name))
        members.sort()
        paper = np.stack([np.asarray(Image.open(io.BytesIO(z.read(n))).convert("L")) >= 128 for *_, n in members])
    assert len(members) == 964 * 20 and paper.shape == (964 * 20, 105, 105)
    expected = resize_area(paper[:, None], 28, convert=paper_to_ink)
    assert torch.equal(data.x, torch.from_numpy(expected))
    assert torch.equal(data.y, torch.tensor([number - 1 for number, *_ in members]))
    assert data.meta["class_names"][0] == "/".join(Path(members[0][2]).parts[1:3])
    if (REAL / "images_background.npz").is_file():  # the arrays the data folder once held
        with np.load(REAL / "images_background.npz") as f:
            images, labels = f["images"], f["labels"]
        expected = resize_area(images.reshape(-1, 1, 105, 105), 28, convert=paper_to_ink)
        assert torch.equal(data.x, torch.from_numpy(expected))
        assert torch.equal(data.y, torch.from_numpy(labels.reshape(-1).astype(np.int64)))
