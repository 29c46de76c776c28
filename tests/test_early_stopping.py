"""training.early_stopping: the trainer's best checkpoint and patience, the protocol field, a real tiny sweep."""

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

from bench.cli import main
from bench.data import LabeledData, load
from bench.errors import BenchError
from bench.plan import plan
from bench.protocol import parse_protocol
from bench.reports import maximum
from bench.sweep.budget_audit import audit
from bench.sweep.records import Records
from bench.sweep.runner import run_protocol
from bench.sweep.tuning import final_iterations, open_storage
from bench.training import EarlyStopping, TrainConfig, train

SHORT = "patience: 1, check_every: 2"  # the sweep's: a check every other step, stopped at the first miss
STOPPING = "early_stopping: {metric: map_at_r, patience: 2, check_every: 5, max_iterations: ITERATIONS}"


@pytest.fixture(scope="module")
def omniglot(data_root: Path) -> LabeledData:
    background = load("omniglot:background", data_root, 14)
    return background.subset(background.classes[:12])


def quick(**changes) -> TrainConfig:
    base = dict(trunk="mlp", embedding_dim=16, loss="triplet", miner="batch_hard", P=4, K=4, iterations=50, seed=0)
    return TrainConfig(**{**base, **changes})


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_stops_after_patience_checks_and_returns_the_best_checkpoint(omniglot) -> None:
    scores = iter([0.1, 0.5, 0.3, 0.2, 0.9])  # best at the 2nd check (10); 15 and 20 do not improve: stop at 20
    seen: dict[int, list[torch.Tensor]] = {}

    def score(it: int, model: torch.nn.Module) -> float:
        seen[it] = _params(model)
        return next(scores)

    result = train(quick(), omniglot, early_stopping=EarlyStopping(check_every=5, patience=2, score=score))
    assert sorted(seen) == [5, 10, 15, 20]
    assert result.iterations == 20 and result.best_iteration == 10 and result.samples_seen == 20 * 16
    assert all(torch.equal(a, b) for a, b in zip(_params(result.model), seen[10]))
    assert not all(torch.equal(a, b) for a, b in zip(seen[10], seen[20]))  # it did train on after the best
    assert not result.model.training


def test_a_run_that_keeps_improving_trains_the_whole_budget(omniglot) -> None:
    rising = iter(range(100))
    result = train(
        quick(iterations=20), omniglot, early_stopping=EarlyStopping(5, 1, lambda it, model: float(next(rising)))
    )
    assert result.iterations == 20 and result.best_iteration == 20
    assert train(quick(iterations=20), omniglot).best_iteration is None  # no early stopping: none recorded


def test_the_score_may_prune(omniglot) -> None:
    def prune(it: int, model: torch.nn.Module) -> float:
        raise optuna.TrialPruned()

    with pytest.raises(optuna.TrialPruned):
        train(quick(), omniglot, early_stopping=EarlyStopping(5, 2, prune))


def test_stop_after_trains_the_first_iterations_of_the_longer_run(omniglot) -> None:
    short = train(quick(iterations=10), omniglot)
    cut = train(quick(iterations=30), omniglot, stop_after=10)
    assert cut.iterations == 10 and cut.samples_seen == 10 * 16
    assert all(torch.equal(a, b) for a, b in zip(_params(short.model), _params(cut.model)))


# --------------------------------------------------------------------------- the protocol field


def _tiny(iterations: int = 20, stopping: str = STOPPING, pruner: str = "") -> str:
    text = RUNNER_TINY.replace("ITERATIONS}", "ITERATIONS, " + stopping + "}" if stopping else "ITERATIONS}")
    if pruner:
        text = text.replace("tuning: {trials: 2}", "tuning: {trials: 2, pruner: " + pruner + "}")
    return text.replace("ITERATIONS", str(iterations))


def test_absent_early_stopping_keeps_the_hash() -> None:
    plain = parse_protocol(_tiny(stopping=""))
    assert parse_protocol(_tiny(stopping="early_stopping: null")).hash == plain.hash
    assert parse_protocol(_tiny()).hash != plain.hash


@pytest.mark.parametrize(
    "stopping, pruner, message",
    [
        (STOPPING.replace("max_iterations: ITERATIONS", "max_iterations: 40"), "", "max_iterations: expected"),
        (STOPPING.replace("check_every: 5", "check_every: 50"), "", "check_every: expected at most"),
        (STOPPING, "{type: median, check_every: 4}", "pruner.check_every: expected training.early_stopping"),
        (STOPPING.replace("map_at_r", "nmi"), "", "metric: expected one of"),
        (STOPPING.replace("patience: 2, ", ""), "", "patience: missing"),
    ],
)
def test_bad_early_stopping_is_refused_in_one_line(stopping: str, pruner: str, message: str) -> None:
    with pytest.raises(BenchError, match=message):
        parse_protocol(_tiny(stopping=stopping, pruner=pruner))


def test_a_pruner_is_told_the_early_stopping_checks() -> None:
    protocol = parse_protocol(_tiny(pruner="{type: median}"))
    assert protocol.doc["tuning"]["pruner"]["check_every"] == 5


def test_final_iterations_are_the_mean_best_checkpoint_in_checks() -> None:
    protocol = parse_protocol(_tiny())
    assert final_iterations(protocol, [10, 20]) == 15
    assert final_iterations(protocol, [5, 10]) in (5, 10)  # 7.5 rounds to a whole number of checks
    assert final_iterations(protocol, [1]) == 5  # at least one check
    assert final_iterations(protocol, []) is None
    assert final_iterations(parse_protocol(_tiny(stopping="")), [10]) is None


# --------------------------------------------------------------------------- a sweep


@pytest.mark.slow
def test_a_sweep_early_stops_trials_on_their_fold_and_finals_to_the_best_trials_length(
    tmp_path, data_root, capsys
) -> None:
    path = tmp_path / "tiny.yaml"
    text = _tiny(iterations=40, stopping=STOPPING.replace("patience: 2, check_every: 5", SHORT))
    # batch-hard's cell first: its runs stop soonest, so the check must reorder the cells, the longest first
    path.write_text(text.replace("[{name: none}, {name: batch_hard}]", "[{name: batch_hard}, {name: none}]"))
    protocol = parse_protocol(path.read_text())
    assert [c.id for c in plan(protocol).cells][:2] == ["triplet+batch_hard", "triplet+none"]
    outcome = run_protocol(path, _options(tmp_path, data_root))
    assert outcome.manifest["refused"] == {}  # the audit takes the budget as the most a run may use
    trials, finals = outcome.trials, outcome.finals
    done = trials[trials.state == "COMPLETE"]
    assert len(done) and (done.iterations <= done.budget_iterations).all()
    assert (done.iterations % 2 == 0).all()  # every run stops at a check
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    names = optuna.get_all_study_names(storage)  # keyed by the data too: found by the cell's suffix
    stopped_early = False
    for cell in plan(protocol).cells:
        (name,) = [n for n in names if n.endswith(f":{cell.id}")]
        study = optuna.load_study(study_name=name, storage=storage)
        complete = [t for t in study.trials if t.state.name == "COMPLETE"]
        if not complete:
            continue
        for t in complete:
            assert len(t.user_attrs["best_iterations"]) == 1  # one fold used
            assert t.user_attrs["best_iterations"][0] <= t.user_attrs["iterations"]
            stopped_early |= t.user_attrs["iterations"] < 40
        best = max(complete, key=lambda t: (t.value, -t.user_attrs["slot"]))
        want = final_iterations(protocol, best.user_attrs["best_iterations"])
        mine = finals[(finals.cell == cell.id) & (finals.state == "COMPLETE")]
        assert len(mine) and (mine.iterations == want).all(), cell.id
    assert stopped_early  # patience 1, 20 checks: some run stopped before the budget
    # trials.csv keeps each fold's best checkpoint; a cell is ended by its maximum when its chosen trial's
    # patience (one check of 2) had not run out at 40: its best checkpoint was the last check
    assert (done.best_iterations.map(json.loads).map(len) == 1).all()
    ended_at_max = {
        cell.id: max(
            (t for t in optuna.load_study(study_name=n, storage=storage).trials if t.state.name == "COMPLETE"),
            key=lambda t: (t.value, -t.user_attrs["slot"]),
        ).user_attrs["best_iterations"][0]
        == 40
        for cell in plan(protocol).cells
        for n in names
        if n.endswith(f":{cell.id}") and cell.id in set(finals.cell)
    }

    # its budget check trains each cell's seeds twice as long as the cell's finals trained, and counts that
    # length (not twice the protocol's maximum) in its progress
    stores = ["--storage", f"sqlite:///{tmp_path / 'optuna.db'}", "--tracking-uri", str(tmp_path / "mlruns")]
    capsys.readouterr()
    check = ["budget-check", str(path), "--results-dir", str(tmp_path / "results"), *stores]
    assert main([*check, "--data-root", str(data_root), "--threads", "1", "--quiet"]) == 0
    rows = pd.read_csv(tmp_path / "results" / "tiny" / "budget_check.csv")
    assert len(rows) and (rows.iterations < 2 * 40).any()  # a cell's finals stopped early: the check too
    for cell, group in rows.groupby("cell"):
        assert (group.iterations == 2 * finals[finals.cell == cell].iterations.max()).all(), cell
    lines = [line for line in capsys.readouterr().err.splitlines() if " x2 seed " in line]
    assert len(lines) == len(rows) and lines[-1].endswith("| 100% of iterations, ~0:00:00 left"), lines
    trained = [int(re.search(r"\[(\d+) it,", line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert trained == sorted(trained, reverse=True), lines  # the longest cells first
    # the leaderboard says what the check trained: each cell's finals' length twice, not one length for all
    assert main(["leaderboard", str(tmp_path / "results" / "tiny")]) == 0
    lengths = f"{rows.iterations.min():,}-{rows.iterations.max():,} iterations a run, 2x each cell's finals"
    out = capsys.readouterr().out
    assert f"at 2x the budget ({lengths}, the same final seeds)" in out
    hit = sorted(c for c, v in ended_at_max.items() if v)
    assert f"ended by a maximum rather than by early stopping: {len(hit)} of {len(ended_at_max)} cells" in out

    # under --stop-after a worker starts no seed that would end past its limit at this device's recorded pace:
    # the longest cell's x2 rows say it took 1,000 s an iteration here, so at 3x it is left (exit 4, said so)
    # and the shorter cells, whose rows give their real pace, are trained
    longest = rows.loc[rows.iterations.idxmax(), "cell"]
    slow = rows.copy()
    slow.loc[slow.cell == longest, "wall_time_s"] = 1000.0 * slow.iterations
    slow.to_csv(tmp_path / "results" / "tiny" / "budget_check.csv", index=False)
    capsys.readouterr()
    x3 = [*check, "--multiple", "3", "--data-root", str(data_root), "--threads", "1", "--quiet"]
    assert main([*x3, "--stop-after", "900"]) == 4  # room for the short cells on a loaded machine
    err = capsys.readouterr().err
    seeds = len(rows[rows.cell == longest])
    assert f"stopped at --stop-after with work left: {seeds} seed(s)" in err, err
    tripled = pd.read_csv(tmp_path / "results" / "tiny" / "budget_check.csv").query("multiple == 3")
    assert longest not in set(tripled.cell) and set(tripled.cell) == set(rows.cell) - {longest}, tripled
    assert main(x3) == 0  # without a limit the same command trains what was left
    tripled = pd.read_csv(tmp_path / "results" / "tiny" / "budget_check.csv").query("multiple == 3")
    assert set(tripled.cell) == set(rows.cell)


def _ended(folds: int, trials: list[dict]) -> dict:
    from bench.reports.source import Results

    protocol = parse_protocol(_tiny(iterations=40))  # patience 2 checks of 5: a fold best at b stops at b + 10
    cells = sorted({t["cell"] for t in trials})
    finals = pd.DataFrame([{"cell": c, "seed": 0, "state": "COMPLETE", "map_at_r": 0.5} for c in cells])
    manifest = {
        "protocol": "tiny",
        "protocol_hash": protocol.hash,
        "protocol_text": protocol.text,
        "primary_metric": "map_at_r",
        "budget": {"early_stopping": True, "folds": folds},
    }
    frame = pd.DataFrame([{"state": "COMPLETE", "budget_iterations": 40 * folds} | t for t in trials])
    return maximum.ended(Results(Path("mem"), manifest, finals, frame))


def test_a_cell_is_ended_by_its_maximum_when_its_chosen_trials_patience_had_not_run_out() -> None:
    found = _ended(
        1,
        [
            # the chosen trial (best value) was best at 35: its patience would have run out at 45, past 40
            {"cell": "a", "trial": 0, "value": 0.6, "iterations": 40, "best_iterations": "[35]"},
            {"cell": "a", "trial": 1, "value": 0.4, "iterations": 20, "best_iterations": "[10]"},
            # best at 30: stopped by patience at exactly 40, the maximum not needed
            {"cell": "b", "trial": 0, "value": 0.6, "iterations": 40, "best_iterations": "[30]"},
            # another trial ran to the maximum, but the chosen one stopped at 25
            {"cell": "c", "trial": 0, "value": 0.7, "iterations": 25, "best_iterations": "[15]"},
            {"cell": "c", "trial": 1, "value": 0.3, "iterations": 40, "best_iterations": "[40]"},
            # tables without best checkpoints: one fold that trained its whole maximum
            {"cell": "d", "trial": 0, "value": 0.5, "iterations": 40},
            # successive halving: the chosen trial is the best of the largest budget, not the best value
            {"cell": "e", "trial": 0, "value": 0.9, "iterations": 20, "best_iterations": "[20]"},
            {
                "cell": "e",
                "trial": 1,
                "value": 0.5,
                "iterations": 70,
                "best_iterations": "[70]",
                "budget_iterations": 80,
            },
        ],
    )
    assert {c: e.hit for c, e in found.items()} == {"a": True, "b": False, "c": False, "d": True, "e": False}
    assert found["a"].maximum == 40 and found["e"].maximum == 80
    text = maximum.sentence(found)
    assert text.startswith("ended by a maximum rather than by early stopping: 2 of 5 cells (a at 40, d at 40)")


def test_with_several_folds_each_folds_checkpoint_counts_and_a_missing_one_is_unknown() -> None:
    found = _ended(
        2,
        [
            {"cell": "a", "trial": 0, "value": 0.6, "iterations": 75, "best_iterations": "[35, 10]"},
            {"cell": "b", "trial": 0, "value": 0.6, "iterations": 80},  # both folds trained 40
            {"cell": "c", "trial": 0, "value": 0.6, "iterations": 60},  # 40 + 20 or 30 + 30: not known
        ],
    )
    assert (found["a"].by_maximum, found["a"].folds, found["a"].unknown) == (1, 2, 0)
    assert "1 of its chosen trial's 2 folds reached 40 iterations" in found["a"].describe()
    assert "every fold of its chosen trial (2) reached 40" in found["b"].describe()
    assert (found["b"].by_maximum, found["c"].by_maximum, found["c"].unknown) == (2, 0, 2)
    assert maximum.sentence(found).endswith("; not known for c (their tables lack each fold's best checkpoint)")


def test_the_audit_refuses_a_short_complete_trial_only_without_early_stopping() -> None:
    protocol = parse_protocol(_tiny(iterations=40, stopping=""))
    stopped = parse_protocol(_tiny(iterations=40))
    for p, refused in ((protocol, True), (stopped, False)):
        the_plan = plan(p)
        records = Records()
        for cell in the_plan.cells:
            for slot in range(2):
                records.trials.append(
                    {"cell": cell.id, "trial": slot, "state": "COMPLETE", "iterations": 15, "samples_seen": 15 * 16}
                    | {"budget_iterations": 40}
                )
            records.finals += [
                {"cell": cell.id, "seed": s, "state": "COMPLETE", "iterations": 15, "samples_seen": 15 * 16}
                for s in (0, 1)
            ]
        assert bool(audit(the_plan, records)) is refused
