"""The field's shipped protocols, each shrunk to a tiny variant, run through `dmlbench run` on a fixture in
the publisher's layout to a leaderboard (issue 10: "a tiny variant of each runs on its fixture").

The variant is derived from the shipped file, not written beside it, so what runs here is that protocol's
data specs, pipelines (every size / 4), trunk family, BatchNorm and LR settings, loss, miner, schedule and
metrics; only the scale changes: ResNet-18 from random weights instead of a pretrained ResNet-50 (BN-Inception
from random weights at 64x64, a side its stride-2 blocks take), the CPU, two iterations, one trial, one seed,
one cell.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from datasets_fixtures import tiny, write_cars, write_cub, write_inshop, write_market, write_sop

from bench.cli import main

REPO = Path(__file__).resolve().parents[2]

FIXTURES: dict[str, Callable[[Path], Any]] = {
    "reality-check-cub": lambda root: write_cub(root, classes=(1, 2, 3, 4, 101, 102, 103), per_class=4),
    "reality-check-cars": lambda root: write_cars(root, classes=(1, 2, 3, 4, 99, 100, 196), per_class=4),
    "reality-check-sop": lambda root: write_sop(root, train_products=4, test_products=3, per_product=4),
    "inshop": lambda root: write_inshop(root, train_items=(1, 4, 5, 6, 8), test_items=(2, 3, 7)),
    "market1501-batch-hard": lambda root: write_market(root, train_ids=(2, 7, 11, 12, 13), test_ids=(1, 3, 5)),
}


RETRAINED = [(name, "retrain") for name in FIXTURES if name.startswith("reality-check-")]


@pytest.mark.slow
@pytest.mark.parametrize("name, mode", [(name, None) for name in FIXTURES] + RETRAINED)
def test_a_tiny_variant_of_each_field_protocol_runs_on_its_fixture(name: str, mode: str | None, tmp_path: Path) -> None:
    """As shipped (the Reality Check's protocols: early stopping, `final.mode: folds`), and the Reality
    Check's in the other final mode too."""
    shipped = yaml.safe_load((REPO / "protocols" / f"{name}.yaml").read_text())
    if mode is not None:
        shipped["final"]["mode"] = mode
    doc = tiny(shipped)
    FIXTURES[name](tmp_path / "data")
    protocol = tmp_path / "p.yaml"
    protocol.write_text(yaml.safe_dump(doc))
    runs, results = tmp_path / "runs", tmp_path / "results"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DMLBENCH_DATA", str(tmp_path / "data"))
        patch.chdir(tmp_path)
        assert main(["validate", str(protocol), "--quiet"]) == 0
        assert (
            main(
                [
                    "run",
                    str(protocol),
                    "--results-dir",
                    str(results),
                    "--storage",
                    f"sqlite:///{runs / 'optuna.db'}",
                    "--tracking-uri",
                    str(runs / "mlflow.db"),
                    "--threads",
                    "1",
                    "--quiet",
                ]
            )
            == 0
        )
    folder = results / doc["name"]
    assert main(["leaderboard", str(folder), "--quiet"]) == 0
    board = (folder / "leaderboard.md").read_text()
    cell = f"{doc['grid']['losses'][0].get('label', doc['grid']['losses'][0]['name'])}+{doc['grid']['losses'][0]['miners'][0]}"
    names = [f"{cell}:concatenated", f"{cell}:separate"] if doc["final"].get("mode") == "folds" else [cell]
    for shown in names:  # ranked 1 and 2: two evaluations of the one cell
        assert re.search(rf"^\| [12] \| `{re.escape(shown)}` \| 1 \| \d\.\d{{3}} ", board, re.MULTILINE), board
    header = next(line for line in board.splitlines() if line.startswith("| rank"))
    for metric in doc["evaluation"]["metrics"]:
        if metric in ("recall_at_k", "cmc_at_k"):
            for k in doc["evaluation"]["ks"]:
                assert f"{metric[:-2]}_{k}" in header or f"{metric[:-1]}{k}" in header, (metric, header)
        else:
            assert metric in header, (metric, header)


def test_a_non_square_image_size_needs_both_pipelines() -> None:
    """[height, width] is for image files whose pipelines end there; [s, s] is s (one meaning, one hash)."""
    from bench.protocol import ProtocolError, parse_protocol

    doc = tiny(yaml.safe_load((REPO / "protocols" / "market1501-batch-hard.yaml").read_text()))
    assert doc["data"]["image_size"] == [64, 32]
    parse_protocol(yaml.safe_dump(doc))
    del doc["data"]["augment"]["eval"]
    with pytest.raises(ProtocolError, match=r"data\.image_size: 64x32 is not square: only image files with both"):
        parse_protocol(yaml.safe_dump(doc))
    square = yaml.safe_load((REPO / "protocols" / "reality-check-cub.yaml").read_text())
    as_list = dict(square, data=dict(square["data"], image_size=[227, 227]))
    assert parse_protocol(yaml.safe_dump(as_list)).hash == parse_protocol(yaml.safe_dump(square)).hash
