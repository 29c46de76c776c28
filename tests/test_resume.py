"""A run given back mid-way goes on from its saved state (bench.resume): the same model, bit for bit, as the
run trained in one go, for the trainer alone and for a real sweep interrupted again and again."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd
import pytest
import torch
from _shared import RUNNER_TINY_TRIPLET, run_args

import bench.resume
from bench.cli import main
from bench.data import LabeledData, load
from bench.resume import RunState, state_path
from bench.stores.tracking import resolve_tracking_uri
from bench.sweep.accounts import Accounts
from bench.sweep.budget_check import _Check
from bench.sweep.tables import read
from bench.training import EarlyStopping, TrainConfig, train


@pytest.fixture(scope="module")
def omniglot(data_root: Path) -> LabeledData:
    background = load("omniglot:background", data_root, 16)
    return background.subset(background.classes[:12])


CONFIGS = {
    # the converged protocol's kind of run: conv4, fp32 + channels-last, affine augmentation, a miner
    "conv4-affine": dict(
        trunk="conv4", loss="triplet", miner="semihard", augmentation="affine", channels_last=True, lr=3e-3
    ),
    # a loss with parameters of its own (the learned metric) and an adaptive miner, in bf16 autocast
    "learned-metric-bf16": dict(
        trunk="mlp", loss="quadruplet", loss_params={"learned_metric": True}, miner="margohnm", precision="bf16"
    ),
}


def quick(name: str, **changes) -> TrainConfig:
    base = dict(embedding_dim=16, P=4, K=4, iterations=160, seed=5)
    return TrainConfig(**{**base, **CONFIGS[name], **changes})


def stopping() -> EarlyStopping:
    # the best checkpoint at 70, before the last state saved (75); three checks without gain stop it at 100
    return EarlyStopping(check_every=10, patience=3, score=lambda it, model: float(it if it <= 70 else 70 - it))


class Interrupted(KeyboardInterrupt):
    pass


def interrupt_at(at: int):
    def progress(it: int, total: int, loss: float) -> None:
        if it == at:
            raise Interrupted

    return progress


def same(a, b) -> None:
    assert (a.iterations, a.samples_seen, a.best_iteration, a.reason) == (
        b.iterations,
        b.samples_seen,
        b.best_iteration,
        b.reason,
    )
    assert a.final_loss == b.final_loss or (a.final_loss != a.final_loss and b.final_loss != b.final_loss)
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), name
    for (name, x), (_, y) in zip(a.loss_module.state_dict().items(), b.loss_module.state_dict().items()):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("early", [False, True], ids=["budget", "early-stopped"])
def test_a_run_interrupted_twice_and_resumed_is_the_uninterrupted_run(omniglot, tmp_path, name, early) -> None:
    config = quick(name)
    whole = train(config, omniglot, early_stopping=stopping() if early else None)
    path = tmp_path / "state.pt"
    # a state is saved at every sync point (25 iterations) but the one interrupted: the last ones 50, then 75
    for at in (75, 100):
        with pytest.raises(Interrupted):
            train(
                config,
                omniglot,
                early_stopping=stopping() if early else None,
                progress=interrupt_at(at),
                resume=RunState(path, "unit", every_s=0),
            )
        assert path.is_file()
    told: list[int] = []  # where the run goes on from, as the progress lines' pace needs it
    state = RunState(path, "unit", every_s=0, on_resume=told.append)
    resumed = train(config, omniglot, early_stopping=stopping() if early else None, resume=state)
    same(resumed, whole)
    assert (whole.iterations, whole.best_iteration) == ((100, 70) if early else (160, None))
    assert state.resumed_at == 75 and told == [75]
    assert resumed.resumed.startswith("resumed at iteration 76: iterations 1-50 on cpu: ")
    assert "; iterations 51-75 on cpu: " in resumed.resumed
    assert resumed.wall_time_s > resumed.earlier_s > 0


def method_cases() -> list[tuple[str, str | None]]:
    """Every registered loss (with the miner of its kind, if it needs one) and every miner (with a loss of the
    tuples it mines)."""
    from bench import registry

    cases = [
        (loss, "pml:multi_similarity" if loss == "pml:multi_similarity" else None) for loss in registry.names("loss")
    ]
    quadruplets = ("margohnm", "hardest_of_pool")  # miners of quadruplets, for the quadruplet loss
    return cases + [
        ("quadruplet" if miner in quadruplets else "triplet", miner)
        for miner in registry.names("miner")
        if miner != "pml:multi_similarity"
    ]


@pytest.mark.parametrize("loss,miner", method_cases())
def test_every_loss_and_miner_resumes_to_the_uninterrupted_run(omniglot, tmp_path, loss, miner) -> None:
    config = TrainConfig(trunk="mlp", embedding_dim=16, P=4, K=4, iterations=160, seed=2, loss=loss, miner=miner)
    whole = train(config, omniglot)
    path = tmp_path / "state.pt"
    with pytest.raises(Interrupted):
        train(config, omniglot, progress=interrupt_at(100), resume=RunState(path, "unit", every_s=0))
    state = RunState(path, "unit", every_s=0)
    same(train(config, omniglot, resume=state), whole)
    # a dataset-level miner's own mining state is not saved: its run starts over
    assert state.resumed_at == (0 if miner in ("offline", "hardest_of_pool") else 75)


def test_a_state_of_other_settings_or_a_damaged_one_is_dropped_and_the_run_starts_over(omniglot, tmp_path) -> None:
    path = tmp_path / "state.pt"
    config = quick("conv4-affine", iterations=60)
    with pytest.raises(Interrupted):
        train(config, omniglot, progress=interrupt_at(50), resume=RunState(path, "unit", every_s=0))
    other = quick("conv4-affine", iterations=60, lr=1e-3)
    state = RunState(path, "unit", every_s=0)
    same(train(other, omniglot, resume=state), train(other, omniglot))
    assert state.resumed_at == 0 and not train(other, omniglot).resumed
    # another unit's key: not this run's state either
    with pytest.raises(Interrupted):
        train(config, omniglot, progress=interrupt_at(50), resume=RunState(path, "unit", every_s=0))
    state = RunState(path, "another unit", every_s=0)
    same(train(config, omniglot, resume=state), train(config, omniglot))
    assert state.resumed_at == 0
    path.write_bytes(b"half a file")
    state = RunState(path, "unit", every_s=0)
    same(train(config, omniglot, resume=state), train(config, omniglot))
    assert state.resumed_at == 0


def _tables(root: Path) -> dict[str, pd.DataFrame]:
    tables = read(root / "results" / "tiny")
    return {
        name: tables[name].drop(columns=["wall_time_s"], errors="ignore") for name in ("trials", "finals", "summary")
    }


def test_a_sweep_interrupted_mid_unit_goes_on_from_the_saved_states(tmp_path, data_root, monkeypatch) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(RUNNER_TINY_TRIPLET.replace("ITERATIONS", "200"))
    assert main(run_args(path, tmp_path / "whole", data_root)) == 0
    monkeypatch.setattr(bench.resume, "EVERY_S", 0.0)  # a save at every sync point (25 iterations)
    step = Accounts.step
    calls = {"n": 0}

    def interrupted_step(self, it: int, total: int, loss: float) -> None:
        calls["n"] += 1
        if calls["n"] == 6:  # 150 iterations of this worker's training: within a unit, never at its end
            raise KeyboardInterrupt
        step(self, it, total, loss)

    monkeypatch.setattr(Accounts, "step", interrupted_step)
    root = tmp_path / "interrupted"
    resume_dir = root / "results" / "tiny" / "resume"
    for _ in range(3):
        calls["n"] = 0
        assert main(run_args(path, root, data_root)) == 130
        assert list(resume_dir.rglob("*.pt")), "the unit given back left no state"
    monkeypatch.setattr(Accounts, "step", step)
    # a state a unit left here before it ended on another machine (a lent GPU): removed with its cell's end
    orphans = [
        resume_dir / cell / "unit-0123456789abcdef01234567.pt" for cell in ("triplet+none", "triplet+batch_hard")
    ]
    orphans.append(resume_dir / "triplet+none" / ".unit-0123456789abcdef01234567.pt-k9x2.tmp")  # a write cut short
    for orphan in orphans:
        orphan.parent.mkdir(parents=True, exist_ok=True)
        orphan.write_bytes(b"a state")
    assert main(run_args(path, root, data_root)) == 0
    assert not [p for p in resume_dir.rglob("*") if p.is_file()]  # every state removed once its unit (or cell) ended
    # and by a worker that finds the cell finished as it starts (its last units ended on another machine)
    orphans[0].write_bytes(b"a state")
    assert main(run_args(path, root, data_root)) == 0 and not orphans[0].exists()
    whole, interrupted = _tables(tmp_path / "whole"), _tables(root)
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(frame, interrupted[name])
    client = mlflow.MlflowClient(resolve_tracking_uri(str(root / "mlruns")))
    experiment = client.get_experiment_by_name("dmlbench/tiny")
    runs = client.search_runs([experiment.experiment_id], "tags.resumed LIKE 'resumed at iteration %'")
    tags = [r.data.tags["resumed"] for r in runs]
    # each of the three interruptions left one earlier part of a unit that went on from it
    assert sum(tag.count("; ") + 1 for tag in tags) == 3, tags

    # the budget check's seeds (twice the budget) alike: interrupted mid-seed, it goes on to the same rows
    def check(at: Path) -> list[str]:
        return ["budget-check", *run_args(path, at, data_root)[1:]]

    assert main(check(tmp_path / "whole")) == 0
    seed_step, calls["n"] = _Check._step, 0

    def interrupted_seed(self, it: int, total: int, loss: float) -> None:
        calls["n"] += 1
        if calls["n"] == 10:  # 250 iterations into a seed of 400
            raise KeyboardInterrupt
        seed_step(self, it, total, loss)

    monkeypatch.setattr(_Check, "_step", interrupted_seed)
    assert main(check(root)) == 130
    (state,) = resume_dir.rglob("*.pt")
    assert state.name.startswith("budget-")
    kept = state.read_bytes()
    monkeypatch.setattr(_Check, "_step", seed_step)
    assert main(check(root)) == 0
    assert not list(resume_dir.rglob("*.pt"))
    columns = ["cell", "seed", "iterations", "map_at_r", "precision_at_1", "state"]
    rows = [pd.read_csv(r / "results" / "tiny" / "budget_check.csv")[columns] for r in (tmp_path / "whole", root)]
    pd.testing.assert_frame_equal(*rows)
    resumed = client.search_runs([experiment.experiment_id], "tags.kind = 'budget_check' and tags.resumed != ''")
    assert len(resumed) == 1 and resumed[0].data.tags["resumed"].startswith("resumed at iteration 226: "), resumed
    # the state of a seed recorded since (as if it had ended on another machine): removed by the next check
    state.write_bytes(kept)
    assert main(check(root)) == 0 and not state.exists()


def test_state_files_are_named_by_the_key(tmp_path) -> None:
    a, b = state_path(tmp_path, "k/cell/trial0/fold0"), state_path(tmp_path, "k/cell/trial1/fold0")
    assert a != b and a.parent == b.parent == tmp_path and a.suffix == ".pt"


def test_a_saved_state_tells_where_a_run_on_this_device_would_go_on_from(omniglot, tmp_path) -> None:
    # what a worker with a time limit reads to plan (budget-check --stop-after): the state's iteration where
    # this process would resume it, 0 where `load` would start over
    path = tmp_path / "state.pt"
    state = RunState(path, "unit", every_s=0)
    assert state.saved_iteration("cpu") == 0  # nothing saved
    with pytest.raises(Interrupted):
        train(quick("conv4-affine", iterations=60), omniglot, progress=interrupt_at(50), resume=state)
    # the last save: at the sync point (every 25) before the one the interruption came at
    assert state.saved_iteration("cpu") == 25
    assert state.saved_iteration("cuda") == 0  # saved on another device type: not resumed there
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert state.saved_iteration("cpu") == 0  # nor with another thread count
    finally:
        torch.set_num_threads(threads)
    path.write_bytes(b"half a file")
    assert state.saved_iteration("cpu") == 0
