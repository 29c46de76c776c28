"""scripts/gpu_chunk.sh, run on the CPU (DEVICE=cpu): two workers sweep a tiny protocol on a stores folder,
the records come back packed where $OUT says, and unpacked elsewhere they hold the finished sweep's tables.
What a lent GPU's call does, but for the device (its one untested part: `--device cuda`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from _shared import RUNNER_TINY

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # real training in a child process
def test_a_chunk_of_two_workers_comes_back_packed(tmp_path: Path, data_root: Path) -> None:
    protocol = tmp_path / "tiny.yaml"
    protocol.write_text(RUNNER_TINY.replace("ITERATIONS", "10"))
    stores, out, here = tmp_path / "stores", tmp_path / "out", tmp_path / "here"
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "WORKERS": "2",
        "THREADS": "1",
        "OUT": str(out),
        "DMLBENCH_DATA": str(data_root),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # python3: this environment's
    }
    done = subprocess.run(
        ["bash", "scripts/gpu_chunk.sh", str(protocol), str(stores), "400"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # done, the diverging cell without a result
    assert "gpu_chunk: exit 1" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["stores.sha256", "stores.tgz.00"]
    unpack = [sys.executable, "scripts/stores_pack.py", "unpack", str(out), str(here)]
    assert subprocess.run(unpack, cwd=ROOT, capture_output=True, text=True).returncode == 0
    finals = pd.read_csv(here / "results" / "tiny" / "finals.csv")
    assert finals.equals(pd.read_csv(stores / "results" / "tiny" / "finals.csv"))
    assert set(finals["cell"]) >= {"triplet+none", "triplet+batch_hard"}
    manifest = json.loads((here / "results" / "tiny" / "manifest.json").read_text())
    # one finished sweep; a part for each worker that claimed a unit (the second, started 5 s later, may find
    # none left), each naming the device it was told to train on
    parts = manifest["hardware"]
    assert manifest["finished"] and 1 <= len(parts) <= 2 and all(p["device_override"] == "cpu" for p in parts), parts
