"""Inputs that used to be accepted with a wrong result (issue 12) and that the corpus format cannot
express (symbolic links), through `bench.cli.main` as a user would meet them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.cli import main

PROTOCOL = """name: folders
data:
  train: folder:{train}
  test: folder:{test}
  image_size: 16
  validation: {{folds: 2, use: 1}}
model: {{trunk: conv4, embedding_dim: 8, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 2}}
evaluation: {{metrics: [map_at_r], primary: map_at_r}}
tuning: {{trials: 1}}
final: {{seeds: 1}}
grid:
  losses:
    - {{name: triplet, miners: [none]}}
"""


def _folder(root: Path, classes: list[str]) -> Path:
    for i, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for j in range(3):
            Image.fromarray(np.full((16, 16), 40 * i + 10 * j, dtype=np.uint8)).save(root / name / f"{j}.png")
    return root


def _run(tmp_path: Path, train: Path, test: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    protocol = tmp_path / "p.yaml"
    protocol.write_text(PROTOCOL.format(train=train, test=test))
    code = main(
        [
            "run",
            str(protocol),
            "--results-dir",
            str(tmp_path / "results"),
            "--storage",
            f"sqlite:///{tmp_path / 'o.db'}",
            "--tracking-uri",
            str(tmp_path / "m.db"),
            "--quiet",
        ]
    )
    return code, capsys.readouterr().err


@pytest.mark.parametrize("where", ["class", "image"])
def test_a_looping_symlink_in_folder_data_is_named(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link to itself is neither a folder nor a file: it was skipped without a word (a class or an
    image silently left out). Now the run stops with one line naming it, before any record."""
    train = _folder(tmp_path / "train", ["a", "b", "c", "d"])
    test = _folder(tmp_path / "test", ["e", "f", "g"])
    loop = train / "loop" if where == "class" else train / "a" / "loop.png"
    os.symlink(loop.name, loop)
    code, err = _run(tmp_path, train, test, capsys)
    assert code == 2
    assert "symbolic link" in err and str(loop) in err and "Traceback" not in err
    assert not (tmp_path / "o.db").exists() and not (tmp_path / "m.db").exists()


def test_a_dangling_symlink_is_named_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = _folder(tmp_path / "train", ["a", "b", "c"])
    test = _folder(tmp_path / "test", ["e", "f", "g"])
    os.symlink(tmp_path / "nowhere", train / "b" / "gone.png")
    code, err = _run(tmp_path, train, test, capsys)
    assert code == 2 and "gone.png" in err and "points nowhere" in err
