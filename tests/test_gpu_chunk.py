"""scripts/gpu_chunk.sh, run on the CPU (DEVICE=cpu): two workers sweep a tiny protocol on a stores folder,
the records come back packed where $OUT says, and unpacked elsewhere they hold the finished sweep's tables.
What a lent GPU's call does, but for the device (its one untested part: `--device cuda`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
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


def _lease_root(tmp_path: Path) -> Path:
    """A checkout's stand-in for scripts/gpu_prepare.sh and scripts/gpu_lease.sh, which work in runs/gpu and
    checkpoints/ of the checkout they lie in: this repository's scripts and package, its own folders."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", root / "scripts")
    (root / "bench").symlink_to(ROOT / "bench")
    (root / ".whl").mkdir()
    (root / ".whl" / "none-needed").write_text("this environment has the dependencies: no wheels to install\n")
    return root


@pytest.mark.slow  # real training in child processes
def test_a_lease_restores_the_checkpoint_it_travels_with(tmp_path: Path, data_root: Path) -> None:
    protocol = tmp_path / "tiny.yaml"
    protocol.write_text(RUNNER_TINY.replace("ITERATIONS", "10"))
    here, out, root = tmp_path / "here", tmp_path / "out", _lease_root(tmp_path)
    env = {
        **os.environ,
        "DMLBENCH_DATA": str(data_root),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # python3: this environment's
    }
    records = ["--storage", f"sqlite:///{here / 'optuna.db'}", "--tracking-uri", str(here / "mlflow.db")]
    sweep = [sys.executable, "-m", "bench", "run", str(protocol), *records, "--results-dir", str(here / "results")]
    assert (
        subprocess.run([*sweep, "--threads", "1", "--quiet"], cwd=ROOT, env=env).returncode == 1
    )  # the diverging cell
    pack = [sys.executable, "scripts/stores_pack.py"]
    checkpoint = root / "checkpoints" / "tiny"
    assert subprocess.run([*pack, "checkpoint", str(here), str(checkpoint)], cwd=ROOT).returncode == 0
    prepare = ["bash", "scripts/gpu_prepare.sh", "tiny", str(here), str(here / "results")]
    # a worker still writing to the stores (its command line names them): refused, nothing made
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"sqlite:///{here}/optuna.db"])
    try:
        done = subprocess.run(prepare, cwd=root, env=env, capture_output=True, text=True)
    finally:
        writer.kill()
        writer.wait()
    assert done.returncode == 2 and "stop them first" in done.stderr, done.stdout + done.stderr
    assert not (root / "runs").exists()
    done = subprocess.run(prepare, cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # the stores are the checkpoint's, which travels in the checkout: no copy beside it
    assert (root / "runs/gpu/stores.from").read_text().strip() == "checkpoints/tiny"
    assert not (root / "runs/gpu/stores.tgz").exists() and (root / "runs/gpu/data/omniglot").is_dir()
    lease_env = {**env, "DEVICE": "cpu", "WORKERS": "1", "CHECK": "2", "SKIP_CHECKS": "1", "OUT": str(out)}
    lease = ["bash", "scripts/gpu_lease.sh", str(protocol), "400"]
    done = subprocess.run(lease, cwd=root, env=lease_env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]  # the budget check, done
    assert subprocess.run([*pack, "unpack", str(out), str(here)], cwd=ROOT).returncode == 0  # the stores it left
    checked = pd.read_csv(here / "results" / "tiny" / "budget_check.csv")
    assert set(checked["iterations"]) == {20} and len(checked) >= 4, checked
    # stores that went on since: the checkpoint follows them, and travels in their place
    done = subprocess.run(prepare, cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "refreshed" in done.stdout, done.stdout + done.stderr
    assert json.loads((checkpoint / "checkpoint.json").read_text())["checked"] == len(checked)
    assert (root / "runs/gpu/stores.from").exists() and not (root / "runs/gpu/stores.tgz").exists()
    # a run with no checkpoint: a compressed copy of its stores travels
    shutil.rmtree(checkpoint)
    done = subprocess.run(prepare, cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (root / "runs/gpu/stores.from").exists()
    with tarfile.open(root / "runs/gpu/stores.tgz") as tar:
        names = set(tar.getnames())
    assert {"./optuna.db", "./mlflow.db", "./results/tiny/budget_check.csv"} <= names, names
