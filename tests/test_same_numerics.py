"""scripts/same_numerics.py: a checkout trains as itself, a copy whose training differs is told apart."""

from __future__ import annotations

import shutil
from pathlib import Path

from _shared import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_the_same_code_is_the_same_and_changed_training_is_told_apart(tmp_path, data_root, capsys) -> None:
    script = load_script("scripts/same_numerics.py")
    changed = tmp_path / "changed"
    shutil.copytree(ROOT / "bench", changed / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    training = changed / "bench" / "training.py"
    text = training.read_text()
    # Adam's first step a hair larger: every later number moves
    assert text.count("optimizer.step()") == 1
    training.write_text(
        text.replace(
            "optimizer.step()", "optimizer.param_groups[0]['lr'] *= 1.0000001\n                optimizer.step()"
        )
    )
    common = ["--data-root", str(data_root), "--iterations", "3"]
    assert script.main([str(ROOT), str(ROOT), *common]) == 0
    assert capsys.readouterr().out.count(": same ") == 3
    assert script.main([str(ROOT), str(changed), *common]) == 1
    assert "DIFFERENT" in capsys.readouterr().out
    assert script.main([str(ROOT), str(tmp_path / "nothing"), *common]) == 2
