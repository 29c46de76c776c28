"""`csv:PATH#SPLIT`: a dataset listed in open-metric-learning's CSV format, under the image folders' rules.

Fixture images are generated PNGs; the sweep is a real one (the MLflow
SQLite store, the Optuna storage). Hostile listings are also cases of
tests/bad_inputs/ (data-csv-*.yaml).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from _shared import write_folder
from PIL import Image

from bench.data import check_path, class_keys, load, resolve_spec
from bench.data.csv_listing import ROW
from bench.data.fingerprint import content_fingerprint
from bench.errors import BenchError

CLASSES = [f"c{i}" for i in range(8)]


def _listing(root: Path, rows: list[dict[str, object]] | None = None, name: str = "df.csv") -> Path:
    """PNGs under root/images/<class>/ and an OML listing of them: classes 0-3 train, 4-7 validation (every
    validation image query and gallery, except the first of each class: gallery only)."""
    if not (root / "images").exists():
        write_folder(root / "images", CLASSES, per_class=4)
    if rows is None:
        rows = []
        for label, cls in enumerate(CLASSES):
            for j in range(4):
                train = label < 4
                rows.append(
                    {
                        "label": label,
                        "path": f"images/{cls}/{j}.png",
                        "split": "train" if train else "validation",
                        "is_query": "" if train else str(j > 0),
                        "is_gallery": "" if train else "True",
                    }
                )
    with open(root / name, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return root / name


def test_each_split_reads_its_rows(tmp_path: Path) -> None:
    file = _listing(tmp_path)
    train = load(f"csv:{file}#train", size=8)
    assert sorted(train.classes) == [0, 1, 2, 3] and len(train) == 16
    query = load(f"csv:{file}#query", size=8)
    gallery = load(f"csv:{file}#gallery", size=8)
    assert len(query) == 12 and len(gallery) == 16 and sorted(gallery.classes) == [4, 5, 6, 7]
    # the rows pair a query with itself in the gallery
    assert set(query.per_sample[ROW].tolist()) < set(gallery.per_sample[ROW].tolist())
    # the files the CSV lists, relative to its folder, read lazily as a folder's are
    assert train.lazy and Path(train.x.root) == tmp_path and train.x.paths[0] == "images/c0/0.png"
    assert content_fingerprint(train) != content_fingerprint(query)


def test_validation_rows_divided_by_query_and_gallery_are_refused_as_one_set(tmp_path: Path) -> None:
    file = _listing(tmp_path)
    with pytest.raises(BenchError, match="is_query and is_gallery divide the validation rows"):
        load(f"csv:{file}#validation", size=8)


def test_train_and_validation_share_a_class_by_label(tmp_path: Path) -> None:
    file = _listing(tmp_path)
    train, gallery = load(f"csv:{file}#train", size=8), load(f"csv:{file}#gallery", size=8)
    assert not set(class_keys(f"csv:{file}#train", train).values()) & set(
        class_keys(f"csv:{file}#gallery", gallery).values()
    )
    # one label on both sides is one class: the leak check sees it
    shared = class_keys(f"csv:{file}#train", train)[0]
    assert shared == (f"csv:{file.resolve()}", "0")


def test_a_changed_image_changes_the_fingerprint(tmp_path: Path) -> None:
    file = _listing(tmp_path)
    before = content_fingerprint(load(f"csv:{file}#train", size=8))
    (tmp_path / "images" / "c1" / "2.png").write_bytes((tmp_path / "images" / "c2" / "3.png").read_bytes())
    assert content_fingerprint(load(f"csv:{file}#train", size=8)) != before


def test_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = _listing(tmp_path)
    assert resolve_spec("csv:df.csv#train", tmp_path) == f"csv:{file}#train"
    monkeypatch.chdir(tmp_path)
    assert len(load("csv:df.csv#train", size=8)) == 16  # relative to here outside a protocol
    check_path("csv:df.csv#train")
    with pytest.raises(BenchError, match="does not exist"):
        check_path("csv:nope.csv#train")


def _one_bad(tmp_path: Path, **change: object) -> Path:
    rows = [
        {"label": c, "path": f"images/{CLASSES[c]}/{j}.png", "split": "train" if c < 4 else "validation"}
        for c in range(8)
        for j in range(4)
    ]
    rows[5].update(change)
    return _listing(tmp_path, rows)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"path": "images/c1/9.png"}, "line 7: image images/c1/9.png does not exist"),
        ({"path": "../outside.png"}, "line 7: path '../outside.png' leaves the CSV's folder"),
        ({"path": "images/../../x.png"}, "leaves the CSV's folder"),
        ({"path": "/etc/passwd"}, "is absolute"),
        ({"label": "cat"}, "line 7: label 'cat': expected an integer >= 0"),
        ({"label": "-1"}, "label '-1'"),
        ({"label": "1.5"}, "label '1.5'"),
        ({"label": "1e300"}, "label '1e300'"),
        ({"split": "test"}, "line 7: split 'test': expected train or validation"),
        ({"path": "images/c1/0.png"}, "images/c1/0.png is listed again (first on line 6)"),
    ],
)
def test_hostile_rows_are_one_line(tmp_path: Path, change: dict[str, object], said: str) -> None:
    file = _one_bad(tmp_path, **change)
    with pytest.raises(BenchError, match=None) as e:
        load(f"csv:{file}#train", size=8)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_empty_split_missing_columns_and_no_split(tmp_path: Path) -> None:
    rows = [{"label": c, "path": f"images/{CLASSES[c]}/{j}.png", "split": "train"} for c in range(8) for j in range(4)]
    file = _listing(tmp_path, rows)
    with pytest.raises(BenchError, match="no row is selected by 'validation' \\(the file has train: 32 rows\\)"):
        load(f"csv:{file}#validation", size=8)
    with pytest.raises(BenchError, match="name the rows to read after a '#'"):
        load(f"csv:{file}", size=8)
    bad = _listing(tmp_path, [{"label": 0, "file": "images/c0/0.png", "split": "train"}], name="bad.csv")
    with pytest.raises(BenchError, match="the header has no column path"):
        load(f"csv:{bad}#train", size=8)
    crop = _listing(tmp_path, [{**rows[0], "x_1": 3}], name="crop.csv")
    with pytest.raises(BenchError, match="a crop \\(x_1\\) is given"):
        load(f"csv:{crop}#train", size=8)


PROTOCOL = """
name: csv-tiny
seed: 0
data:
  train: csv:data/df.csv#train
  test: {query: csv:data/df.csv#query, gallery: csv:data/df.csv#gallery}
  image_size: 8
  validation: {folds: 2, use: 1}
model: {trunk: mlp, trunk_params: {hidden: [16]}, embedding_dim: 8, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 3}
evaluation: {metrics: [precision_at_1, recall_at_k], primary: precision_at_1, ks: [1, 2]}
tuning: {trials: 1, startup_trials: 1}
final: {seeds: 1}
grid:
  losses: [{name: contrastive}]
"""


def test_a_protocol_over_a_csv_listing_runs_and_no_query_finds_itself(tmp_path: Path) -> None:
    """Paths relative to the protocol's folder; query and gallery rows of one file, each query also in the
    gallery: it is excluded from its own ranking (pure-noise images: finding itself would give P@1 = 1)."""
    import pandas as pd

    from bench.cli import main

    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    rows = []
    for label in range(8):
        (data / "images" / str(label)).mkdir(parents=True)
        for j in range(4):
            Image.fromarray(rng.integers(0, 256, (8, 8)).astype(np.uint8), "L").save(
                data / "images" / str(label) / f"{j}.png"
            )
            train = label < 4
            rows.append(
                {
                    "label": label,
                    "path": f"images/{label}/{j}.png",
                    "split": "train" if train else "validation",
                    "is_query": "" if train else "True",
                    "is_gallery": "" if train else "True",
                }
            )
    _listing(data, rows)
    (tmp_path / "p.yaml").write_text(PROTOCOL)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = [
        "--results-dir",
        str(tmp_path / "results"),
        "--storage",
        f"sqlite:///{tmp_path / 'optuna.db'}",
        "--tracking-uri",
        str(tmp_path / "mlflow.db"),
    ]
    import os

    cwd = os.getcwd()
    os.chdir(elsewhere)  # the protocol's paths are its folder's, not the current directory's
    try:
        assert main(["validate", str(tmp_path / "p.yaml")]) == 0
        assert main(["run", str(tmp_path / "p.yaml"), *args, "--threads", "1", "--quiet"]) == 0
    finally:
        os.chdir(cwd)
    finals = pd.read_csv(tmp_path / "results" / "csv-tiny" / "finals.csv")
    assert (finals["state"] == "COMPLETE").all()
    assert finals["precision_at_1"].item() < 0.9
