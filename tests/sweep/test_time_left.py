"""The time left under early stopping: paced by iterations trained, each unfinished run expected to train what
the finished runs of its kind trained of their allotment (`bench.sweep.accounts.Expected`)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from _shared import RUNNER_TINY
from _shared import sweep_options as _options
from optuna.trial import TrialState

from bench.protocol import parse_protocol
from bench.sweep.accounts import Expected
from bench.sweep.progress import Progress
from bench.sweep.records import collect
from bench.sweep.runner import Sweep, run_protocol
from bench.sweep.tuning import open_storage

STOPPING = "early_stopping: {metric: map_at_r, patience: 1, check_every: 4, max_iterations: 32}"


def test_runs_that_stop_early_are_paced_by_what_they_trained() -> None:
    out = io.StringIO()
    p = Progress(n_cells=2, total_iterations=1000, done_iterations=0, quiet=True, stream=out)
    p.recorded(0, 0, 1000)
    p.start -= 100.0
    p.run_started(400)
    p.iteration(100, 400, 0.5)
    p.run_finished()  # stopped at 100 of its 400: the share counts the allotment
    p.recorded(400, 100, 300)  # the store: 100 trained; the runs left are expected to train 300
    p.trial("triplet+none", 0, 2, "COMPLETE", 0.5, "map_at_r", 100, 100.0)
    # 100 trained in 100 s, 300 to train: 5 minutes (the allotment's pace would say 600 x 0.25 s = 2:30)
    assert out.getvalue().rstrip().endswith("| 40% of iterations, ~0:05:00 left"), out.getvalue()
    p.run_started(400)
    p.iteration(100, 400, 0.5)  # the running run's iterations are trained and no longer left
    assert p.eta() == "50% of iterations, ~0:01:40 left"  # 200 in 100 s, 200 left


def test_a_resumed_run_is_paced_by_what_this_process_trained() -> None:
    p = Progress(n_cells=1, total_iterations=1000, done_iterations=0, quiet=True, stream=io.StringIO())
    p.recorded(0, 0, 1000)
    p.start -= 100.0
    p.run_started(1000)
    p.resumed(600)  # an earlier attempt trained 600 of them (`bench.resume.RunState`)
    p.iteration(700, 1000, 0.5)
    # 100 trained here in 100 s, 300 left: 5 minutes (counting the earlier 600 as trained here would say 0:00:43)
    assert p.eta() == "70% of iterations, ~0:05:00 left"
    p.run_finished()  # early-stopped at 700 of its 1,000
    p.recorded(1000, 700, 1000)  # recorded: 700 trained, 600 of them earlier; 1,000 expected of the next runs
    assert p.eta() == "100% of iterations, ~0:16:40 left"  # still 100 trained here in 100 s


def _run(iterations: int | None, state: TrialState = TrialState.COMPLETE) -> SimpleNamespace:
    return SimpleNamespace(state=state, user_attrs={} if iterations is None else {"iterations": iterations})


def test_each_unfinished_run_is_scaled_by_its_own_kind() -> None:
    e = Expected()
    e.unit(("trial", 100), None, 100, _run(100))  # a rung of 100 trained to its end
    e.unit(("trial", 300), None, 300, _run(150))  # a rung of 300 stopped at half
    e.unit(("final", "a"), "final", 1000, _run(200))  # cell a's seeds stop at a fifth
    e.unit(("final", "a"), "final", 1000, _run(None, TrialState.FAIL))  # killed: no count, no share
    e.unit(("final", "b"), "final", 1000, _run(400))  # cell b's at two fifths
    e.unit(("trial", 100), None, 100, _run(3, TrialState.FAIL))  # diverged at once: trained, no share
    e.unit(("trial", 100), None, 100, None)  # 100
    e.unit(("trial", 300), None, 300, _run(None, TrialState.RUNNING))  # 150
    e.unit(("trial", 900), None, 900, None)  # no rung of 900 finished: its allotment, 900
    e.unit(("final", "a"), "final", 1000, None)  # cell a's own: 200
    e.unit(("final", "c"), "final", 1000, None)  # none of cell c's: every cell's, 600 of 2000 -> 300
    assert e.trained == 100 + 150 + 200 + 400 + 3
    assert e.left() == 100 + 150 + 900 + 200 + 300


@pytest.mark.slow
def test_unfinished_runs_are_expected_to_train_as_the_finished_runs_of_their_kind(tmp_path, data_root) -> None:
    text = RUNNER_TINY.replace("ITERATIONS", "32").replace("iterations: 32}", f"iterations: 32, {STOPPING}}}")
    text = text.replace("lr: 1.0e-3", "lr: 1.0e-7")  # validation barely moves: runs stop at their first checks
    protocol = parse_protocol(text)
    root = tmp_path / "run"
    run_protocol(protocol, _options(root, data_root, cells=("triplet+none",)))  # one cell of three
    records = collect(Sweep(protocol, _options(root, data_root)).plan, open_storage(f"sqlite:///{root / 'optuna.db'}"))
    trials = [r for r in records.trials if r["cell"] == "triplet+none"]
    finals = [r for r in records.finals if r["cell"] == "triplet+none"]
    assert len(trials) == 2 and len(finals) == 2
    trial_share = sum(r["iterations"] for r in trials) / (2 * 32)
    final_share = sum(r["iterations"] for r in finals) / (2 * 32)
    assert trial_share < 1 and final_share < 1  # early stopping ended runs: the estimate has something to scale

    sweep = Sweep(protocol, _options(root, data_root))
    sweep.setup()
    counts = sweep._done_iterations()
    assert counts.finished == {"triplet+none"}
    assert counts.done == 4 * 32  # allotments
    assert counts.trained == sum(r["iterations"] for r in trials + finals)
    # the two other cells: 2 trials and 2 final seeds each, scaled by triplet+none's shares
    assert counts.left == round(2 * (2 * 32 * trial_share + 2 * 32 * final_share))
