"""scripts/rehearse_cub.py: its CUB-shaped folder reads as CUB, and its protocol is the real one, labelled a
rehearsal, with BN-Inception explicitly at random initialisation."""

from __future__ import annotations

from pathlib import Path

import yaml
from _shared import load_script
from PIL import Image

from bench.data.cub import read_cub200
from bench.protocol import load_protocol

ROOT = Path(__file__).resolve().parents[1]


def _script():  # type: ignore[no-untyped-def]
    return load_script("scripts/rehearse_cub.py")


def test_generated_folder_reads_as_cub(tmp_path: Path) -> None:
    script = _script()
    assert sum(script.TRAIN_COUNTS) == 5864 and sum(script.TEST_COUNTS) == 5924  # CUB's split sizes
    n = script.generate(tmp_path, counts=[1] * 100 + [2, 1])
    assert n == 103
    train, test = read_cub200(tmp_path, "train"), read_cub200(tmp_path, "test")
    assert len(train.paths) == 100 and len(test.paths) == 3
    assert sorted(set(test.labels)) == [100, 101]
    folder = tmp_path / "CUB_200_2011"
    for file in ("train_test_split.txt", "classes.txt", "bounding_boxes.txt"):
        assert len((folder / file).read_text().splitlines()) == (102 if file == "classes.txt" else 103)
    with Image.open(folder / test.paths[0]) as img:
        assert max(img.size) == 500 and 250 <= min(img.size) <= 500


def test_rehearsal_protocol_is_the_real_one_labelled(tmp_path: Path) -> None:
    script = _script()
    spec = script.rehearsal_protocol(300, 100, "cpu", "contrastive")
    real = yaml.safe_load((ROOT / "protocols" / "reality-check-cub.yaml").read_text())
    assert "REHEARSAL" in spec["name"] and "REHEARSAL" in spec["description"]
    assert spec["model"]["pretrained"] is None and real["model"]["pretrained"] == "hub"
    assert spec["data"]["train"] == real["data"]["train"] and spec["data"]["augment"] == real["data"]["augment"]
    assert spec["data"]["image_size"] == 227 and spec["model"]["trunk"] == "bninception"
    assert [m["name"] for m in spec["grid"]["losses"]] == ["contrastive"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec))
    protocol = load_protocol(path)  # a valid protocol: the folds mode with two folds in use, one trial
    assert protocol.name == script.NAME and protocol.doc["final"]["mode"] == "folds"
    assert protocol.doc["training"]["early_stopping"]["check_every"] == 100
