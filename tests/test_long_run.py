"""scripts/long_run.sh: a sweep that outlives its machine. Two workers start, a checkpoint is taken while they
train, they stop; the stores are lost with the machine, and the same `start` restores the checkpoint and finishes
the sweep to the tables of an uninterrupted run. Stores older than the checkpoint are refused, and so is a second
start."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from _shared import RUNNER_TINY, cli, trials_in_state

from bench.sweep.tables import read

ROOT = Path(__file__).resolve().parents[1]


def _long_run(action: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/long_run.sh", action, "tiny"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # two real workers, twice
def test_a_run_restored_from_its_checkpoint_finishes(tmp_path: Path, data_root: Path) -> None:
    protocol, checkpoints, stores = tmp_path / "tiny.yaml", tmp_path / "checkpoints", tmp_path / "stores"
    protocol.write_text(RUNNER_TINY.replace("ITERATIONS", "1500"))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    (checkpoints / "tiny").mkdir(parents=True)
    (checkpoints / "tiny" / "run.env").write_text(
        f"PROTOCOL={protocol}\nCOMMIT={commit}\nTREE=.\nSTORES={stores}\nWORKERS=2\nTHREADS=1\nCHECK=2\n"
    )
    env = {
        **os.environ,
        "CHECKPOINTS": str(checkpoints),
        "STAGGER_S": "1",
        "NICE": "0",  # not behind the other tests of a parallel run
        "DMLBENCH_DATA": str(data_root),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # python3: this environment's
    }
    clean = tmp_path / "clean"
    reference = cli(
        ["run", str(protocol), "--storage", f"sqlite:///{clean / 'optuna.db'}", "--tracking-uri",
         str(clean / "mlflow.db"), "--results-dir", str(clean / "results"), "--data-root", str(data_root),
         "--threads", "1", "--quiet"]
    )  # fmt: skip  # the uninterrupted run, alongside
    assert _long_run("start", env).returncode == 0
    try:
        again = _long_run("start", env)
        assert again.returncode == 2 and "running already" in again.stderr
        deadline = time.monotonic() + 120
        while trials_in_state(stores / "optuna.db", "COMPLETE") < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(50):  # until one is taken mid-training, as a session's checkpoint mostly is
            done = _long_run("checkpoint", env)
            assert done.returncode == 0, done.stderr
            summary = json.loads((checkpoints / "tiny" / "checkpoint.json").read_text())
            if summary["trials"].get("RUNNING", 0) >= 1:
                break
            time.sleep(0.1)
    finally:
        assert _long_run("stop", env).returncode == 0
    assert summary["trials"]["COMPLETE"] >= 3 and summary["trials"].get("RUNNING", 0) >= 1
    unfinished = _long_run("finish", env)  # only a finished run is ever committed
    assert unfinished.returncode == 2 and "the sweep has not finished" in unfinished.stderr
    shutil.copytree(stores, tmp_path / "earlier")  # what this machine had when the checkpoint was taken
    shutil.rmtree(stores)  # the machine is gone
    assert _long_run("start", env).returncode == 0  # restored, resumed
    deadline = time.monotonic() + 300
    while "workers \n" not in _long_run("status", env).stdout and time.monotonic() < deadline:
        time.sleep(1)
    manifest = json.loads((stores / "results" / "tiny" / "manifest.json").read_text())
    assert manifest["finished"]
    finals = pd.read_csv(stores / "results" / "tiny" / "finals.csv")
    assert {"triplet+none", "triplet+batch_hard"} <= set(finals.loc[finals["state"] == "COMPLETE", "cell"])
    # the finished sweep's workers went on with the budget check, a shard each: every final seed once, at 2x
    checked = pd.read_csv(stores / "results" / "tiny" / "budget_check.csv")
    done = finals.loc[finals["state"] == "COMPLETE", ["cell", "seed"]]
    assert sorted(map(tuple, checked[["cell", "seed"]].values)) == sorted(map(tuple, done.values))
    assert (checked["state"] == "COMPLETE").all() and (checked["multiple"] == 2).all()
    assert (checked["iterations"] == 2 * 1500).all()
    assert checked["device"].str.startswith("cpu: ").all()  # where each seed of the check trained
    parts = [p for p in manifest["hardware"] if p.get("kind") == "budget_check"]
    assert len(parts) == 2 and all(p["multiple"] == 2 for p in parts)  # both shards' parts, beside the sweep's
    logs = [(stores / f"w{i}.log").read_text() for i in (1, 2)]
    assert all(" x2 seed " in log for log in logs), logs  # both shards trained
    reference.communicate(timeout=300)
    assert reference.returncode == 1  # finished; the diverging cell has no result
    a, b = read(clean / "results" / "tiny"), read(stores / "results" / "tiny")
    for name in ("trials", "finals", "summary"):
        pd.testing.assert_frame_equal(*(f[name].drop(columns=["wall_time_s"], errors="ignore") for f in (a, b)))
    assert _long_run("checkpoint", env).returncode == 0
    shutil.rmtree(stores)
    (tmp_path / "earlier").rename(stores)  # a later session on the first machine finds its old stores
    stale = _long_run("start", env)
    assert stale.returncode == 2 and "behind the checkpoint" in stale.stderr
    # stores with every trial but fewer budget-check seeds than the checkpoint are behind it too
    shutil.rmtree(stores)
    assert _long_run("start", env).returncode == 0  # restored: the sweep and the check are done, nothing trains
    deadline = time.monotonic() + 120
    while "workers \n" not in _long_run("status", env).stdout and time.monotonic() < deadline:
        time.sleep(1)
    rows = pd.read_csv(stores / "results" / "tiny" / "budget_check.csv")
    rows.iloc[:-1].to_csv(stores / "results" / "tiny" / "budget_check.csv", index=False)
    stale = _long_run("start", env)
    assert stale.returncode == 2 and f"{len(rows) - 1} budget-check seeds here, {len(rows)}" in stale.stderr
    # finish: refused while the check lacks a seed, then the results copied whole, with their leaderboard
    committed = {**env, "RESULTS": str(tmp_path / "committed")}
    short = _long_run("finish", committed)
    assert short.returncode == 2 and f"lacks 1 of {len(rows)} final seeds" in short.stderr
    assert not (tmp_path / "committed").exists()
    rows.to_csv(stores / "results" / "tiny" / "budget_check.csv", index=False)
    done = _long_run("finish", committed)
    assert done.returncode == 0, done.stderr  # the diverging cell failed every trial: its labelled row says so
    assert "contrastive-diverging" in (tmp_path / "committed" / "tiny" / "leaderboard.md").read_text()
    out = tmp_path / "committed" / "tiny"
    assert "remove" in done.stdout and (out / "leaderboard.md").is_file() and (out / "leaderboard.html").is_file()
    assert not (out / "resume").exists() and not list(out.rglob("*.lock"))
    kept = {p.relative_to(out) for p in out.rglob("*") if p.is_file()} - {
        Path("leaderboard.md"),
        Path("leaderboard.html"),
    }
    source = stores / "results" / "tiny"
    assert kept == {p.relative_to(source) for p in source.rglob("*") if p.is_file() and p.suffix != ".lock"
                    and "resume" not in p.relative_to(source).parts} - {Path("leaderboard.md"), Path("leaderboard.html")}  # fmt: skip
    pd.testing.assert_frame_equal(pd.read_csv(out / "budget_check.csv"), rows)
