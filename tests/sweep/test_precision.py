"""One precision a sweep: `precision: auto` chosen once at the start, recorded, kept on resume and by every cell;
a fixed precision several times slower than another is warned about."""

from __future__ import annotations

import json
import sqlite3

import optuna
import pytest

from bench.errors import BenchError
from bench.plan.measure import VARIANTS, PrecisionChoice, choose_precision, slow_line, time_variants
from bench.protocol import parse_protocol
from bench.sweep.precision import recorded_choice, resolve_precision, study_name
from bench.sweep.runner import run_protocol
from bench.sweep.worker import Options
from bench.training import TrainConfig

TINY = """\
name: tiny-precision
seed: 1
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 8
  test_classes: 5
  image_size: 16
  validation: {folds: 2, use: 1}
model: {trunk: conv4, embedding_dim: 8, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 4, K: 2, iterations: 3, precision: PRECISION}
evaluation: {metrics: [precision_at_1, map_at_r], primary: map_at_r}
tuning: {trials: 1}
final: {seeds: [0, 1]}
grid:
  losses: [{name: contrastive}, {name: triplet}]
  miners: [{name: none}]
"""


def _protocol(precision: str = "auto"):
    return parse_protocol(TINY.replace("PRECISION", precision))


def test_auto_is_a_protocol_value_with_its_own_hash_and_never_a_training_run_s():
    auto, bf16 = _protocol("auto"), _protocol("bf16")
    assert auto.precision_auto and not bf16.precision_auto
    assert auto.hash != bf16.hash
    resolved = auto.with_precision("fp32", True)
    assert (resolved.hash, resolved.text) == (auto.hash, auto.text)  # the records stay the protocol's
    assert resolved.doc["training"]["precision"] == "fp32" and auto.doc["training"]["precision"] == "auto"
    with pytest.raises(BenchError, match="precision auto is a protocol's"):
        TrainConfig(precision="auto").check()


def test_choose_precision_times_every_variant_here_and_takes_the_fastest():
    choice = choose_precision(_protocol(), budget_s=1.0, threads=1)
    assert set(choice.step_ms) == set(VARIANTS)  # a CPU has bf16; conv4 is an image trunk
    assert all(ms > 0 for ms in choice.step_ms.values())
    assert choice.rounds >= 2 and choice.threads == 1
    assert choice.step_ms[choice.variant] <= min(choice.step_ms.values()) * 1.02
    medians, rounds, _ = time_variants(_protocol(), ["fp32"], budget_s=0.1, threads=1, min_rounds=1)
    assert list(medians) == ["fp32"] and rounds >= 1


def test_slow_line_warns_from_three_times_the_fastest():
    times = {"fp32": 0.202, "fp32+channels_last": 0.144, "bf16": 1.790, "bf16+channels_last": 1.466}
    line = slow_line("bf16+channels_last", times, 1)
    assert line is not None and "10.2x" in line and "fp32+channels_last" in line and "auto" in line
    assert slow_line("fp32", times, 1) is None  # 1.4x: no warning
    assert slow_line("bf16", {**times, "bf16": 0.43}, 1) is None  # 2.99x


def _choice(precision: str, channels_last: bool) -> PrecisionChoice:
    return PrecisionChoice(precision, channels_last, {"fp32": 1.0, "bf16": 0.5}, 2, 1, "cpu")


def _never(protocol):
    raise AssertionError("a stored choice must not be measured again")


def test_the_first_recorded_choice_is_the_sweep_s_on_every_later_start(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    protocol = _protocol().with_data("d" * 64)
    first, record = resolve_precision(protocol, storage, choose=lambda p: _choice("bf16", False))
    assert (first.doc["training"]["precision"], first.doc["training"]["channels_last"]) == ("bf16", False)
    assert record["setting"] == "auto" and record["step_ms"] == {"fp32": 1.0, "bf16": 0.5}
    # another worker that measured at the same time recorded a second choice: the first one stays the sweep's
    optuna.load_study(study_name=study_name(protocol), storage=storage).add_trial(
        optuna.trial.create_trial(value=0.0, user_attrs={"choice": {"precision": "fp32", "channels_last": True}})
    )
    again, record2 = resolve_precision(protocol, storage, choose=_never)
    assert again.doc["training"]["precision"] == "bf16" and record2 == record
    assert recorded_choice(protocol.with_data("e" * 64), storage) is None  # other data: another sweep
    fixed, rec = resolve_precision(_protocol("bf16"), storage, choose=_never)
    assert fixed.doc["training"]["precision"] == "bf16" and rec == {
        "setting": "bf16",
        "precision": "bf16",
        "channels_last": True,  # the default for images in bf16 (bench.training.use_channels_last)
    }


@pytest.mark.slow
def test_a_sweep_trains_every_run_in_the_recorded_choice_and_keeps_it_on_resume(tmp_path, data_root, monkeypatch):
    """A choice recorded by another machine (bf16 without channels-last, not this CPU's fastest) is what
    every cell trains in (the finals log it; trials build from the same resolved protocol), the manifest
    says so, and a rerun measures nothing."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.replace("PRECISION", "auto"))
    options = Options(
        storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        tracking_uri=str(tmp_path / "mlruns"),
        results_dir=tmp_path / "results",
        data_root=str(data_root),
        quiet=True,
    )
    import bench.plan.measure as measure

    monkeypatch.setattr(measure, "choose_precision", lambda p: _choice("bf16", False))  # "another machine"
    run_protocol(path, options)
    first = json.loads((tmp_path / "results" / "tiny-precision" / "manifest.json").read_text())["time"]
    assert all(first["seconds"][k] > 0 for k in ("start-up", "training", "validation", "test", "records", "floor"))
    assert abs(sum(first["seconds"].values()) - first["wall_s"]) < 0.1
    monkeypatch.setattr(measure, "choose_precision", _never)
    run_protocol(path, options)  # resumed (finished): the stored choice, nothing measured
    manifest = json.loads((tmp_path / "results" / "tiny-precision" / "manifest.json").read_text())
    assert manifest["precision"]["setting"] == "auto"
    assert (manifest["precision"]["precision"], manifest["precision"]["channels_last"]) == ("bf16", False)
    # the rerun's wall time accounted (bench.clock.Ledger): nothing trained, so no training; the sum is the wall
    accounts = manifest["time"]
    assert accounts["seconds"]["training"] == 0 and accounts["seconds"]["start-up"] > 0
    assert abs(sum(accounts["seconds"].values()) - accounts["wall_s"]) < 0.1
    with sqlite3.connect(tmp_path / "mlruns" / "mlflow.db") as db:
        params = db.execute("select key, value from params where key in ('precision', 'channels_last')").fetchall()
    finals = 2 * 2  # cells x seeds log their config
    assert sorted(params) == sorted([("precision", "bf16")] * finals + [("channels_last", "False")] * finals)


def test_validate_times_the_precision_with_the_threads_it_is_given(tmp_path, data_root, capsys):
    """`validate --threads N` times the fixed precision's step with N threads, as `run --threads N` trains (the
    ratio between the variants depends on it); the process's own thread count is left as it was."""
    import torch

    from bench.cli import main
    from bench.commands.validate import _slow_precision

    path = tmp_path / "p.yaml"
    path.write_text(TINY.replace("PRECISION", "fp32"))
    before = torch.get_num_threads()
    assert main(["validate", str(path), "--threads", "1", "--data-root", str(data_root)]) == 0
    assert torch.get_num_threads() == before
    warning = [line for line in capsys.readouterr().err.splitlines() if "training.precision" in line]
    assert all("(1 thread(s))" in line for line in warning), warning
    line = _slow_precision(_protocol("fp32"), 1)  # the warning, when this machine makes one, says 1 thread
    assert line is None or "(1 thread(s))" in line, line
    assert main(["validate", str(path), "--threads", "0"]) == 2  # as run's --threads: at least 1
