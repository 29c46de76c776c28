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
# sweep itself (`run_sweep`, `dmlbench run`); `make test-fast` leaves them out, `make test` runs them.
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
SLOW_CALLS = ("run_sweep(", '_dmlbench("run"', '["run", ')


def _calls_a_sweep(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return False
    return any(call in source for call in SLOW_CALLS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "slow" in item.keywords:
            continue
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or _calls_a_sweep(item):
            item.add_marker(pytest.mark.slow)
