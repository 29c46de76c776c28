"""The readers of the published layouts (CUB-200-2011, Cars196, SOP, In-shop, Market-1501) on tiny copies.

The copies come from `datasets_fixtures`, written in the publishers' exact
layouts; each reader must give the listed images, the global class ids of
the conventional class-disjoint split, and per-sample facts, and a missing
or damaged file must be one line that says what to do.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from datasets_fixtures import Written, write_cars, write_cub, write_inshop, write_market, write_sop
from numpy.lib.recfunctions import repack_fields

from bench.cli import main
from bench.data import SPECS, load
from bench.data.cars import read_cars196
from bench.data.cub import read_cub200
from bench.data.files import FileIndex
from bench.data.inshop import read_inshop
from bench.data.market import read_market1501
from bench.data.sop import read_sop
from bench.errors import BenchError

Reader = Callable[[Path, str], FileIndex]
# family: (writer, reader, folder, archive named in the missing-data error, splits)
FAMILIES: dict[str, tuple[Callable[[Path], Written], Reader, str, str, tuple[str, ...]]] = {
    "cub200": (write_cub, read_cub200, "CUB_200_2011", "CUB_200_2011.tgz", ("train", "test")),
    "cars196": (write_cars, read_cars196, "cars196", "car_ims.tgz", ("train", "test")),
    "sop": (write_sop, read_sop, "Stanford_Online_Products", "Stanford_Online_Products.zip", ("train", "test")),
    "inshop": (write_inshop, read_inshop, "inshop", "img.zip", ("train", "query", "gallery")),
    "market1501": (
        write_market,
        read_market1501,
        "Market-1501-v15.09.15",
        "Market-1501-v15.09.15.zip",
        ("train", "query", "gallery"),
    ),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Written]]:
    """One data root holding all five layouts (written once: JPEG writing is the slow part)."""
    where = tmp_path_factory.mktemp("standard")
    return where, {family: spec[0](where) for family, spec in FAMILIES.items()}


def _pairs(index: FileIndex) -> list[tuple[str, int]]:
    return list(zip(index.paths, index.labels))


@pytest.mark.parametrize("family", FAMILIES)
def test_reader_lists_every_written_image_with_its_class(family: str, root: tuple[Path, dict[str, Written]]) -> None:
    where, written = root
    _, read, folder, _, splits = FAMILIES[family]
    for split in splits:
        index = read(where, split)
        assert index.name == f"{family}:{split}"
        assert index.root == where / folder
        assert sorted(_pairs(index)) == sorted(written[family][split])
        assert all((index.root / p).is_file() for p in index.paths)


def test_cub_classes_1_to_100_train_101_to_200_test(root: tuple[Path, dict[str, Written]]) -> None:
    train, test = read_cub200(root[0], "train"), read_cub200(root[0], "test")
    assert (len(train.paths), len(test.paths)) == (9, 9)
    assert set(train.labels) == {0, 1, 2} and set(test.labels) == {100, 101, 102}
    assert train.class_names[0] == "001.Bird_1" and test.class_names[102] == "103.Bird_103"


def test_cars_classes_1_to_98_train_99_to_196_test_names_from_the_mat(root: tuple[Path, dict[str, Written]]) -> None:
    train, test = read_cars196(root[0], "train"), read_cars196(root[0], "test")
    assert set(train.labels) == {0, 1, 97} and set(test.labels) == {98, 99, 195}
    assert train.class_names == {0: "Maker Model 1 2012", 1: "Maker Model 2 2012", 97: "Maker Model 98 2012"}
    assert test.class_names == {98: "Maker Model 99 2012", 99: "Maker Model 100 2012", 195: "Maker Model 196 2012"}


def test_sop_split_as_listed_with_super_classes(root: tuple[Path, dict[str, Written]]) -> None:
    train, test = read_sop(root[0], "train"), read_sop(root[0], "test")
    assert set(train.labels) == {0, 1, 2, 3} and set(test.labels) == {4, 5, 6}
    assert len(train.paths) == 8 and len(test.paths) == 6
    # product p (1-based) was written with super class ((p - 1) mod 12) + 1, kept 0-based
    assert train.per_sample["super_class"] == tuple(label % 12 for label in train.labels)
    assert all(
        p.startswith(
            (
                "bicycle_final/",
                "cabinet_final/",
                "chair_final/",
                "coffee_maker_final/",
                "fan_final/",
                "kettle_final/",
                "lamp_final/",
            )
        )
        for p in train.paths + test.paths
    )


def test_inshop_query_and_gallery_show_the_same_items_and_train_others(root: tuple[Path, dict[str, Written]]) -> None:
    train, query, gallery = (read_inshop(root[0], s) for s in ("train", "query", "gallery"))
    assert set(query.labels) == set(gallery.labels) == {2, 3, 7}
    assert set(train.labels) == {1, 4, 5}
    assert (len(train.paths), len(query.paths), len(gallery.paths)) == (9, 3, 6)
    assert not set(query.paths) & set(gallery.paths)
    assert query.class_names[7] == "id_00000007" and all(p.startswith("img/") for p in query.paths)


def test_market_junk_distractors_and_cameras(root: tuple[Path, dict[str, Written]]) -> None:
    train, query, gallery = (read_market1501(root[0], s) for s in ("train", "query", "gallery"))
    assert set(train.labels) == {2, 7, 11} and set(query.labels) == {1, 3, 5}
    assert gallery.labels.count(-1) == 2 and gallery.labels.count(0) == 2
    assert set(gallery.labels) == {-1, 0, 1, 3, 5}
    for index in (train, query, gallery):
        named = [int(re.search(r"_c(\d)s", p).group(1)) for p in index.paths]  # type: ignore[union-attr]
        assert index.per_sample["camera"] == tuple(named)
        assert not any(p.endswith("Thumbs.db") for p in index.paths)
    assert set(query.per_sample["camera"]) == {1} and set(gallery.per_sample["camera"]) == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("family", FAMILIES)
def test_missing_dataset_is_one_line_naming_the_archive_and_the_root(family: str, tmp_path: Path) -> None:
    _, read, folder, archive, splits = FAMILIES[family]
    with pytest.raises(BenchError) as err:
        read(tmp_path, splits[0])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{family}: {folder}/") and f"not found under {tmp_path}" in message
    assert f"{archive} into {tmp_path}" in message


@pytest.mark.parametrize(
    ("family", "removed", "named"),
    [
        ("cub200", "CUB_200_2011/image_class_labels.txt", "CUB_200_2011/image_class_labels.txt"),
        ("cub200", "CUB_200_2011/images", "CUB_200_2011/images/"),
        ("cars196", "cars196/cars_annos.mat", "cars196/cars_annos.mat"),
        ("cars196", "cars196/car_ims", "cars196/car_ims/"),
        ("sop", "Stanford_Online_Products/Ebay_test.txt", "Stanford_Online_Products/Ebay_test.txt"),
        ("inshop", "inshop/Eval", "inshop/Eval/list_eval_partition.txt"),
        ("inshop", "inshop/img", "inshop/img/"),
        ("market1501", "Market-1501-v15.09.15/query", "Market-1501-v15.09.15/query/"),
    ],
)
def test_missing_part_is_named(family: str, removed: str, named: str, tmp_path: Path) -> None:
    FAMILIES[family][0](tmp_path)
    target = tmp_path / removed
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(BenchError, match=f"^{family}: {re.escape(named)} not found under "):
        FAMILIES[family][1](tmp_path, FAMILIES[family][4][0])


@pytest.mark.parametrize("family", ["cub200", "cars196", "sop", "inshop"])
def test_listed_image_missing_is_named(family: str, tmp_path: Path) -> None:
    """Any listed image, not only the first: a file missing from the middle would stop a run hours in."""
    write, read, folder, _, splits = FAMILIES[family]
    write(tmp_path)
    paths = read(tmp_path, splits[0]).paths
    middle, last = tmp_path / folder / paths[len(paths) // 2], tmp_path / folder / paths[-1]
    middle.unlink()
    with pytest.raises(BenchError, match=f"^{family}: image {re.escape(str(middle))} listed in the index is missing:"):
        read(tmp_path, splits[0])
    last.unlink()
    with pytest.raises(BenchError, match=f"is missing \\(and 1 more of {len(paths)}\\)"):
        read(tmp_path, splits[0])


def _edit(file: Path, line: int, text: str) -> None:
    lines = file.read_text().splitlines()
    lines[line - 1] = text
    file.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("family", "file", "line", "text", "why"),
    [
        ("cub200", "CUB_200_2011/images.txt", 4, "4 a b", "expected '<image_id> <image path>', got 3 fields"),
        ("cub200", "CUB_200_2011/image_class_labels.txt", 2, "2 two", "class id 'two' is not an integer"),
        ("cub200", "CUB_200_2011/image_class_labels.txt", 3, "3 201", "class id 201 is outside 1..200"),
        ("cub200", "CUB_200_2011/images.txt", 5, "4 001.Bird_1/x.jpg", "image id 4 repeats line 4"),
        (
            "sop",
            "Stanford_Online_Products/Ebay_train.txt",
            1,
            "image_id class_id path super_class_id",
            "expected the header 'image_id class_id super_class_id path'",
        ),
        ("sop", "Stanford_Online_Products/Ebay_train.txt", 3, "2 1 1", "expected 4 fields"),
        ("inshop", "inshop/Eval/list_eval_partition.txt", 1, "many", "the first line must be the number of images"),
        ("inshop", "inshop/Eval/list_eval_partition.txt", 1, "17", "says 17 images but lists 18"),
        (
            "inshop",
            "inshop/Eval/list_eval_partition.txt",
            2,
            "image_name evaluation_status item_id",
            "expected the header 'image_name item_id evaluation_status'",
        ),
        (
            "inshop",
            "inshop/Eval/list_eval_partition.txt",
            5,
            "img/MEN/x.jpg id_00000002 val",
            "evaluation_status 'val' is not one of train, query, gallery",
        ),
        (
            "inshop",
            "inshop/Eval/list_eval_partition.txt",
            6,
            "img/MEN/x.jpg item_2 query",
            "item id 'item_2' is not of the form id_<number>",
        ),
    ],
)
def test_malformed_line_names_file_and_line(
    family: str, file: str, line: int, text: str, why: str, tmp_path: Path
) -> None:
    FAMILIES[family][0](tmp_path)
    _edit(tmp_path / file, line, text)
    with pytest.raises(BenchError) as err:
        FAMILIES[family][1](tmp_path, FAMILIES[family][4][0])
    assert str(err.value).startswith(f"{family}: {tmp_path / file}, line {line}: {why}")


def test_market_stray_jpeg_name_is_named(tmp_path: Path) -> None:
    write_market(tmp_path)
    stray = tmp_path / "Market-1501-v15.09.15" / "query" / "0001_c7s1_000151_01.jpg"  # camera 7 does not exist
    shutil.copy(next(stray.parent.glob("0001_*.jpg")), stray)
    with pytest.raises(BenchError, match=f"^market1501: {re.escape(str(stray))}: name is not of the form"):
        read_market1501(tmp_path, "query")


def _rewrite_mat(file: Path, drop: str | None = None, first_class: int | None = None) -> None:
    mat = scipy.io.loadmat(file)
    annotations = mat["annotations"]
    if first_class is not None:
        annotations["class"][0, 0] = np.array([[first_class]], dtype=np.uint16)
    if drop is not None:
        kept = [n for n in annotations.dtype.names if n != drop]
        annotations = repack_fields(annotations[kept])
    scipy.io.savemat(file, {"annotations": annotations, "class_names": mat["class_names"]})


@pytest.mark.parametrize(
    ("drop", "first_class", "why"),
    [
        ("class", None, "'annotations' lacks field(s) class"),
        (None, 197, "annotation 1: class 197 is outside 1..196"),
    ],
)
def test_cars_bad_mat_is_one_line(drop: str | None, first_class: int | None, why: str, tmp_path: Path) -> None:
    write_cars(tmp_path)
    file = tmp_path / "cars196" / "cars_annos.mat"
    _rewrite_mat(file, drop, first_class)
    with pytest.raises(BenchError, match=re.escape(f"cars196: {file}: {why}")):
        read_cars196(tmp_path, "train")


def test_cars_damaged_mat_is_one_line(tmp_path: Path) -> None:
    write_cars(tmp_path)
    file = tmp_path / "cars196" / "cars_annos.mat"
    file.write_bytes(file.read_bytes()[:300])
    with pytest.raises(BenchError, match="cars196: .*cars_annos.mat is not a readable MATLAB file"):
        read_cars196(tmp_path, "test")


def test_unknown_split_is_named(root: tuple[Path, dict[str, Written]]) -> None:
    with pytest.raises(BenchError, match="inshop: unknown split 'test': expected one of train, query, gallery"):
        read_inshop(root[0], "test")


STANDARD_SPECS = [s for s in SPECS if s.split(":")[0] in FAMILIES]


def test_every_family_and_split_is_a_spec() -> None:
    assert STANDARD_SPECS == [f"{family}:{split}" for family, spec in FAMILIES.items() for split in spec[4]]


@pytest.mark.parametrize("spec", STANDARD_SPECS)
def test_spec_loads_from_an_explicit_root(spec: str, root: tuple[Path, dict[str, Written]]) -> None:
    family, split = spec.split(":")
    data = load(spec, root=root[0], size=12)
    expected = sorted(root[1][family][split])
    assert data.name == spec and data.x.shape[1:] == (3, 12, 12)  # CUB's one grey image becomes RGB
    assert sorted(zip(FAMILIES[family][1](root[0], split).paths, data.y.tolist())) == expected
    pixels = data.x.to_tensor()  # lazy files: decoded here, for the check only
    assert float(pixels.min()) >= 0.0 and float(pixels.max()) <= 1.0 and float(pixels.std()) > 0.01


def test_specs_load_through_dmlbench_data(
    root: tuple[Path, dict[str, Written]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DMLBENCH_DATA", str(root[0]))
    gallery = load("market1501:gallery", size=8, channels=1)
    assert gallery.x.shape == (13, 1, 8, 8)
    assert torch.equal(
        gallery.per_sample["camera"], torch.tensor(read_market1501(root[0], "gallery").per_sample["camera"])
    )
    assert load("cub200:test", size=8).y.unique().tolist() == [100, 101, 102]


def test_missing_under_dmlbench_data_lists_every_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DMLBENCH_DATA", str(tmp_path / "env"))
    with pytest.raises(BenchError) as err:
        load("sop:train")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"sop: Stanford_Online_Products/Ebay_train.txt not found under {tmp_path / 'env'}: "
        f"unzip Stanford_Online_Products.zip into {tmp_path / 'env'} (looked in: "
    )
    assert str(tmp_path / "data") in message


def test_explicit_root_is_not_second_guessed(
    root: tuple[Path, dict[str, Written]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DMLBENCH_DATA", str(root[0]))
    with pytest.raises(
        BenchError,
        match=f"^cars196: cars196/cars_annos.mat not found under {re.escape(str(tmp_path))}: "
        "unpack car_ims.tgz into .* and put cars_annos.mat beside car_ims/$",
    ):
        load("cars196:train", root=tmp_path)


E2E = """
name: {family}-tiny
seed: 0
data:
  train: {family}:train
  test: {family}:test
  image_size: 8
  validation: {{folds: 2, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [16]}}, embedding_dim: 8, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 2}}
evaluation: {{metrics: [precision_at_1, map_at_r], primary: map_at_r}}
tuning: {{trials: 1, startup_trials: 1}}
final: {{seeds: 1}}
grid:
  losses: [{{name: contrastive}}]
"""
E2E_DATA: dict[str, Callable[[Path], Written]] = {
    "cub200": lambda where: write_cub(where, classes=(1, 2, 3, 4, 101, 102, 103), per_class=4),
    "cars196": lambda where: write_cars(where, classes=(1, 2, 3, 98, 99, 196), per_class=4),
    "sop": lambda where: write_sop(where, train_products=4, test_products=3, per_product=4),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", E2E_DATA)
def test_train_test_family_runs_to_a_leaderboard(family: str, tmp_path: Path) -> None:
    """`dmlbench run` from the published layout, found through $DMLBENCH_DATA, to a ranked leaderboard.

    (In-shop and Market-1501 test a query set against a gallery: their end-to-end run needs the
    query/gallery form of ``data.test``.)"""
    E2E_DATA[family](tmp_path / "data")
    protocol = tmp_path / "p.yaml"
    protocol.write_text(E2E.format(family=family))
    runs = tmp_path / "runs"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DMLBENCH_DATA", str(tmp_path / "data"))
        patch.chdir(tmp_path)
        assert (
            main(
                [
                    "run",
                    str(protocol),
                    "--results-dir",
                    str(tmp_path / "results"),
                    "--storage",
                    f"sqlite:///{runs / 'optuna.db'}",
                    "--tracking-uri",
                    str(runs / "mlflow.db"),
                    "--quiet",
                ]
            )
            == 0
        )
    assert main(["leaderboard", str(tmp_path / "results" / f"{family}-tiny"), "--quiet"]) == 0
    board = (tmp_path / "results" / f"{family}-tiny" / "leaderboard.md").read_text()
    assert re.search(r"^\| 1 \| `contrastive\+none` \| 1 \| \d\.\d{3} ", board, re.MULTILINE)


def test_binary_index_file_is_one_line(tmp_path: Path) -> None:
    write_sop(tmp_path)
    file = tmp_path / "Stanford_Online_Products" / "Ebay_test.txt"
    file.write_bytes(file.read_bytes() + b"\xff\xfe\x00garbage\n")
    with pytest.raises(BenchError, match=f"^{re.escape(str(file))}: not UTF-8 text"):
        read_sop(tmp_path, "test")


def test_cub_files_disagreeing_on_image_ids_are_named(tmp_path: Path) -> None:
    write_cub(tmp_path)
    labels = tmp_path / "CUB_200_2011" / "image_class_labels.txt"
    labels.write_text("".join(labels.read_text().splitlines(keepends=True)[:-1]))  # drop image 18
    with pytest.raises(BenchError, match=r"^cub200: image id 18 is in .*images\.txt but not in image_class_labels"):
        read_cub200(tmp_path, "test")
