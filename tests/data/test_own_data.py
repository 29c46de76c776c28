"""A user's own data end to end: folders of PNGs and npz files written here, run through `bench.cli.main`.

Everything is real: PIL writes the images, the loaders read them, the
protocol is parsed and validated, and one tiny sweep runs to a leaderboard.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _shared import write_folder
from _sweeps import sweep, sweep_base, sweep_copy  # noqa: F401  (fixtures)
from PIL import Image

from bench import data as datasets
from bench.cli import main
from bench.data.splits import split_pool
from bench.protocol import parse_protocol
from bench.stats import t_interval, within
from bench.sweep.prepare import prepare

PROTOCOL = """
name: own-data
seed: 0
data:
{data}
  image_size: 8
  validation: {{folds: 2, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [16]}}, embedding_dim: 8, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: {iterations}}}
evaluation: {{metrics: [precision_at_1, map_at_r], primary: map_at_r}}
tuning: {{trials: 1, startup_trials: 1}}
final: {{seeds: {seeds}}}
grid:
  losses: [{{name: contrastive}}]
"""


def write_npz(path: Path, n_classes: int, per_class: int = 4, shape: tuple[int, ...] = (10, 10), seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n_classes * per_class, *shape)).astype(np.uint8)
    np.savez(path, x=x, y=np.repeat(np.arange(n_classes), per_class))
    return path


def protocol_file(tmp_path: Path, data: str, iterations: int = 2, seeds: int = 1, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(PROTOCOL.format(data=data, iterations=iterations, seeds=seeds))
    return path


# --------------------------------------------------------------------------- one pool, split for me


def test_a_pool_split_by_fraction_is_seeded_class_disjoint_and_named_like_train_test(tmp_path: Path) -> None:
    pool = write_folder(tmp_path / "faces", [f"s{i}" for i in range(10)])
    doc = f"  pool: folder:{pool}\n  split: {{test_classes: 0.5, seed: 3}}"
    prepared = prepare(parse_protocol(PROTOCOL.format(data=doc, iterations=2, seeds=1)))
    assert len(prepared.test_split) == 5 and len(prepared.train_split) == 5
    assert not set(prepared.test_split.classes) & set(prepared.train_split.classes)
    assert prepared.train_split, prepared.test_split == split_pool(range(10), 0.5, 3)
    same = prepare(parse_protocol(PROTOCOL.format(data=doc, iterations=2, seeds=1)))
    assert same.fingerprints() == prepared.fingerprints()
    other = doc.replace("seed: 3", "seed: 4")
    assert (
        prepare(parse_protocol(PROTOCOL.format(data=other, iterations=2, seeds=1))).fingerprints()
        != prepared.fingerprints()
    )


def test_pool_and_train_test_with_split_are_one_protocol_and_a_count_works(tmp_path: Path) -> None:
    pool = write_folder(tmp_path / "faces", [f"s{i}" for i in range(6)])
    a = parse_protocol(
        PROTOCOL.format(data=f"  pool: folder:{pool}\n  split: {{test_classes: 2}}", iterations=2, seeds=1)
    )
    b = parse_protocol(
        PROTOCOL.format(
            data=f"  train: folder:{pool}\n  test: folder:{pool}\n  split: {{test_classes: 2, seed: 0}}",
            iterations=2,
            seeds=1,
        )
    )
    assert a.hash == b.hash
    assert len(prepare(a).test_split) == 2


@pytest.mark.parametrize(
    "data, words",
    [
        ("  pool: folder:X\n  train: folder:X\n  split: {test_classes: 0.5}", "remove data.train"),
        ("  pool: folder:X", "needs data.split"),
        ("  train: folder:X\n  test: folder:Y\n  split: {test_classes: 0.5}", "divides one dataset"),
        ("  pool: folder:X\n  split: {test_classes: 2.5}", "a count (an integer) or a fraction"),
        ("  train: folder:X\n  test: folder:X", "same dataset"),
        ("  image_size: 8", "missing"),
    ],
)
def test_malformed_pools_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: str, words: str
) -> None:
    path = protocol_file(tmp_path, data.replace("  image_size: 8", ""))
    assert main(["validate", "--no-data", str(path)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_count_beyond_the_pool_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = write_folder(tmp_path / "faces", ["a", "b", "c"])
    path = protocol_file(tmp_path, f"  pool: folder:{pool}\n  split: {{test_classes: 3}}")
    assert main(["validate", str(path)]) == 2
    assert "count from 2 to 2" in capsys.readouterr().err


@pytest.mark.parametrize("test_classes", ["1", "1.0", "0.1"])
def test_a_split_with_one_test_class_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], test_classes: str
) -> None:
    """One test class ranks every neighbour as correct: every metric 1 whatever trained, so it is refused (as a
    count, as 1.0, or as a fraction that rounds to one class of ten)."""
    pool = write_folder(tmp_path / "faces", [f"c{i}" for i in range(10)])
    path = protocol_file(tmp_path, f"  pool: folder:{pool}\n  split: {{test_classes: {test_classes}}}")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "a test needs at least 2 classes" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- class names and identities


def test_folder_class_names_select_classes(tmp_path: Path) -> None:
    pool = write_folder(tmp_path / "faces", ["ann", "bob", "cid", "dan", "eve", "fay"])
    data = (
        f"  train: folder:{pool}\n  test: folder:{pool}\n  train_classes: [ann, bob, cid, dan]\n"
        "  test_classes: [eve, fay]"
    )
    prepared = prepare(parse_protocol(PROTOCOL.format(data=data, iterations=2, seeds=1)))
    names = prepared.train.meta["class_names"]
    assert sorted(names[c] for c in prepared.test_split.classes) == ["eve", "fay"]
    assert sorted(names[c] for c in prepared.train_split.classes) == ["ann", "bob", "cid", "dan"]


def test_an_unknown_class_name_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = write_folder(tmp_path / "faces", ["ann", "bob", "cid", "dan"])
    path = protocol_file(
        tmp_path,
        f"  train: folder:{pool}\n  test: folder:{pool}\n  train_classes: [ann, bob]\n  test_classes: [cid, zed]",
    )
    assert main(["validate", str(path)]) == 2
    assert "no class named 'zed'" in capsys.readouterr().err


def test_the_same_class_named_on_both_sides_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = write_folder(tmp_path / "faces", ["ann", "bob", "cid", "dan"])
    path = protocol_file(
        tmp_path,
        f"  train: folder:{pool}\n  test: folder:{pool}\n  train_classes: [ann, bob, cid]\n  test_classes: [cid, dan]",
    )
    assert main(["validate", "--no-data", str(path)]) == 2
    assert "shared with train_classes: cid" in capsys.readouterr().err


def test_two_folders_with_disjoint_classes_are_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = write_folder(tmp_path / "train", ["a", "b", "c", "d"])
    test = write_folder(tmp_path / "test", ["x", "y"], seed=1)
    path = protocol_file(tmp_path, f"  train: folder:{train}\n  test: folder:{test}")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"train folder:{train}: 4 classes, 16 samples" in out
    assert f"test folder:{test}: 2 classes, 8 samples" in out
    assert "fold 0: train 2 classes, 8 samples" in out


def test_two_relabelled_npz_files_are_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = write_npz(tmp_path / "train.npz", 4)
    test = write_npz(tmp_path / "test.npz", 3, seed=1)
    path = protocol_file(tmp_path, f"  train: npz:{train}\n  test: npz:{test}")
    assert main(["validate", str(path)]) == 0
    assert "3 classes, 12 samples" in capsys.readouterr().out


def test_the_same_folder_class_in_train_and_test_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two specs of one folder (another spelling of its path) overlap in class `c`: refused in one line."""
    pool = write_folder(tmp_path / "faces", ["a", "b", "c", "d"])
    path = protocol_file(
        tmp_path, f"  train: folder:{pool}\n  test: folder:{pool}/.\n  train_classes: [a, b, c]\n  test_classes: [c, d]"
    )
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train data contains 1 test class(es)" in err[0]


def test_two_npz_files_may_name_the_same_ids_on_both_sides(tmp_path: Path) -> None:
    """Ids 0 and 1 of one file are not ids 0 and 1 of another: lists are compared on the data, not the protocol."""
    train, test = write_npz(tmp_path / "train.npz", 4), write_npz(tmp_path / "test.npz", 3, seed=1)
    data = f"  train: npz:{train}\n  test: npz:{test}\n  train_classes: [0, 1, 2, 3]\n  test_classes: [0, 1]"
    prepared = prepare(parse_protocol(PROTOCOL.format(data=data, iterations=2, seeds=1)))
    assert prepared.test_split.classes == (0, 1) and prepared.train_split.classes == (0, 1, 2, 3)


def test_class_keys_tell_datasets_apart(tmp_path: Path) -> None:
    a = write_folder(tmp_path / "a", ["x", "y"])
    one, two = datasets.load(f"folder:{a}"), datasets.load(f"folder:{a}/.")
    assert datasets.class_keys(f"folder:{a}", one) == datasets.class_keys(f"folder:{a}/.", two)
    npz = write_npz(tmp_path / "n.npz", 2)
    assert set(datasets.class_keys(f"npz:{npz}", datasets.load(f"npz:{npz}")).values()).isdisjoint(
        datasets.class_keys(f"folder:{a}", one).values()
    )


# --------------------------------------------------------------------------- paths, plan and validate


def test_plan_and_validate_refuse_a_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = protocol_file(tmp_path, f"  pool: folder:{tmp_path / 'nowhere'}\n  split: {{test_classes: 0.5}}")
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr()
    assert "does not exist" in err.err and "classes" not in err.out
    assert main(["validate", str(path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    npz = protocol_file(
        tmp_path,
        f"  train: npz:{tmp_path}\n  test: npz:{tmp_path}/b.npz\n  train_classes: 26\n  test_classes: 3",
        name="q.yaml",
    )
    assert main(["plan", str(npz)]) == 2
    assert "is a folder, expected an .npz file" in capsys.readouterr().err


def test_relative_paths_in_a_protocol_file_are_relative_to_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """data specs and a model.pretrained path resolve against the protocol's folder, not the working
    directory; the hash covers them as written, so a copy of the folder elsewhere keeps it."""
    from bench.protocol import load_protocol

    project = tmp_path / "project"
    write_folder(project / "imgs", ["a", "b", "c", "d"])
    (project / "data").mkdir()
    write_npz(project / "data" / "x.npz", 4)
    data = "  train: folder:imgs\n  test: npz:data/x.npz\n  train_classes: [a, b, c]\n  test_classes: [0, 1, 2]"
    path = protocol_file(project, data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    protocol = load_protocol(path)
    assert protocol.doc["data"]["train"] == f"folder:{project / 'imgs'}"
    assert protocol.doc["data"]["test"] == f"npz:{project / 'data' / 'x.npz'}"
    assert main(["plan", str(path)]) == 0, capsys.readouterr().err  # the data is found from another folder
    capsys.readouterr()
    text = path.read_text().replace("  image_size: 8", "  image_size: 8\n  # moved")
    moved = tmp_path / "copy" / "p.yaml"
    moved.parent.mkdir()
    moved.write_text(path.read_text())
    assert load_protocol(moved).hash == protocol.hash  # the path as written is hashed
    assert load_protocol(moved).doc["data"]["train"] == f"folder:{moved.parent / 'imgs'}"
    assert parse_protocol(text).doc["data"]["train"] == f"folder:{elsewhere / 'imgs'}"  # text: the working dir
    assert main(["plan", str(moved)]) == 2
    assert f"{moved.parent / 'imgs'} does not exist" in capsys.readouterr().err  # the absolute path looked at
    weights = path.read_text().replace("normalize: true}", "normalize: true, pretrained: w/trunk.pt}")
    (project / "w.yaml").write_text(weights)
    assert load_protocol(project / "w.yaml").doc["model"]["pretrained"] == str(project / "w" / "trunk.pt")


def test_plan_describes_a_pool_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = write_folder(tmp_path / "faces", [f"s{i}" for i in range(4)])
    path = protocol_file(tmp_path, f"  pool: folder:{pool}\n  split: {{test_classes: 0.5, seed: 2}}")
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "split 0.5 of the classes for test (seed 2)" in out
    # what the kept models weigh is known, the embeddings' share only once the data are read
    kept = next(line for line in out.splitlines() if line.startswith("kept as MLflow artifacts"))
    assert "+ the test embeddings (a test set of a size not known here)" in kept and " + embeddings for " in kept


# --------------------------------------------------------------------------- sizes, aspect ratios, channels


def test_resize_modes_keep_or_change_the_aspect_ratio(tmp_path: Path) -> None:
    """A bright 4-wide bar in a 12x4 image: stretch fills the square, pad keeps a dark band, crop keeps the middle."""
    (tmp_path / "f" / "a").mkdir(parents=True)
    (tmp_path / "f" / "b").mkdir(parents=True)
    pixels = np.zeros((4, 12), dtype=np.uint8)
    pixels[:, 4:8] = 255
    for cls in ("a", "b"):
        Image.fromarray(pixels, "L").save(tmp_path / "f" / cls / "0.png")
    spec = f"folder:{tmp_path / 'f'}"
    stretch = datasets.load(spec, size=12, resize="stretch").x[0, 0]
    pad = datasets.load(spec, size=12, resize="pad").x[0, 0]
    crop = datasets.load(spec, size=4, resize="center_crop").x[0, 0]
    assert stretch.shape == pad.shape == (12, 12)
    assert float(stretch[:, 5].min()) == 1.0  # the bar spans every row
    assert float(pad[0].max()) == 0.0 and float(pad[6, 5]) == 1.0  # padding rows stay dark, the bar is in the middle
    assert float(crop.min()) == 1.0  # the centre crop is the bar alone


def test_channels_are_chosen_for_both_sides(tmp_path: Path) -> None:
    rgb = write_folder(tmp_path / "rgb", ["a", "b"], mode="RGB")
    grey = write_folder(tmp_path / "grey", ["c", "d"])
    assert datasets.load(f"folder:{rgb}", size=8, channels=1).x.shape[1] == 1
    assert datasets.load(f"folder:{grey}", size=8, channels=3).x.shape[1] == 3
    assert datasets.load(f"folder:{rgb}", size=8).x.shape[1] == 3


def test_a_channel_mismatch_is_refused_at_validation_and_channels_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = write_folder(tmp_path / "rgb", ["a", "b", "c", "d"], mode="RGB")
    test = write_folder(tmp_path / "grey", ["x", "y"])
    path = protocol_file(tmp_path, f"  train: folder:{train}\n  test: folder:{test}")
    assert main(["validate", str(path)]) == 2
    assert "set data.channels" in capsys.readouterr().err
    fixed = protocol_file(
        tmp_path,
        f"  train: folder:{train}\n  test: folder:{test}\n  channels: grey\n  resize: center_crop",
        name="fixed.yaml",
    )
    assert main(["validate", str(fixed)]) == 0
    assert "inputs 1x8x8" in capsys.readouterr().out


def test_writing_the_default_image_options_keeps_the_hash(tmp_path: Path) -> None:
    base = "  train: folder:A\n  test: folder:B"
    plain = parse_protocol(PROTOCOL.format(data=base, iterations=2, seeds=1))
    explicit = parse_protocol(
        PROTOCOL.format(data=base + "\n  resize: stretch\n  channels: null", iterations=2, seeds=1)
    )
    assert plain.hash == explicit.hash
    grey = parse_protocol(PROTOCOL.format(data=base + "\n  channels: grey", iterations=2, seeds=1))
    one = parse_protocol(PROTOCOL.format(data=base + "\n  channels: 1", iterations=2, seeds=1))
    assert grey.hash == one.hash != plain.hash


# --------------------------------------------------------------------------- train


def test_train_takes_class_lists_split_and_threads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = write_folder(tmp_path / "faces", ["ann", "bob", "cid", "dan", "eve", "fay"])
    common = [
        "train",
        "--data",
        f"folder:{pool}",
        "--trunk",
        "mlp",
        "--embedding-dim",
        "8",
        "--size",
        "8",
        "--loss",
        "contrastive",
        "--P",
        "2",
        "--K",
        "2",
        "--iterations",
        "2",
        "--threads",
        "1",
        "--tracking-uri",
        str(tmp_path / "mlflow.db"),
        "--format",
        "json",
        "--quiet",
    ]
    assert (
        main(
            [
                *common,
                "--test-data",
                f"folder:{pool}",
                "--train-classes",
                "ann,bob,cid,dan",
                "--test-classes",
                "eve,fay",
            ]
        )
        == 0
    )
    assert "precision_at_1" in json.loads(capsys.readouterr().out)["metrics"]
    assert main([*common, "--split", "0.5"]) == 0
    capsys.readouterr()
    assert (
        main([*common, "--test-data", f"folder:{pool}", "--train-classes", "ann,bob,cid", "--test-classes", "cid,dan"])
        == 3
    )
    assert "test class" in capsys.readouterr().err
    assert main([*common, "--test-data", f"folder:{pool}"]) == 2
    assert "same dataset" in capsys.readouterr().err


def test_train_prints_and_records_the_untrained_floor_beside_its_score(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The floor is the same seed's initial trunk scored the same way: it does not depend on training."""
    from mlflow.tracking import MlflowClient

    pool = write_folder(tmp_path / "faces", ["ann", "bob", "cid", "dan", "eve", "fay"])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = [
        "train",
        "--data",
        f"folder:{pool}",
        "--split",
        "0.5",
        "--trunk",
        "mlp",
        "--embedding-dim",
        "8",
        "--size",
        "8",
        "--loss",
        "contrastive",
        "--P",
        "2",
        "--K",
        "2",
        "--iterations",
        "3",
        "--threads",
        "1",
        "--tracking-uri",
        uri,
        "--quiet",
    ]
    assert main([*common, "--format", "json", "--lr", "0.5"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*common, "--format", "json", "--lr", "1e-6"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert set(one["floor"]) == set(one["metrics"]) and one["floor"] == two["floor"]
    assert one["metrics"] != two["metrics"]
    assert main([*common]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split() == ["metric", "trained", "floor"]
    row = next(line.split() for line in text if line.startswith("precision_at_1"))
    assert row[2] == f"{one['floor']['precision_at_1']:.4f}"
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(one["run_id"])
    assert run.data.metrics["floor_precision_at_1"] == pytest.approx(one["floor"]["precision_at_1"])
    assert run.data.metrics["precision_at_1"] == pytest.approx(one["metrics"]["precision_at_1"])


# --------------------------------------------------------------------------- end to end


def test_a_run_on_a_folder_pool_split_by_fraction_gives_a_leaderboard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = write_folder(tmp_path / "faces", [f"s{i}" for i in range(8)], size=(10, 14))
    path = protocol_file(
        tmp_path,
        f"  pool: folder:{pool}\n  split: {{test_classes: 0.5, seed: 0}}\n  resize: pad",
        iterations=3,
        seeds=2,
    )
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
    assert main(["leaderboard", str(results / "own-data")]) == 0
    board = (results / "own-data" / "leaderboard.md").read_text()
    assert "contrastive+none" in board
    assert "> **Warning:** only 2 final seed(s)" in board
    # one fold numbering: validate's split counts and the leaderboard's fingerprints name the same folds
    assert main(["validate", str(path)]) == 0
    validated = re.findall(r"^  (fold \d+): train", capsys.readouterr().out, re.MULTILINE)
    fingerprinted = re.findall(r"(fold \d+) train fingerprint", board)
    assert validated == fingerprinted == ["fold 0"]


# --------------------------------------------------------------------------- leaderboard warnings and ranges


def test_within_clips_bounded_metrics_and_marks_them() -> None:
    iv = t_interval([0.99, 0.999, 0.9])
    assert iv.high > 1.0  # a symmetric t interval near the top of the range
    clipped = within(iv, "map_at_r")
    assert (clipped.mean, clipped.low, clipped.high, clipped.clipped) == (iv.mean, iv.low, 1.0, True)
    assert within(iv, "recall_at_4").high == 1.0
    low = t_interval([-0.05, 0.01, 0.02])
    assert within(low, "ami").low == low.low and within(low, "nmi").low == 0.0
    inside = t_interval([0.4, 0.5, 0.6])
    assert within(inside, "map_at_r") == inside and not inside.clipped


def test_the_leaderboard_warns_and_never_prints_beyond_the_range(
    sweep_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seeds near 1.0 and validation scores that rank cells in reverse: clipped with a footnote, two warnings."""
    finals = pd.read_csv(sweep_copy / "finals.csv")
    cells = sorted(finals["cell"].unique())
    for rank, cell in enumerate(cells):  # test order = cells order, validation order reversed
        mask = finals["cell"] == cell
        finals.loc[mask, "map_at_r"] = [0.9 + 0.03 * rank + d for d in (0.0, 0.009, -0.09)][: int(mask.sum())]
        finals.loc[mask, "val_map_at_r"] = 0.5 - 0.1 * rank
    finals.to_csv(sweep_copy / "finals.csv", index=False)
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    md = (sweep_copy / "leaderboard.md").read_text()
    bounds = [float(b) for b in re.findall(r"\[(-?\d\.\d+), (-?\d\.\d+)\]", md) for b in b]
    assert bounds and max(bounds) <= 1.0 and min(bounds) >= 0.0
    assert "1.000]*" in md and "interval clipped to the metric's range" in md
    # three cells: a Spearman of -1 happens by chance one time in six, so it is no warning (six cells or more are)
    assert "rank correlation (Spearman) of map_at_r is" not in md


def test_fewer_than_three_seeds_warn_on_markdown_and_html(sweep_copy: Path) -> None:
    finals = pd.read_csv(sweep_copy / "finals.csv")
    finals[finals["seed"] != finals["seed"].max()].to_csv(sweep_copy / "finals.csv", index=False)
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    manifest["budget"]["seeds"] -= 1  # a protocol of one seed fewer, not a truncated table (refused otherwise)
    (sweep_copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["leaderboard", str(sweep_copy), "--quiet"]) == 0
    md = (sweep_copy / "leaderboard.md").read_text()
    assert "> **Warning:** only 2 final seed(s) in some cells (fewer than 3)" in md
    assert "only 2 final seed(s)" in (sweep_copy / "leaderboard.html").read_text()


def test_changed_data_at_the_same_path_is_a_new_version_never_the_old_table(tmp_path: Path) -> None:
    """Every image of an .npz replaced (inverted) at the same path: `run` returned the old table in a second."""
    train, test = write_npz(tmp_path / "train.npz", 4), write_npz(tmp_path / "test.npz", 3, seed=1)
    path = protocol_file(tmp_path, f"  train: npz:{train}\n  test: npz:{test}", iterations=2, seeds=1)
    results = tmp_path / "results"
    common = [
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
    assert main(["run", str(path), *common]) == 0
    first = json.loads((results / "own-data" / "manifest.json").read_text())
    again = json.loads((results / "own-data" / "manifest.json").read_text())
    assert main(["run", str(path), *common]) == 0  # unchanged data: the same version, nothing moved
    assert json.loads((results / "own-data" / "manifest.json").read_text())["created"] == again["created"]
    with np.load(train) as z:
        x, y = z["x"], z["y"]
    np.savez(train, x=255 - x, y=y)  # the same path, the same classes and split, other pixels
    assert main(["run", str(path), *common]) == 0
    second = json.loads((results / "own-data" / "manifest.json").read_text())
    assert len(first["data_fingerprint"]) == 32 and second["data_fingerprint"] != first["data_fingerprint"]
    assert second["fingerprints"]["split"] == first["fingerprints"]["split"]  # class ids alone would not tell
    assert second["created"] != first["created"] or second["data_fingerprint"] != first["data_fingerprint"]
    moved = [p for p in results.iterdir() if p.name.startswith("own-data@")]
    assert (
        len(moved) == 1
        and json.loads((moved[0] / "manifest.json").read_text())["data_fingerprint"] == first["data_fingerprint"]
    )  # the old table kept aside, never mixed
    import optuna

    names = optuna.get_all_study_names(f"sqlite:///{tmp_path}/o.db")
    assert any(first["data_fingerprint"][:8] in n for n in names) and any(
        second["data_fingerprint"][:8] in n for n in names
    )
    capsys_free = main(["regress", "--baseline", str(moved[0]), "--current", str(results / "own-data")])
    assert capsys_free == 2  # the same protocol on other samples is not one comparison


# --------------------------------------------------------------------------- classes below min_samples_per_class


def _uneven_npz(path: Path, sizes: list[int], seed: int = 0) -> Path:
    """Class i has sizes[i] samples."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(sizes)), sizes)
    np.savez(path, x=rng.integers(0, 256, (len(y), 10, 10)).astype(np.uint8), y=y)
    return path


def _small_classes_protocol(tmp_path: Path, policy: str | None) -> Path:
    train = _uneven_npz(tmp_path / "train.npz", [4, 4, 4, 4, 2, 1])
    test = _uneven_npz(tmp_path / "test.npz", [4, 4, 2], seed=1)
    key = f"\n  small_classes: {policy}" if policy else ""
    return protocol_file(
        tmp_path, f"  train: npz:{train}\n  test: npz:{test}\n  min_samples_per_class: 3{key}", seeds=2
    )


def test_classes_below_the_minimum_are_refused_by_default_and_the_default_keeps_the_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _small_classes_protocol(tmp_path, None)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs at least 3 (data.min_samples_per_class)" in err[0]
    assert "data.small_classes: drop" in err[0]
    text = path.read_text()
    assert (
        parse_protocol(
            text.replace("min_samples_per_class: 3", "min_samples_per_class: 3\n  small_classes: refuse")
        ).hash
        == parse_protocol(text).hash
    )
    assert (
        parse_protocol(text.replace("min_samples_per_class: 3", "min_samples_per_class: 3\n  small_classes: drop")).hash
        != parse_protocol(text).hash
    )


def test_classes_below_the_minimum_are_dropped_counted_said_once_and_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = _small_classes_protocol(tmp_path, "drop")
    notice = "left out 2 of 6 train classes and 1 of 3 test classes with fewer than 3 samples (the smallest 1; data.small_classes: drop)"
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "train 4 classes, 16 samples" in out.replace(f"npz:{tmp_path / 'train.npz'}: ", "")
    assert f"  {notice}" in out.splitlines()
    prepared = prepare(parse_protocol(path.read_text()))
    assert sorted(prepared.train_split.classes) == [0, 1, 2, 3] and len(prepared.test) == 8
    assert prepared.small_classes == {
        "min_samples": 3,
        "train": {"dropped": 2, "of": 6, "smallest": 1},
        "test": {"dropped": 1, "of": 3, "smallest": 2},
    }
    caplog.set_level("INFO", logger="dmlbench")
    results = tmp_path / "results"
    args = ["--results-dir", str(results), "--storage", f"sqlite:///{tmp_path}/o.db"]
    args += ["--tracking-uri", str(tmp_path / "mlflow.db"), "--threads", "1", "--quiet"]
    assert main(["run", str(path), *args]) == 0
    assert [r.getMessage() for r in caplog.records if "left out" in r.getMessage()] == [notice]
    manifest = json.loads((results / "own-data" / "manifest.json").read_text())
    assert manifest["small_classes"] == prepared.small_classes


def test_a_second_run_on_the_same_stores_says_it_trained_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A user making a 'current' table for regress with the stores of the baseline gets the baseline's numbers
    back: the run says so, and how to train anew."""
    train, test = write_npz(tmp_path / "train.npz", 4), write_npz(tmp_path / "test.npz", 3, seed=1)
    path = protocol_file(tmp_path, f"  train: npz:{train}\n  test: npz:{test}", iterations=2, seeds=2)
    stores = ["--storage", f"sqlite:///{tmp_path}/o.db", "--tracking-uri", str(tmp_path / "mlflow.db")]
    caplog.set_level("INFO", logger="dmlbench")
    for folder in ("first", "second"):
        caplog.clear()
        assert main(["run", str(path), "--results-dir", str(tmp_path / folder), *stores, "--threads", "1"]) == 0
        said = [r.getMessage() for r in caplog.records if "in the records" in r.getMessage()]
        if folder == "first":
            assert said == []
    assert said == [
        f"nothing trained now: all 6 iterations were already in the records (sqlite:///{tmp_path}/o.db); "
        "to train anew, give another --storage and --tracking-uri"
    ]
