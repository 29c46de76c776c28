"""The plain PML script and its comparison with the harness (benchmarks/): they run, and compare like with like."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str) -> ModuleType:
    """A benchmarks/ script as a module (benchmarks/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_plain_script_trains_a_few_iterations_reproducibly() -> None:
    plain = _module("plain_pml_script")
    torch.set_num_threads(1)
    a = plain.train_model(iterations=3, seed=0, batch_size=32, m=4)
    b = plain.train_model(iterations=3, seed=0, batch_size=32, m=4)
    torch.manual_seed(0)
    untrained = plain.conv4()
    for (name, pa), pb, pu in zip(a.state_dict().items(), b.state_dict().values(), untrained.state_dict().values()):
        assert torch.equal(pa, pb), name  # seeded: the same batches and steps twice
    moved = [
        name
        for (name, pa), pu in zip(a.state_dict().items(), untrained.state_dict().values())
        if pa.is_floating_point() and not torch.equal(pa, pu)
    ]
    assert "0.weight" in moved and "13.weight" in moved  # the first conv and the linear layer were stepped
    out = a.eval()(torch.zeros(2, 1, 28, 28))
    assert out.shape == (2, 64)


def test_harness_arm_is_the_protocols_cell_at_the_plain_scripts_budget() -> None:
    compare = _module("compare_plain_pml")
    from bench.protocol import load_protocol

    protocol = compare.as_trained(
        load_protocol(ROOT / "protocols" / "omniglot-standard.yaml"), str(ROOT / "results" / "omniglot-standard")
    )
    training = protocol.doc["training"]
    config = compare.harness_config(protocol, compare.CELL, {"loss.margin": 0.3}, seed=0, iterations=7)
    assert (config.loss, config.miner, config.iterations) == ("triplet", "batch_hard", 7)
    assert (config.P, config.K) == (training["P"], training["K"])  # the plain script is given P*K and m=K
    assert config.loss_params["margin"] == 0.3
    assert config.augmentation == protocol.doc["data"]["augmentation"]
    assert config.schedule == training["schedule"] and config.precision == training["precision"] != "auto"
    default = compare.harness_config(protocol, compare.CELL, {}, seed=0, iterations=None)
    assert default.iterations == training["iterations"] and default.loss_params.get("margin", 0.05) == 0.05


def test_an_auto_protocols_harness_arm_trains_in_the_precision_its_sweep_chose(tmp_path: Path) -> None:
    compare = _module("compare_plain_pml")
    from bench.errors import BenchError
    from bench.protocol import load_protocol

    quick = load_protocol(ROOT / "protocols" / "omniglot-quick.yaml")
    assert quick.precision_auto
    chosen = json.loads((ROOT / "results" / "omniglot-quick" / "manifest.json").read_text())["precision"]
    trained = compare.as_trained(quick, str(ROOT / "results" / "omniglot-quick"))
    assert trained.doc["training"]["precision"] == chosen["precision"] and trained.hash == quick.hash
    config = compare.harness_config(trained, compare.CELL, {}, seed=0, iterations=3)
    assert (config.precision, config.channels_last) == (chosen["precision"], chosen["channels_last"])
    with pytest.raises(BenchError, match="precision: auto: give --results of its sweep"):
        compare.as_trained(quick, str(tmp_path))


def test_tuned_parameters_come_from_the_results_best_trial() -> None:
    compare = _module("compare_plain_pml")
    params = compare.tuned_params(str(ROOT / "results" / "omniglot-quick"), compare.CELL, {})
    # the best trial of the cell, read here from trials.csv on its own: the highest validation value
    trials = pd.read_csv(ROOT / "results" / "omniglot-quick" / "trials.csv")
    mine = trials[(trials.cell == compare.CELL) & (trials.state == "COMPLETE")]
    best = json.loads(mine.loc[mine.value.idxmax(), "params"])
    assert params["loss.margin"] == pytest.approx(best["loss.margin"], abs=1e-9)
    assert compare.tuned_params(None, compare.CELL, {"loss.margin": 0.1}) == {"loss.margin": 0.1}
    from bench.errors import BenchError

    with pytest.raises(BenchError, match="no summary row"):
        compare.tuned_params(str(ROOT / "results" / "omniglot-quick"), "nothing+none", {})


def test_under_early_stopping_both_arms_train_the_cells_final_length(tmp_path: Path) -> None:
    """A final seed of an early-stopped protocol trains as long as its cell's best trial did, with the whole
    budget's schedule: the comparison's budget is that length, read from the sweep's finals."""
    import shutil

    from bench.errors import BenchError
    from bench.protocol import load_protocol

    compare = _module("compare_plain_pml")
    converged = load_protocol(ROOT / "protocols" / "omniglot-converged.yaml")
    results = tmp_path / "results"
    shutil.copytree(ROOT / "results" / "omniglot-standard", results)
    finals = pd.read_csv(results / "finals.csv")
    finals.loc[finals.cell == compare.CELL, "iterations"] = 4750  # as the converged sweep's cell trained
    finals.to_csv(results / "finals.csv", index=False)
    assert compare.budget(converged, str(results), compare.CELL, None) == 4750
    assert compare.budget(converged, str(results), compare.CELL, 300) == 300  # --iterations wins
    standard = load_protocol(ROOT / "protocols" / "omniglot-standard.yaml")
    assert compare.budget(standard, None, compare.CELL, None) == standard.doc["training"]["iterations"]
    with pytest.raises(BenchError, match="early-stops its runs: give --results"):
        compare.budget(converged, None, compare.CELL, None)
    with pytest.raises(BenchError, match="no completed final seed of cell nothing"):
        compare.budget(converged, str(results), "nothing+none", None)
    config = compare.harness_config(converged.with_precision("fp32", True), compare.CELL, {}, seed=0, iterations=4750)
    assert config.iterations == converged.doc["training"]["iterations"]  # the schedule's; stop_after stops it


def test_every_plain_method_builds_and_steps_from_pml_defaults() -> None:
    """Each counterpart in PLAIN is built with no argument and gives a finite loss with a gradient on a P x K
    batch, so the comparison can run for any cell that has one."""
    plain = _module("plain_pml_script")
    torch.manual_seed(0)
    labels = torch.arange(8).repeat_interleave(4)
    for method, (name, build) in plain.PLAIN.items():
        x = torch.nn.functional.normalize(torch.randn(32, 16), dim=1).requires_grad_()
        loss_fn, miner = build()
        loss = loss_fn(x, labels, None if miner is None else miner(x, labels))
        loss.backward()
        assert torch.isfinite(loss) and float(loss.detach()) > 0, name
        assert x.grad is not None and float(x.grad.abs().sum()) > 0, name
        assert plain.parse_method(plain.method_name(method)) == method


def test_the_plain_arm_is_the_cells_own_method_unless_named() -> None:
    compare = _module("compare_plain_pml")
    plain = _module("plain_pml_script")
    from bench.errors import BenchError
    from bench.plan import plan
    from bench.protocol import load_protocol

    cells = plan(load_protocol(ROOT / "protocols" / "omniglot-converged.yaml"))
    assert compare.plain_method(cells.cell("lifted_structure+none")) == ("lifted_structure", None)
    assert compare.plain_method(cells.cell("triplet+batch_hard")) == plain.DEFAULT
    ms = cells.cell("pml-multi_similarity+pml-multi_similarity")
    assert compare.plain_method(ms) == ("pml:multi_similarity", "pml:multi_similarity")
    # FaceNet's semantics and a learned metric are fixed parameters PML's defaults do not have
    with pytest.raises(BenchError, match="semantics.*--plain LOSS\\+MINER"):
        compare.plain_method(cells.cell("triplet+semihard-facenet"))
    with pytest.raises(BenchError, match="learned_metric"):
        compare.plain_method(cells.cell("quadruplet-learned+margohnm-w1"))
    with pytest.raises(BenchError, match="quadruplet\\+margohnm has no counterpart in PML"):
        compare.plain_method(cells.cell("quadruplet+margohnm"))
    assert plain.parse_method("lifted_structure+none") == plain.parse_method("lifted_structure")
    with pytest.raises(BenchError, match="no plain PML counterpart of 'quadruplet\\+margohnm'; there are: triplet"):
        plain.parse_method("quadruplet+margohnm")


def test_the_comparison_refuses_a_cell_it_cannot_compare_in_one_line() -> None:
    import subprocess

    script = str(ROOT / "benchmarks" / "compare_plain_pml.py")
    base = [sys.executable, script, "--protocol", str(ROOT / "protocols" / "omniglot-standard.yaml")]
    for extra, message in (
        (["--cell", "triplet+nothing"], "no cell triplet+nothing in its plan"),
        (["--plain", "quadruplet+margohnm"], "no plain PML counterpart of 'quadruplet+margohnm'"),
        # refused before an arm trains for an hour and loses its score on writing it
        (["--out", str(ROOT / "no-such-folder" / "cmp.csv")], "no-such-folder"),
    ):
        done = subprocess.run(base + extra, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    plain = [sys.executable, str(ROOT / "benchmarks" / "plain_pml_script.py")]
    for extra, message in ((["5", "0", "quadruplet+margohnm"], "no plain PML counterpart"), (["x"], "invalid int")):
        done = subprocess.run(plain + extra, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert done.returncode == 2 and message in done.stderr.splitlines()[-1], done.stderr
        assert "Traceback" not in done.stderr


def test_the_comparisons_record_keeps_other_comparisons_and_refuses_a_foreign_file(tmp_path: Path) -> None:
    from bench.errors import BenchError

    compare = _module("compare_plain_pml")
    out = tmp_path / "cmp.csv"
    key = {"protocol_hash": "abc", "code": "0123", "precision": "fp32", "cell": "c+none", "plain": "c+none"}
    key |= {"iterations": "5", "params": "{}"}
    assert compare.recorded(out, key) == {}
    row = {"seed": 0, "arm": "plain", "lake_accuracy": "0.9", "map_at_r": "0.5", "seconds": "3", "device": "cpu"}
    compare.record(out, {**key, **row})
    compare.record(out, {**key, "iterations": "6", **row, "arm": "harness"})  # another comparison's row
    compare.record(out, {**key, **row, "seed": 1, "map_at_r": "0.25"})
    assert compare.recorded(out, key) == {
        (0, "plain"): {"lake_accuracy": 0.9, "map_at_r": 0.5},
        (1, "plain"): {"lake_accuracy": 0.9, "map_at_r": 0.25},
    }
    assert len(pd.read_csv(out)) == 3 and out.read_text().count("protocol_hash") == 1  # one header
    # Set against another plain method, the cell's harness runs are the same runs: seed 2's is taken from
    # the first comparison, its plain arm is not.
    compare.record(out, {**key, **row, "seed": 2, "arm": "harness", "map_at_r": "0.75"})
    compare.record(out, {**key, **row, "seed": 2})
    other = {**key, "plain": "triplet+batch_hard"}
    assert compare.recorded(out, other) == {(2, "harness"): {"lake_accuracy": 0.9, "map_at_r": 0.75}}
    assert compare.recorded(out, {**other, "iterations": "6"}) == {
        (0, "harness"): {"lake_accuracy": 0.9, "map_at_r": 0.5}
    }
    foreign = tmp_path / "other.csv"
    foreign.write_text("a,b\n1,2\n")
    with pytest.raises(BenchError, match="not a record of this comparison"):
        compare.recorded(foreign, key)


def test_the_finding_follows_the_interval_not_the_point_estimate() -> None:
    """A harness mean above the plain one by less than the seeds' spread shows nothing; only an interval
    clear of 0 says above or below (the comparison's own scores of seeds 0-2 on the converged protocol)."""
    from bench.stats import welch

    finding = _module("compare_plain_pml").finding
    plain, harness = [0.9100, 0.9325, 0.9025], [0.9175, 0.9225, 0.9175]  # Lake's runs: +0.004, spread 0.015
    assert welch(harness, plain).diff > 0
    assert finding(welch(harness, plain)) == "no difference shown (the interval holds 0)"
    assert finding(welch([0.508, 0.508, 0.5076], [0.4749, 0.4749, 0.4665])) == "harness above plain"
    assert finding(welch([0.4749, 0.4749, 0.4665], [0.508, 0.508, 0.5076])) == "HARNESS BELOW PLAIN"
    assert finding(welch([0.5], [0.4])) == "not shown either way (no interval)"


@pytest.mark.slow
def test_a_comparison_run_again_scores_only_the_arms_its_record_lacks(tmp_path: Path) -> None:
    """Both arms of one seed trained for one iteration and recorded; the same command again trains nothing and
    prints the recorded scores; another iteration count is another comparison, trained anew."""
    import subprocess

    out = tmp_path / "cmp.csv"
    text = (ROOT / "protocols" / "omniglot-standard.yaml").read_text()
    short = tmp_path / "short.yaml"  # omniglot-standard with no warm-up (one iteration) and in fp32 (any CPU)
    short.write_text(text.replace("warmup: 50", "warmup: 0").replace("precision: bf16", "precision: fp32"))
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "compare_plain_pml.py"),
        "--protocol",
        str(short),
        "--cell",
        "lifted_structure+none",
        "--iterations",
        "1",
        "--seeds",
        "0",
        "--out",
        str(out),
    ]
    first = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "plain PML LiftedStructureLoss()" in first.stdout
    assert "harness - plain: " in first.stdout and "(one seed: no interval)" in first.stdout  # not [nan, nan]
    assert "not shown either way (no interval)" in first.stdout  # one seed decides nothing
    assert "nan" not in first.stdout
    rows = pd.read_csv(out, dtype={"code": str})
    assert list(rows.arm) == ["plain", "harness"] and set(rows.cell) == {"lifted_structure+none"}
    assert set(rows.plain) == {"lifted_structure+none"} and set(rows.iterations) == {1}
    from bench.resume import code_digest

    assert set(rows.code) == {code_digest()[:12]}  # rows of another code of bench would be trained anew
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("in cmp.csv") == 2 and len(pd.read_csv(out)) == 2
    for arm in ("plain", "harness"):  # the recorded scores, printed as measured
        line = next(x for x in again.stdout.splitlines() if f"  {arm} " in x)
        score = rows[rows.arm == arm].iloc[0]
        assert line.split()[2:4] == [f"{score.lake_accuracy:.4f}", f"{score.map_at_r:.4f}"]
