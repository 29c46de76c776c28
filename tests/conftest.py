"""Shared fixtures: the real Omniglot files, a private cache, one thread per worker; the slow marks."""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Two cores and `pytest -n 2`: one intra-op thread per worker avoids oversubscription.
torch.set_num_threads(1)

# Temporary folders on a RAM file system where the machine has one with room (set before pytest makes its
# base folder, and inherited by the xdist workers and every subprocess): the tests' Optuna and MLflow
# SQLite stores fsync on each commit, milliseconds apiece on a virtual disk against a tenth of one on
# tmpfs, and a session commits tens of thousands of times (benchmarks/README.md has the measurement).
# Nothing a test checks needs data to outlive the machine: a kill -9 leaves the page cache, so resume
# tests see what they would on disk. A TMPDIR already set wins.
RAM_TMP = Path("/dev/shm")
RAM_TMP_ROOM = 8 << 30  # a whole session writes ~3 GiB


def _ram_temp_root() -> None:
    if "TMPDIR" in os.environ or not (RAM_TMP.is_dir() and os.access(RAM_TMP, os.W_OK)):
        return
    stat = os.statvfs(RAM_TMP)
    if stat.f_bavail * stat.f_frsize < RAM_TMP_ROOM:
        return
    root = RAM_TMP / f"dmlbench-tests-{os.getuid()}"
    root.mkdir(mode=0o755, exist_ok=True)
    os.environ["TMPDIR"] = str(root)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


_ram_temp_root()


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
        # sweeps run through `main(...)` with arguments of their own, and runs trained to compare bit for bit
        "test_a_sweep_run_in_chunks_ends_with_the_tables_of_one_run",
        "test_a_trial_still_running_at_the_limit_is_given_back",
        "test_a_device_override_is_recorded_in_the_manifest",
        "test_train_equals_the_bare_loop_bit_for_bit_on_the_cpu",
        "test_a_sweep_with_the_cache_or_augmenting_on_the_device_records_what_one_without_records",
        "test_run_after_the_swap_trains_anew_and_never_reports_the_old_table",
        "test_changed_data_at_the_same_path_is_a_new_version_never_the_old_table",
        "test_a_second_run_on_the_same_stores_says_it_trained_nothing",
        "test_classes_below_the_minimum_are_dropped_counted_said_once_and_recorded",
        "test_classes_below_K_are_drawn_with_replacement_said_once_and_recorded",
        "test_a_protocol_over_a_csv_listing_runs_and_no_query_finds_itself",
        "test_train_takes_class_lists_split_and_threads",
        "test_train_prints_and_records_the_untrained_floor_beside_its_score",
        "test_short_run_beats_the_untrained_model",
        "test_train_command_ranks_a_learned_metric_run_by_g_and_its_floor_too",
        "test_dmlbench_train_records_its_augment",
        "test_train_command_diverged_run_exits_1_and_is_recorded_failed",
        "test_bf16_run_trains_in_bf16_with_channels_last",
        # every image of the published zips decoded, or every shipped protocol's cells stepped once
        "test_real_background_zip_equals_the_npz_arrays",
        "test_cache_hit_is_equal_and_corrupt_cache_is_rebuilt",
        "test_every_cell_of_the_shipped_protocols_passes_the_method_check",
        "test_validate_times_the_precision_with_the_threads_it_is_given",
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


# The longest test files (a minute to five of one worker each on a 2-core CPU: benchmarks/README.md), longest
# first: `make test` hands whole files to its two workers (`--dist loadfile`: a file's module fixtures, sweeps
# of a minute, are built once) and, with `--no-loadscope-reorder`, in this order (xdist would otherwise order
# files by their count of tests), the next file to a worker as it frees; so these run first, and no long file
# met last keeps one worker busy while the other idles. The files whose sweeps run in several processes at
# once (the long run's, the halving sweeps', the kill-and-resume and server tests) are interleaved with files
# that train in one process, so that they seldom meet: two of them at once put six processes on two cores,
# and each ran 1.4-3x longer than beside a one-process file.
FIRST = (
    "tests/test_smoke.py",
    "tests/sweep/test_runner.py",
    "tests/protocol/test_field_protocols.py",
    "tests/stores/test_faults.py",
    "tests/sweep/test_halving.py",
    "tests/test_long_run.py",
    "tests/test_training.py",
    "tests/test_bad_inputs.py",
    "tests/test_gpu_chunk.py",
    "tests/sweep/test_stop_after.py",
    "tests/data/test_own_data.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "slow" in item.keywords:
            continue
        name = getattr(item, "originalname", item.name)
        if name in SLOW_TESTS or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or _calls_a_sweep(item):
            item.add_marker(pytest.mark.slow)
    rank = {path: i for i, path in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(FIRST)))  # stable: files stay whole
