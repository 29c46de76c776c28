"""Shared fixtures: the real Omniglot files, a private cache, one thread per worker; the slow marks."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Two cores and `pytest -n 2`: one intra-op thread per worker avoids oversubscription.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """Where Omniglot lies: $DMLBENCH_DATA or ../shared/data (never copied into the repo)."""
    root = Path(os.environ.get("DMLBENCH_DATA", SHARED_DATA))
    if not (root / "omniglot" / "images_background.zip").exists():
        pytest.fail(f"Omniglot not found under {root}: tests need the real data")
    return root


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Preprocessed-tensor cache per test session, so tests never read a stale user cache."""
    os.environ["DMLBENCH_CACHE"] = str(tmp_path_factory.mktemp("cache"))


# What trains for real or starts a server: the session's and modules' sweeps (`_sweeps.sweep` and its
# copies, tuning repeats, final folds, the cell-key story, the budget check over the sweep) and the
# PostgreSQL and MLflow servers. A test that takes one of these fixtures is `slow`, as is one that calls a
# sweep itself (`run_sweep`, `_dmlbench("run", ...)`) or is named in SLOW_TESTS; `make test-fast` leaves them
# out, `make test` runs them.
SLOW_FIXTURES = frozenset(
    {
        "sweep",
        "sweep_base",
        "sweep_copy",
        "sweeps",
        "folds_sweep",
        "story",
        "checked",
        "mlflow_server",
        "postgres",
        "pg",
    }
)
SLOW_CALLS = ("run_sweep(", '_dmlbench("run"')
# tests that train end to end or run a sweep through a helper of their own (the slowest of the rest)
SLOW_TESTS = frozenset(
    {
        "test_plugins_run_a_sweep_survive_a_second_worker_and_reach_the_leaderboard",
        "test_sigterm_during_run_exits_130",
        "test_a_jpeg_folder_protocol_runs_through_dmlbench_run",
        "test_train_command_end_to_end",
        "test_train_command_precision_schedule_and_geometry_reach_the_run",
        "test_a_sweep_with_a_damaged_weights_file_refuses_before_recording",
        "test_a_run_on_a_folder_pool_split_by_fraction_gives_a_leaderboard",
        "test_a_query_gallery_protocol_over_two_folders_runs_to_a_leaderboard",
        "test_plain_script_trains_a_few_iterations_reproducibly",
        "test_the_sides_it_takes_are_those_the_forward_pass_takes",  # BN-Inception at 269 input sides
    }
)


def _calls_a_sweep(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return False
    body = source[source.find("def ") :]  # the body, not the decorators' parameter lists
    return any(call in body for call in SLOW_CALLS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "slow" in item.keywords:
            continue
        name = getattr(item, "originalname", item.name)
        if name in SLOW_TESTS or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or _calls_a_sweep(item):
            item.add_marker(pytest.mark.slow)
