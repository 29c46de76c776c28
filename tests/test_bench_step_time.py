"""benchmarks/bench_step_time.py: its A/B against the plain loop runs against the code as it is now (the GPU
checks' Conv-4 part once failed on a lent GPU because the optimiser choice it swaps out had moved)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _shared import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # real training in a child process
def test_the_plain_loop_comparison_runs_and_reports_a_ratio(data_root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_step_time.py", "--device", "cpu", "--compare", "1", "--iterations", "3",
         "--threads", "1", "--data-root", str(data_root)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r"plain loop ([\d.]+) ms a step, the loop ([\d.]+) ms; ratio ([\d.]+)", done.stdout)
    assert found, done.stdout
    plain, loop, ratio = map(float, found.groups())
    assert plain > 0 and loop > 0 and abs(ratio - loop / plain) < 0.01


def test_the_plain_loop_swaps_both_departures_and_restores_them() -> None:
    from bench import training
    from bench.cell import build

    script = load_script("benchmarks/bench_step_time.py")
    batches, fused = training._batches, build._fused
    with script._plain_loop():
        assert training._batches is not batches and build._fused is not fused
        assert build._fused([{"params": [], "device": "cuda"}]) is False  # the default optimiser, never fused
    assert training._batches is batches and build._fused is fused
