"""final.mode folds: the Reality Check's final procedure, a model per fold scored alone and concatenated."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from _shared import RUNNER_TINY
from _shared import sweep_options as _options

from bench.errors import BenchError
from bench.evaluation import Concatenated, embed, kept_embeddings
from bench.metrics import retrieval_metrics
from bench.plan import plan, trained_cell
from bench.protocol import parse_protocol
from bench.reports import leaderboard, source
from bench.sweep import tables
from bench.sweep.preflight import problems
from bench.sweep.prepare import prepare
from bench.sweep.records import collapse_evaluations, expand_evaluations, metric_names
from bench.sweep.runner import run_protocol
from bench.sweep.tuning import final_fold_config, open_storage
from bench.training import train

STOPPING = "early_stopping: {metric: map_at_r, patience: 1, check_every: 4, max_iterations: 16}"


def _folds(mode: str = "folds", stopping: str = "", use: int = 2, iterations: int = 16) -> str:
    text = RUNNER_TINY.replace("use: 1", f"use: {use}").replace("ITERATIONS", str(iterations))
    text = text.replace("final: {seeds: [0, 1]}", "final: {seeds: [0, 1]" + (f", mode: {mode}}}" if mode else "}"))
    if stopping:
        text = text.replace(f"iterations: {iterations}}}", f"iterations: {iterations}, {stopping}}}")
    # one cell that trains and the one whose every trial diverges
    return text.replace("    - {name: triplet}\n", "    - {name: triplet, miners: [batch_hard]}\n")


def test_retrain_is_the_default_and_keeps_the_hash() -> None:
    plain = parse_protocol(_folds(mode=""))
    assert parse_protocol(_folds(mode="retrain")).hash == plain.hash
    folds = parse_protocol(_folds())
    assert folds.hash != plain.hash
    assert plan(folds).budget.final_runs == 2 and plan(plain).budget.final_runs == 1
    assert plan(folds).budget.final_iterations == 2 * 2 * 16  # seeds x fold models x iterations


def test_folds_with_one_fold_in_use_is_refused_in_one_line() -> None:
    with pytest.raises(BenchError, match=r"final\.mode: folds needs at least 2 validation folds") as e:
        parse_protocol(_folds(use=1))
    assert "\n" not in str(e.value)


def test_a_learned_metric_cell_is_refused_under_folds() -> None:
    text = _folds().replace(
        "    - {name: triplet, miners: [batch_hard]}\n",
        "    - {name: quadruplet, label: learned, params: {learned_metric: true, pair_input: difference_product}}\n",
    )
    text = text.replace("miners: [{name: none}, {name: batch_hard}]", "miners: [{name: none}, {name: margohnm}]")
    found = [p for p in problems(parse_protocol(text), data=False) if p.key == "final.mode"]
    assert (
        len(found) == 1 and "cannot rank" in found[0].message and "the learned metric of learned+" in found[0].message
    )


def test_concatenated_normalises_each_part_then_joins_them() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 4)
    x = torch.randn(5, 3)
    out = Concatenated([a, b])(x)
    assert out.shape == (5, 6)
    assert torch.allclose(out[:, :2].norm(dim=1), torch.ones(5)) and torch.allclose(
        out[:, 2:].norm(dim=1), torch.ones(5)
    )
    assert torch.allclose(out[:, 2:], torch.nn.functional.normalize(b(x), dim=1))


def test_kept_embeddings_run_each_model_once_and_join_the_same_values() -> None:
    """final.mode folds scores each fold model, then their concatenation, on one test set: within
    `kept_embeddings` the concatenation is joined from the kept embeddings, value for value."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 4)
    x, other = torch.randn(700, 3), torch.randn(5, 3)
    calls: list[torch.nn.Module] = []
    for m in (a, b):
        m.register_forward_hook(lambda module, inputs, output: calls.append(module))
    plain = embed(Concatenated([a, b]), x, normalize=True)
    calls.clear()
    with kept_embeddings(x):
        alone = embed(a, x)
        embed(b, x)
        joined = embed(Concatenated([a, b]), x, normalize=True)
        again = embed(a, x)
        embed(a, other)
        embed(a, other)  # other data are embedded as always, never kept
    assert len(calls) == 2 * 2 + 2  # a and b over x once (two batches of 512 each), `other` twice
    assert torch.equal(joined, plain) and torch.equal(again, alone)
    embed(a, x)
    assert len(calls) == 6 + 2  # outside, nothing is kept: a runs over x again


def test_kept_embeddings_nested_for_the_same_data_keep_to_the_outer_end() -> None:
    """A final seed keeps the test set's embeddings around its fold models' scoring (nested) and its
    artifacts: what the inner scope embedded is joined after it ends, not embedded again."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 4)
    x, y = torch.randn(40, 3), torch.randn(40, 3)
    calls: list[torch.nn.Module] = []
    for m in (a, b):
        m.register_forward_hook(lambda module, inputs, output: calls.append(module))
    with kept_embeddings(x):
        with kept_embeddings(x):
            embed(a, x)
            embed(b, x)
        joined = embed(Concatenated([a, b]), x)
        with kept_embeddings(y):  # other data: a scope of its own, x's kept again once it ends
            embed(a, y)
        embed(a, x)
    assert calls == [a, b, a]
    assert torch.equal(joined, embed(Concatenated([a, b]), x))


@pytest.fixture(scope="module")
def folds_sweep(tmp_path_factory, data_root) -> dict:
    root = tmp_path_factory.mktemp("folds")
    path = root / "tiny.yaml"
    path.write_text(_folds())
    outcome = run_protocol(path, _options(root, data_root))
    return {"root": root, "path": path, "outcome": outcome, "results": root / "results" / "tiny"}


@pytest.mark.slow
def test_each_final_seed_reports_its_fold_models_concatenated_and_alone(folds_sweep, data_root) -> None:
    outcome = folds_sweep["outcome"]
    assert outcome.manifest["refused"] == {}  # the audit counts a final seed as 2 fold models x 16 iterations
    finals = pd.read_csv(folds_sweep["results"] / "finals.csv")
    summary = pd.read_csv(folds_sweep["results"] / "summary.csv")
    cell = "triplet+batch_hard"
    for evaluation in ("concatenated", "separate"):
        rows = finals[finals.cell == f"{cell}:{evaluation}"]
        assert sorted(rows.seed) == [0, 1] and (rows.state == "COMPLETE").all()
        assert (rows.iterations == 2 * 16).all()
        assert f"{cell}:{evaluation}" in set(summary.cell)
    # the diverging cell: its rows are there, labelled, never silently dropped
    assert {"contrastive-diverging+none:concatenated", "contrastive-diverging+none:separate"} <= set(summary.cell)

    # recompute seed 0 independently: train each fold model with its config, score alone and concatenated
    protocol = parse_protocol(folds_sweep["path"].read_text())
    prepared = prepare(protocol, str(data_root))
    params = json.loads(finals[finals.cell == f"{cell}:concatenated"].iloc[0]["params"])
    the_cell = plan(protocol).cell(cell)
    alone, parts = [], []
    for f in range(2):
        model = train(final_fold_config(protocol, the_cell, params, 0, f), prepared.fold(f)[0]).model
        emb = embed(model, prepared.test.x, normalize=True)
        alone.append(retrieval_metrics(emb, prepared.test.y, ks=(1, 2))["map_at_r"])
        parts.append(emb)
    joined = torch.nn.functional.normalize(torch.cat(parts, dim=1), dim=1)
    concatenated = retrieval_metrics(joined, prepared.test.y, ks=(1, 2))["map_at_r"]
    seed0 = finals[finals.seed == 0].set_index("cell")["map_at_r"]
    assert seed0[f"{cell}:separate"] == pytest.approx(sum(alone) / 2, abs=1e-6)
    assert seed0[f"{cell}:concatenated"] == pytest.approx(concatenated, abs=1e-6)
    assert alone[0] != pytest.approx(alone[1])  # two fold models, not one twice


@pytest.mark.slow
def test_the_leaderboard_ranks_both_evaluations_and_reads_the_cells_trials(folds_sweep) -> None:
    res = source.load(folds_sweep["results"])
    board = leaderboard.build(res)
    rows = {r.cell: r for r in board.rows}
    for evaluation in ("concatenated", "separate"):
        row = rows[f"triplet+batch_hard:{evaluation}"]
        assert row.trials == 2 and row.n_seeds == 2  # the trained cell's trials, counted for each evaluation
    # the trained cell is not missing for being reported under two names; the diverged one is, with its reason
    assert list(board.missing) == ["contrastive-diverging+none"]
    assert "every trial failed" in board.missing["contrastive-diverging+none"]
    text = leaderboard.markdown(board)
    assert "triplet+batch_hard:concatenated" in text and "triplet+batch_hard:separate" in text
    assert trained_cell("triplet+batch_hard:separate") == "triplet+batch_hard"


@pytest.mark.slow
def test_the_records_hold_each_fold_model_and_mlflow_rebuilds_the_same_tables(folds_sweep, tmp_path) -> None:
    from bench.reports import mlflow_source

    root = folds_sweep["root"]
    storage = open_storage(f"sqlite:///{root / 'optuna.db'}")
    name = next(n for n in optuna.get_all_study_names(storage) if n.endswith(":triplet+batch_hard:final"))
    for t in optuna.load_study(study_name=name, storage=storage).trials:
        assert t.user_attrs["fold_iterations"] == [16, 16]
        assert set(t.user_attrs["separate"]) >= {"map_at_r", "precision_at_1"}
    res = mlflow_source.load("tiny", tmp_path / "lb", tracking_uri=str(root / "mlruns"))
    table = pd.read_csv(folds_sweep["results"] / "finals.csv")
    assert sorted(res.cells) == sorted(set(table[table.state == "COMPLETE"].cell))
    for cell in res.cells:
        want = table[table["cell"] == cell].sort_values("seed")["map_at_r"].to_numpy()
        assert res.values(cell, "map_at_r") == pytest.approx(want), cell


@pytest.mark.slow
def test_the_fold_models_stop_early_on_their_own_folds(tmp_path, data_root) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(_folds(stopping=STOPPING))
    outcome = run_protocol(path, _options(tmp_path, data_root))
    assert outcome.manifest["refused"] == {}
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    name = next(n for n in optuna.get_all_study_names(storage) if n.endswith(":triplet+batch_hard:final"))
    lengths = [t.user_attrs["fold_iterations"] for t in optuna.load_study(study_name=name, storage=storage).trials]
    assert all(len(f) == 2 and all(4 <= i <= 16 and i % 4 == 0 for i in f) for f in lengths)
    finals = outcome.finals
    mine = finals[finals.cell == "triplet+batch_hard:concatenated"].sort_values("seed")
    assert list(mine.iterations) == [sum(f) for f in lengths]


def test_budget_check_refuses_folds_in_one_line(tmp_path) -> None:
    from bench.sweep.budget_check import budget_check

    with pytest.raises(BenchError, match="final.mode folds") as e:
        budget_check(parse_protocol(_folds()), results_dir=tmp_path)
    assert "\n" not in str(e.value)


def test_collapse_inverts_expand() -> None:
    the_plan = plan(parse_protocol(_folds()))
    metrics = metric_names(the_plan.protocol.spec.evaluation)
    row = {"cell": "triplet+batch_hard", "seed": 0, "state": "COMPLETE", **{m: 0.5 for m in metrics}}
    row["separate"] = {m: 0.25 for m in metrics}
    wide = expand_evaluations(the_plan, [row])
    assert [r["cell"] for r in wide] == ["triplet+batch_hard:concatenated", "triplet+batch_hard:separate"]
    assert wide[1]["map_at_r"] == 0.25 and wide[0]["map_at_r"] == 0.5
    (back,) = collapse_evaluations(the_plan, [{k: v for k, v in r.items() if k != "separate"} for r in wide])
    assert back["cell"] == "triplet+batch_hard" and back["map_at_r"] == 0.5 and back["separate"]["map_at_r"] == 0.25


def test_a_cells_own_id_never_ends_like_an_evaluation() -> None:
    assert trained_cell("triplet+batch_hard") == "triplet+batch_hard"
    with pytest.raises(BenchError):
        parse_protocol(_folds().replace("{name: triplet,", "{name: triplet, label: 'x:separate',"))


def test_tables_are_read_back_whole(folds_sweep, tmp_path) -> None:
    """Each final seed's two evaluations are two rows under two names (`<cell>:concatenated`, `<cell>:separate`):
    read back whole, with no duplicate (cell, seed); were they one name, the reader would refuse the table."""
    import shutil

    results = Path(folds_sweep["results"])
    read = tables.read(results)
    on_disk = pd.read_csv(results / "finals.csv")
    assert len(read["finals"]) == len(on_disk) and list(read["finals"]["cell"]) == list(on_disk["cell"])
    finals = read["finals"]
    cell = "triplet+batch_hard"
    for evaluation in ("concatenated", "separate"):
        assert sorted(finals.loc[finals["cell"] == f"{cell}:{evaluation}", "seed"]) == [0, 1], evaluation
    assert not finals.duplicated(["cell", "seed"]).any()
    assert len(read["trials"]) == len(pd.read_csv(results / "trials.csv"))
    # the same rows under one name: two values for one (cell, seed), refused in one line
    copy = tmp_path / "tiny"
    shutil.copytree(results, copy)
    on_disk["cell"] = on_disk["cell"].str.replace(":separate", ":concatenated")
    on_disk.to_csv(copy / "finals.csv", index=False)
    with pytest.raises(BenchError, match=re.escape(f"duplicate rows for cell {cell}:concatenated, seed 0")):
        tables.read(copy)


@pytest.mark.slow
def test_the_kept_model_is_the_fold_models_joined(folds_sweep, data_root) -> None:
    """final.keep_models under final.mode folds: the model read back is every fold model concatenated, and
    its embeddings are the ones the concatenated score was taken on."""
    from bench.sweep.kept import load_final

    kept = load_final(str(folds_sweep["root"] / "mlruns"), folds_sweep["path"], "triplet+batch_hard", 1)
    assert isinstance(kept.model, Concatenated) and len(kept.model.parts) == 2 and len(kept.losses) == 2
    x, y = kept.embeddings["x"], kept.embeddings["y"]
    assert x.shape[1] == 2 * parse_protocol(folds_sweep["path"].read_text()).doc["model"]["embedding_dim"]
    finals = pd.read_csv(folds_sweep["results"] / "finals.csv").set_index(["cell", "seed"])
    recorded = finals.loc[("triplet+batch_hard:concatenated", 1), "map_at_r"]
    assert retrieval_metrics(x, y, ks=(1, 2))["map_at_r"] == pytest.approx(recorded, abs=1e-6)
    prepared = prepare(parse_protocol(folds_sweep["path"].read_text()), str(data_root))
    again = embed(kept.model, prepared.test.x, normalize=True)
    assert torch.allclose(again, torch.as_tensor(x), atol=1e-4)


def test_plan_counts_the_concatenation_as_metrics_only() -> None:
    """Under final.mode folds each fold model embeds the test set once; the concatenation joins the kept
    embeddings (a one-set test side), so a dearer embedding adds final_runs embeddings a final seed, not 2x."""
    from bench.plan.cost import LAKE_IMAGES, dataset_size, estimate_cell
    from bench.plan.types import TrunkCost
    from bench.spec.schema import image_hw

    protocol = parse_protocol(_folds())
    p = plan(protocol)
    cell = p.cells[0]
    doc = protocol.doc
    h, w = image_hw(doc["data"]["image_size"])
    _, train_images = dataset_size(doc["data"]["train"], doc["data"]["train_classes"])
    _, test_images = dataset_size(doc["data"]["test"], doc["data"]["test_classes"])
    assert test_images > 0 and p.budget.final_runs == 2
    est = [estimate_cell(protocol, cell, p.budget, TrunkCost((0.1, 0.1), e, ref_pixels=h * w)).low_s for e in (1, 2)]
    val_images = train_images / doc["data"]["validation"]["folds"]
    tuning = p.budget.tuning_runs * val_images  # no early stopping, no pruner checks: one validation a run
    finals = p.budget.final_count * p.budget.final_runs * (test_images + LAKE_IMAGES)  # Lake's runs: embedded too
    assert est[1] - est[0] == pytest.approx(tuning + finals)
