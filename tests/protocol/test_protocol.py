"""Protocol files: schema and registry errors name file, line and key path; the hash means the content."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _shared import MINIMAL

from bench.cli import main
from bench.protocol import ProtocolError, load_protocol, parse_protocol

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "protocols").glob("*.yaml"))


def _write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _problems(tmp_path: Path, text: str) -> list[str]:
    path = _write(tmp_path, text)
    with pytest.raises(ProtocolError) as info:
        load_protocol(path)
    assert str(path) in str(info.value)
    return info.value.problems


def test_minimal_protocol_loads_with_defaults_filled_in():
    p = parse_protocol(MINIMAL, "tiny.yaml")
    assert p.name == "tiny" and len(p.hash) == 64 and p.hash12 == p.hash[:12]
    assert p.final_seeds == [0]
    assert p.doc["data"]["validation"]["use"] == 3  # every fold unless told
    assert p.doc["tuning"]["pruner"] == {"type": "none"}
    assert p.doc["grid"]["losses"][0]["search_space"]["margin"] == {
        "type": "float",
        "low": 0.05,
        "high": 0.5,
        "log": False,
    }


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_protocols_are_valid(path: Path):
    protocol = load_protocol(path)
    assert protocol.name == path.stem


def test_missing_key_names_file_line_and_path(tmp_path):
    text = MINIMAL.replace("  test: omniglot:evaluation\n", "")
    problems = _problems(tmp_path, text)
    assert len(problems) == 1
    assert problems[0] == f"{tmp_path / 'p.yaml'}:2: data.test: missing: a required key"


def test_wrong_type_says_what_was_expected(tmp_path):
    problems = _problems(tmp_path, MINIMAL.replace("tuning: {trials: 1}", "tuning: {trials: two}"))
    assert problems == [f"{tmp_path / 'p.yaml'}:12: tuning.trials: expected an integer, got 'two'"]


def test_unknown_key_lists_the_allowed_ones(tmp_path):
    problems = _problems(tmp_path, MINIMAL.replace("normalize: true", "normalise: true"))
    assert any("model: unknown key 'normalise': expected one of" in p and "normalize" in p for p in problems)


def test_unknown_loss_name(tmp_path):
    problems = _problems(tmp_path, MINIMAL.replace("name: triplet", "name: tripplet"))
    assert len(problems) == 1
    assert f"{tmp_path / 'p.yaml'}:16: grid.losses[0].name: unknown loss 'tripplet'" in problems[0]
    assert "expected one of contrastive, triplet" in problems[0]


def test_unknown_parameter_in_search_space(tmp_path):
    problems = _problems(tmp_path, MINIMAL.replace("margin: {type", "margn: {type"))
    assert len(problems) == 1
    assert problems[0].startswith(
        f"{tmp_path / 'p.yaml'}:18: grid.losses[0].search_space.margn: "
        "loss 'triplet' has no parameter 'margn': expected one of margin"
    )


def test_bad_distribution_and_bad_fixed_value(tmp_path):
    text = MINIMAL.replace("low: 0.05, high: 0.5", "low: 0.5, high: 0.05").replace(
        "    - name: triplet\n", "    - name: triplet\n      params: {distance: manhattan}\n"
    )
    problems = _problems(tmp_path, text)
    assert any("search_space.margin: expected low <= high" in p for p in problems)
    assert any(
        "grid.losses[0].params: distance must be one of" in p or ("grid.losses[0].params" in p and "manhattan" in p)
        for p in problems
    )


def test_overlapping_explicit_classes_are_refused(tmp_path):
    text = (
        MINIMAL.replace("test: omniglot:evaluation", "test: omniglot:background")
        .replace("train_classes: 12", "train_classes: [1, 2, 3, 4]")
        .replace("test_classes: 6", "test_classes: [4, 5]")
    )
    problems = _problems(tmp_path, text)
    assert any(
        "data.test_classes: test classes must be unseen in training; shared with train_classes: 4" in p
        for p in problems
    )


def test_duplicate_keys_and_code_tags_are_refused(tmp_path):
    dup = _problems(tmp_path, MINIMAL.replace("name: tiny\n", "name: tiny\nname: other\n"))
    assert dup == [f"{tmp_path / 'p.yaml'}:2: not valid YAML: duplicate key 'name' (first at line 1)"]
    code = _problems(tmp_path, MINIMAL.replace("name: tiny", "name: !!python/object/apply:os.system ['true']"))
    assert "not valid YAML" in code[0]


def test_hash_ignores_layout_order_comments_and_explicit_defaults():
    base = parse_protocol(MINIMAL)
    doc = yaml.safe_load(MINIMAL.replace("1.0e-3", "0.001"))
    reordered = yaml.safe_dump(dict(reversed(list(doc.items()))), default_flow_style=False)
    assert parse_protocol("# a comment\n" + reordered).hash == base.hash
    explicit = (
        MINIMAL.replace("tuning: {trials: 1}", "tuning: {trials: 1, pruner: {type: none}}")
        .replace("final: {seeds: 1}", "final: {seeds: [0]}")
        .replace("lr: 1.0e-3", "lr: 1.0e-3, weight_decay: 0")
    )
    assert parse_protocol(explicit).hash == base.hash


def test_hash_changes_with_any_value():
    base = parse_protocol(MINIMAL).hash
    for old, new in [
        ("iterations: 5", "iterations: 6"),
        ("low: 0.05", "low: 0.06"),
        ("seeds: 1", "seeds: 2"),
        ("train_classes: 12", "train_classes: 13"),
        ("name: batch_hard", "name: batch_all"),
    ]:
        assert old in MINIMAL
        assert parse_protocol(MINIMAL.replace(old, new)).hash != base, old


def test_validate_command_prints_every_problem_and_fails(tmp_path, capsys):
    good = _write(tmp_path, MINIMAL, "good.yaml")
    assert main(["validate", str(good)]) == 0
    assert f"{good}: ok, protocol tiny, hash {load_protocol(good).hash12}" in capsys.readouterr().out
    bad = _write(
        tmp_path, MINIMAL.replace("name: triplet", "name: tripplet").replace("trials: 1", "trials: 0"), "bad.yaml"
    )
    assert main(["validate", str(good), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tuning.trials: expected a value >= 1, got 0" in err[0]  # schema first
    assert main(["validate", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read protocol" in capsys.readouterr().err


def test_dataset_level_miner_batches_must_fit_the_budget(tmp_path):
    text = MINIMAL.replace(
        "miners: [{name: none}, {name: batch_hard}]", "miners: [{name: offline, params: {triplets_per_batch: 4}}]"
    )
    problems = _problems(tmp_path, text)  # P x K = 4 x 2 = 8 samples a step; 3 x 4 = 12 would exceed it
    assert len(problems) == 1
    assert (
        "grid.miners[0].params: offline serves up to 12 samples a step (3 x (triplets_per_batch=4)), "
        "more than the batch P x K = 8" in problems[0]
    )
    assert parse_protocol(text.replace("triplets_per_batch: 4", "triplets_per_batch: 2")).name == "tiny"


def test_a_loss_parameter_the_miner_supplies_may_not_be_searched(tmp_path):
    """MargOHNM's quadruplets carry their own margins: searching the loss's alpha1 beside it is dead (issue 11)."""
    text = MINIMAL.replace(
        """    - name: triplet
      search_space:
        margin: {type: float, low: 0.05, high: 0.5}
  miners: [{name: none}, {name: batch_hard}]""",
        """    - name: quadruplet
      miners: [margohnm]
      search_space:
        alpha1: {type: float, low: 0.6, high: 1.5}
  miners: [{name: none}, {name: margohnm}]""",
    )
    problems = _problems(tmp_path, text)
    assert problems == [
        f"{tmp_path / 'p.yaml'}:19: grid.losses[0].search_space.alpha1: 'alpha1' is supplied by the "
        "miner's tuples (margohnm) in every cell of quadruplet: searching it has no effect; "
        "remove it from search_space"
    ]
    live = parse_protocol(text.replace("      miners: [margohnm]\n", ""))  # with no miner alpha1 is live
    assert live.doc["grid"]["losses"][0]["search_space"]["alpha1"]["low"] == 0.6


def test_a_batch_too_small_for_a_method_is_one_line(tmp_path):
    text = (
        MINIMAL.replace("name: triplet\n", "name: quadruplet\n")
        .replace("margin: {type: float, low: 0.05, high: 0.5}", "alpha1: {type: float, low: 0.6, high: 1.5}")
        .replace("{name: batch_hard}", "{name: margohnm}")
        .replace("P: 4", "P: 2")
    )
    problems = _problems(tmp_path, text)
    assert (
        f"{tmp_path / 'p.yaml'}:16: grid.losses[0].name: loss 'quadruplet' needs at least 3 classes a batch: "
        "training.P is 2" in problems
    )
    assert any("miner 'margohnm' needs at least 3 classes a batch" in p for p in problems)


def test_a_schedule_that_does_not_fit_the_budget_is_refused_at_validation(tmp_path):
    text = MINIMAL.replace("iterations: 5}", "iterations: 5, schedule: {type: cosine, warmup: 5}}")
    problems = _problems(tmp_path, text)
    assert any("training.schedule: warmup must be a whole number of iterations in [0, 5), got 5" in p for p in problems)
    step = MINIMAL.replace(
        "iterations: 5}", "iterations: 5, schedule: {type: step, gamma: 0.1, milestones: [0.8, 0.5]}}"
    )
    assert any("training.schedule: a step schedule needs milestones" in p for p in _problems(tmp_path, step))
    fits = MINIMAL.replace("iterations: 5}", "iterations: 5, schedule: {type: cosine, warmup: 2}}")
    assert parse_protocol(fits).doc["training"]["schedule"] == {"type": "cosine", "warmup": 2}


def test_fp16_on_the_cpu_is_refused_at_validation(tmp_path):
    text = MINIMAL.replace("iterations: 5}", "iterations: 5, precision: fp16}")
    problems = _problems(tmp_path, text)
    assert [p for p in problems if "training.precision" in p] == [
        f"{tmp_path / 'p.yaml'}:10: training.precision: fp16 needs a CUDA device (on the CPU float16 autocast is "
        "slow and has no grad scaler): use bf16 or fp32"
    ]
    assert (
        parse_protocol(MINIMAL.replace("iterations: 5}", "iterations: 5, precision: bf16}")).doc["training"][
            "precision"
        ]
        == "bf16"
    )
