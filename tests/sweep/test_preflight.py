"""One pre-flight (bench.sweep.preflight): whatever `run` refuses before training, `validate` refuses too, in
the same words; a device this machine lacks is the one exception, a note of `validate` (the file is valid).

Each case is a broken protocol or store built here, run through the command line twice: `run` with the
options that break it, then `validate` with the same file and store options.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import torch

from bench.cli import main
from bench.errors import BenchError
from bench.protocol import load_protocol, parse_protocol
from bench.sweep import preflight

TINY = """\
name: tiny
seed: 0
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 8
  test_classes: 6
  image_size: 12
  validation: {folds: 2, use: 1}
model: {trunk: mlp, trunk_params: {hidden: [16]}, embedding_dim: 8, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 4, K: 4, iterations: 4}
evaluation: {metrics: [precision_at_1, map_at_r, recall_at_k], primary: map_at_r, ks: [1, 2]}
tuning: {trials: 1}
final: {seeds: 1}
grid:
  losses:
    - {name: triplet, miners: [none]}
"""


def _edit(old: str, new: str) -> str:
    assert old in TINY
    return TINY.replace(old, new)


def _emptied(tmp: Path) -> list[str]:
    """Results of this very protocol with finals, beside an empty storage: a mistyped --storage."""
    results = tmp / "results" / "tiny"
    results.mkdir(parents=True)
    protocol = load_protocol(tmp / "p.yaml")
    from bench.plan import cell_key, plan

    keys = {c.id: cell_key(protocol, c) + ".0123abcd" for c in plan(protocol).cells}  # studies on any data
    manifest = {"protocol": "tiny", "protocol_hash": protocol.hash, "shared_hash": protocol.shared_hash}
    (results / "manifest.json").write_text(json.dumps({**manifest, "cell_keys": keys}))
    (results / "finals.csv").write_text("cell,seed\ntriplet+none,0\n")
    return []


def _swapped(tmp: Path) -> list[str]:
    """An MLflow database given as the Optuna storage."""
    with sqlite3.connect(tmp / "mlflow-made.db") as db:
        for table in ("experiments", "runs", "metrics", "params"):
            db.execute(f"CREATE TABLE {table} (id INTEGER)")
    return ["--storage", f"sqlite:///{tmp / 'mlflow-made.db'}"]


OWN_DATA = "  train: 'SPEC:{tmp}/tr'\n  test: 'SPEC:{tmp}/te'\n"


def _own(spec: str, text: str = TINY) -> str:
    """TINY on data of one's own: ``folder:`` or ``npz:`` files the case's setup writes (8 + 6 classes)."""
    old = "  train: omniglot:background\n  test: omniglot:evaluation\n"
    assert old in text
    return text.replace(old, OWN_DATA.replace("SPEC", spec))


def _folders(tmp: Path) -> None:
    """8 training and 6 test classes of five 12 x 12 JPEGs each."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for side, classes in (("tr", 8), ("te", 6)):
        for c in range(classes):
            (tmp / side / f"c{c}").mkdir(parents=True)
            for i in range(5):
                pixels = rng.integers(0, 256, (12, 12, 3)).astype(np.uint8)
                Image.fromarray(pixels).save(tmp / side / f"c{c}" / f"{i}.jpg", quality=90)


def _truncated(tmp: Path) -> list[str]:
    """A JPEG cut short after its header (an interrupted copy): its header reads, its pixels do not."""
    _folders(tmp)
    file = tmp / "tr" / "c3" / "2.jpg"
    file.write_bytes(file.read_bytes()[:-40])
    return []


def _wide_values(tmp: Path) -> list[str]:
    """A 32-bit integer TIFF holding 12-bit values beside the JPEGs."""
    import numpy as np
    from PIL import Image

    _folders(tmp)
    Image.fromarray(np.full((12, 12), 4095, np.int32)).save(tmp / "tr" / "c2" / "5.tif")
    return []


def _arrays(shape: tuple[int, ...]):  # noqa: ANN202
    def write(tmp: Path) -> list[str]:
        import numpy as np

        rng = np.random.default_rng(0)
        for side, classes in (("tr", 8), ("te", 6)):
            x = rng.integers(0, 256, (classes * 5, *shape)).astype(np.uint8)
            np.savez(tmp / side, x=x if len(shape) > 1 else x.astype(np.float32), y=np.repeat(np.arange(classes), 5))
            (tmp / f"{side}.npz").rename(tmp / side)
        return []

    return write


CONV4 = TINY.replace("{trunk: mlp, trunk_params: {hidden: [16]},", "{trunk: conv4,").replace(
    "image_size: 12", "image_size: 16"
)

# name: (protocol text, what sets the case up and returns the store options it needs, a word of the refusal)
CASES = {
    "weights-file-missing": (
        _edit("normalize: true}", "normalize: true, pretrained: '{tmp}/absent.pth'}"),
        None,
        "absent.pth not found",
    ),
    "ks-beyond-the-test-set": (_edit("ks: [1, 2]", "ks: [1, 500]"), None, "evaluation.ks: k=500"),
    "P-beyond-the-classes-of-a-fold": (_edit("P: 4, K: 4", "P: 9, K: 4"), None, "P"),
    "data-file-missing": (
        _edit("train: omniglot:background", "train: 'npz:{tmp}/absent.npz'"),
        None,
        "absent.npz does not exist",
    ),
    "fp16-on-the-cpu": (
        _edit("iterations: 4}", "iterations: 4, precision: fp16}"),
        None,
        "training.precision: fp16 needs a CUDA device",
    ),
    "device-not-a-device": (
        _edit("iterations: 4}", "iterations: 4, device: gpu0}"),
        None,
        "training.device: unknown device 'gpu0'",
    ),
    "dead-search-parameter": (
        TINY.replace(
            "    - {name: triplet, miners: [none]}\n",
            "    - {name: triplet, miners: [offline]}\n  miners:\n    - name: offline\n"
            "      params: {triplets_per_batch: 4}\n"
            "      search_space: {chunk_size: {type: int, low: 4, high: 64}}\n",
        ),
        None,
        "dead search parameters",
    ),
    "blank-storage": (TINY, lambda tmp: ["--storage", ""], "--storage is empty"),
    "blank-tracking-uri": (TINY, lambda tmp: ["--tracking-uri", " "], "--tracking-uri is empty"),
    "one-database-for-both-stores": (
        TINY,
        lambda tmp: ["--storage", f"sqlite:///{tmp / 'one.db'}", "--tracking-uri", str(tmp / "one.db")],
        "the same database",
    ),
    "stores-swapped": (TINY, _swapped, "were --storage and --tracking-uri swapped"),
    "storage-emptied-beside-results": (TINY, _emptied, "has none of its studies"),
    "K-above-the-images-of-a-class": (
        _edit("P: 4, K: 4", "P: 4, K: 24, short_classes: refuse"),
        None,
        "training.short_classes: 8 of 8 training classes have fewer than K=24 images (the smallest 20)",
    ),
    "truncated-image-in-a-folder": (_own("folder"), _truncated, "image file is truncated"),
    "mode-I-values-beyond-8-bit": (_own("folder"), _wide_values, "mode I image holds values 4095..4095"),
    "flat-vectors-for-conv4": (_own("npz", CONV4), _arrays((1024,)), "model.trunk: trunk 'conv4' needs images"),
    "channels-last-npz": (_own("npz"), _arrays((12, 12, 3)), "looks channels-last"),
    "results-dir-a-file": (
        TINY,
        lambda tmp: (tmp / "afile").write_text("x") and ["--results-dir", str(tmp / "afile" / "results")],
        "is a file, not a folder",
    ),
}


def _store_args(tmp: Path) -> list[str]:
    return [
        "--storage",
        f"sqlite:///{tmp / 'runs' / 'optuna.db'}",
        "--tracking-uri",
        str(tmp / "runs" / "mlflow.db"),
        "--results-dir",
        str(tmp / "results"),
    ]


def _merge(base: list[str], given: list[str]) -> list[str]:
    """The case's store options replace the defaults of the same name."""
    pairs = dict(zip(base[::2], base[1::2]))
    pairs.update(zip(given[::2], given[1::2]))
    return [x for kv in pairs.items() for x in kv]


def _error_lines(err: str) -> list[str]:
    return [line.removeprefix("dmlbench: error: ") for line in err.splitlines() if line.startswith("dmlbench: error:")]


@pytest.mark.parametrize("name", CASES)
def test_what_run_refuses_validate_refuses_in_the_same_words(
    name: str, tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text, setup, words = CASES[name]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text(text.replace("{tmp}", str(tmp_path)))
    stores = _merge(_store_args(tmp_path), setup(tmp_path) if setup else [])
    capsys.readouterr()
    assert (
        main(["run", str(tmp_path / "p.yaml"), "--data-root", str(data_root), "--quiet", "--threads", "1", *stores])
        == 2
    )
    refused = _error_lines(capsys.readouterr().err)
    assert len(refused) == 1 and words in refused[0], refused
    assert main(["validate", str(tmp_path / "p.yaml"), "--data-root", str(data_root), *stores]) == 2
    listed = _error_lines(capsys.readouterr().err)
    assert refused[0] in listed or refused[0].split(" (and ")[0] in listed, (refused, listed)
    assert not (tmp_path / "runs").exists()  # neither wrote a store


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_a_device_this_machine_lacks_is_refused_by_run_and_noted_by_validate(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p.yaml").write_text(_edit("iterations: 4}", "iterations: 4, device: 'cuda:1'}"))
    stores = _store_args(tmp_path)
    capsys.readouterr()
    assert main(["run", str(tmp_path / "p.yaml"), "--data-root", str(data_root), "--quiet", *stores]) == 2
    refused = _error_lines(capsys.readouterr().err)
    assert refused == ["tiny: training.device: 'cuda:1' but no CUDA device is available on this machine"]
    assert main(["validate", str(tmp_path / "p.yaml"), "--data-root", str(data_root), *stores]) == 0
    err = capsys.readouterr().err
    assert f"dmlbench: note: {tmp_path / 'p.yaml'}: {refused[0]}: `dmlbench run` refuses it here" in err
    assert not (tmp_path / "runs").exists()


def test_problems_lists_every_problem_with_its_key(tmp_path: Path, data_root: Path) -> None:
    """Independent problems are all found; a check that needs a failed one (ks without data) is skipped."""
    text = _edit("normalize: true}", f"normalize: true, pretrained: '{tmp_path}/absent.pth'}}").replace(
        "ks: [1, 2]", "ks: [1, 500]"
    )
    protocol = parse_protocol(text, str(tmp_path / "p.yaml"))
    found = preflight.problems(
        protocol, data_root=str(data_root), stores=True, storage="", results_dir=tmp_path / "results"
    )
    assert [p.key for p in found] == ["--storage", "model.pretrained", "evaluation.ks"]
    assert all("\n" not in p.message and not p.note for p in found)
    missing = parse_protocol(text.replace("omniglot:background", f"npz:{tmp_path}/absent.npz"))
    assert [p.key for p in preflight.problems(missing, data_root=str(data_root))] == ["model.pretrained", "data"]
    with pytest.raises(BenchError, match="--storage is empty"):
        preflight.refuse(protocol, data_root=str(data_root), stores=True, storage="")
    assert not (tmp_path / "results").exists()


def test_a_clean_protocol_has_no_problem_and_its_data_are_loaded_once(data_root: Path) -> None:
    found = preflight.inspect(parse_protocol(TINY), data_root=str(data_root))
    assert found.problems == [] and found.plan is not None and found.prepared is not None
    assert [c.id for c in found.plan.cells] == ["triplet+none"]


BROKEN_METHODS = """\
import torch
from bench.registry import register


@register("loss", "broken_loss", tuples="triplets")
class BrokenLoss(torch.nn.Module):
    def forward(self, embeddings, labels, indices_tuple=None):
        raise RuntimeError("boom")


@register("miner", "broken_miner", tuples="triplets")
class BrokenMiner:
    def __call__(self, embeddings, labels):
        return embeddings[:, 0] @ torch.ones(3)  # a shape error
"""


def test_a_method_that_raises_is_refused_before_anything_is_spent(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each cell's loss and miner run one step on a random batch: one problem per broken cell, naming the method."""
    import sys

    from bench.registry import _lookup

    plugin = tmp_path / "broken_methods.py"
    plugin.write_text(BROKEN_METHODS)
    text = TINY.replace(
        "    - {name: triplet, miners: [none]}\n",
        "    - {name: triplet, miners: [none, broken_miner]}\n"
        "    - {name: broken_loss, miners: [none]}\n"
        "  miners: [{name: none}, {name: broken_miner}]\n",
    )
    (tmp_path / "p.yaml").write_text(text)
    stores = _store_args(tmp_path)
    try:
        capsys.readouterr()
        assert (
            main(
                ["--plugin", str(plugin), "validate", str(tmp_path / "p.yaml"), "--data-root", str(data_root), *stores]
            )
            == 2
        )
        listed = _error_lines(capsys.readouterr().err)
        assert len(listed) == 2 and listed[0].startswith(
            "tiny: grid.triplet+broken_miner: miner broken_miner raised RuntimeError: inconsistent tensor size"
        )
        assert listed[1] == "tiny: grid.broken_loss+none: loss broken_loss raised RuntimeError: boom"
        assert (
            main(
                [
                    "--plugin",
                    str(plugin),
                    "run",
                    str(tmp_path / "p.yaml"),
                    "--data-root",
                    str(data_root),
                    "--quiet",
                    *stores,
                ]
            )
            == 2
        )
        refused = _error_lines(capsys.readouterr().err)
        assert refused == listed[:1]
        assert not (tmp_path / "runs").exists()
        found = preflight.problems(parse_protocol(text), data_root=str(data_root))
        assert [p.key for p in found] == ["grid.triplet+broken_miner", "grid.broken_loss+none"]
    finally:
        for key in [k for k in _lookup._REGISTERED if k[1].startswith("broken_")]:
            del _lookup._REGISTERED[key]
        sys.modules.pop("dmlbench_plugin_broken_methods", None)


def test_every_cell_of_the_shipped_protocols_passes_the_method_check() -> None:
    """The built-in methods (dataset-level miners' losses among them) run a step on every shipped protocol's shape."""
    from bench.plan import plan
    from bench.plan.method_cost import check_cell

    root = Path(__file__).resolve().parents[2] / "protocols"
    for path in sorted(root.glob("*.yaml")):
        protocol = load_protocol(path)
        for cell in plan(protocol).cells:
            assert check_cell(protocol, cell) is None, (path.name, cell.id)


def test_classes_below_K_are_drawn_with_replacement_said_once_and_recorded(
    tmp_path: Path, data_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The default, `repeat`: no problem, one notice, the count in the manifest; a protocol that leaves the key
    out and one that writes the default have one hash."""
    text = _edit("P: 4, K: 4", "P: 4, K: 24")
    protocol = parse_protocol(text)
    assert parse_protocol(_edit("P: 4, K: 4", "P: 4, K: 24, short_classes: repeat")).hash == protocol.hash
    assert parse_protocol(_edit("P: 4, K: 4", "P: 4, K: 24, short_classes: refuse")).hash != protocol.hash
    found = preflight.inspect(protocol, data_root=str(data_root))
    assert found.problems == []
    assert found.sampler == {"K": 24, "policy": "repeat", "classes": 8, "short_classes": 8, "smallest": 20}
    assert preflight.inspect(parse_protocol(TINY), data_root=str(data_root)).sampler["short_classes"] == 0
    (tmp_path / "p.yaml").write_text(text)
    caplog.set_level("INFO", logger="dmlbench")
    assert (
        main(
            [
                "run",
                str(tmp_path / "p.yaml"),
                "--data-root",
                str(data_root),
                "--quiet",
                "--threads",
                "1",
                *_store_args(tmp_path),
            ]
        )
        == 0
    )
    notices = [r.getMessage() for r in caplog.records if "drawn with replacement" in r.getMessage()]
    assert notices == [
        "8 of 8 training classes have fewer than K=24 images (the smallest 20): drawn with "
        "replacement (training.short_classes: repeat)"
    ]
    manifest = json.loads((tmp_path / "results" / "tiny" / "manifest.json").read_text())
    assert manifest["sampler"] == found.sampler


def test_validate_says_what_run_says_of_K_above_every_class(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """K = 24 above each class's 20 images: `run` draws them with replacement and says so; `validate` says the
    same line, so it is known before anything trains (under `refuse` both refuse: the case above)."""
    (tmp_path / "p.yaml").write_text(_edit("P: 4, K: 4", "P: 4, K: 24"))
    capsys.readouterr()
    assert main(["validate", str(tmp_path / "p.yaml"), "--data-root", str(data_root)]) == 0
    assert (
        "  8 of 8 training classes have fewer than K=24 images (the smallest 20): drawn with replacement "
        "(training.short_classes: repeat)"
    ) in capsys.readouterr().out.splitlines()
    (tmp_path / "p.yaml").write_text(TINY)
    assert main(["validate", str(tmp_path / "p.yaml"), "--data-root", str(data_root)]) == 0
    assert "drawn with replacement" not in capsys.readouterr().out
