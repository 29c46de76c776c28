"""scripts/rehearse_sop_eval.py: its SOP-shaped folder reads as SOP with SOP's counts per product, its protocol
is the real one with BN-Inception explicitly at random, and its run scores one floor seed and prints plan's
estimate beside the measured time."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _shared import load_script

from bench.data.sop import read_sop

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "rehearse_sop_eval.py"


def _script():  # type: ignore[no-untyped-def]
    return load_script("scripts/rehearse_sop_eval.py")


def test_product_counts_are_sops() -> None:
    script = _script()
    for products, images in (script.TRAIN, script.TEST, (5, 10), (5, 60)):
        counts = script.product_counts(products, images, random.Random(1))
        assert len(counts) == products and sum(counts) == images
        assert min(counts) >= 2 and max(counts) <= 12


def test_generated_folder_reads_as_sop(tmp_path: Path) -> None:
    script = _script()
    assert script.generate(tmp_path, train=(6, 20), test=(4, 13)) == {"test": 13, "train": 20}
    train, test = read_sop(tmp_path, "train"), read_sop(tmp_path, "test")
    assert len(train.paths) == 20 and len(test.paths) == 13
    assert len(set(test.labels)) == 4 and len(set(train.labels)) == 6
    assert not set(train.labels) & set(test.labels)  # products are disjoint across the split, as published
    folder = tmp_path / "Stanford_Online_Products"
    test_inodes = {(folder / p).stat().st_ino for p in test.paths}
    assert {(folder / p).stat().st_ino for p in train.paths} <= test_inodes  # train files: links, no new pixels


def test_rehearsal_protocol_is_the_real_one_at_random_init() -> None:
    script = _script()
    spec = script.rehearsal_protocol("cpu")
    real = yaml.safe_load((ROOT / "protocols" / "reality-check-sop.yaml").read_text())
    assert "REHEARSAL" in spec["name"] and spec["model"]["pretrained"] is None
    assert spec["training"]["device"] == "cpu"
    for key in ("data", "evaluation", "grid", "final"):
        assert spec[key] == real[key]


@pytest.mark.slow
def test_run_scores_a_floor_seed_and_prints_plan(tmp_path: Path) -> None:
    script = _script()
    script.generate(tmp_path, train=(40, 100), test=(30, 70))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path), "--run", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["test_images"] == 70 and report["measured_over_plan"] is None  # plan sizes SOP as published
    assert report["eval_s"] > 0 and report["plan_eval_s"] > 0
    assert 0.0 <= report["metrics"]["map_at_r"] <= 1.0
    assert report["peak"]["process_mb"] > 0
