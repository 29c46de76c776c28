"""Shared fixtures: the real Omniglot files, a private cache, one thread per worker."""

from __future__ import annotations

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
