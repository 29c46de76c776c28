"""scripts/workers_per_device.py: trials per hour of one sweep at several worker counts, each sweep bounded by
--seconds; a count that finishes no trial is said, and the exit is 1, never a ratio of nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _shared import RUNNER_TINY_TRIPLET

ROOT = Path(__file__).resolve().parents[1]


def _measure(protocol: Path, data_root: Path, seconds: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "scripts/workers_per_device.py", "--protocol", str(protocol), "--workers", "1", "2"]
    env = {**os.environ, "DMLBENCH_DATA": str(data_root)}
    return subprocess.run([*argv, "--seconds", seconds], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.slow  # real sweeps in child processes
def test_each_count_sweeps_within_its_seconds(tmp_path: Path, data_root: Path) -> None:
    protocol = tmp_path / "tiny.yaml"
    protocol.write_text(RUNNER_TINY_TRIPLET.replace("ITERATIONS", "10"))
    done = _measure(protocol, data_root, "120")  # time enough for the whole tiny sweep
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == ["1", "2"] and all(int(r[1]) > 0 for r in rows), done.stdout
    done = _measure(protocol, data_root, "0.001")  # no trial can end in a millisecond: none is claimed
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no trial finished with 1 worker(s) in the time given (--seconds)" in done.stdout
    assert "ZeroDivisionError" not in done.stderr
