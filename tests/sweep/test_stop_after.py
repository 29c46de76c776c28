"""`dmlbench run --stop-after SECONDS`: a sweep run in chunks of wall time ends with the tables of one run.

Each chunk stops claiming trials and final seeds once the longest it has run
would end past the limit, gives back one still running at the limit, prints
what remains and exits 4; the same command resumes.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pandas as pd
import pytest
from _shared import RUNNER_TINY_TRIPLET, run_args

from bench.cli import main
from bench.commands.run import EXIT_STOPPED, remaining_line
from bench.sweep.tables import read


def _tables(root: Path) -> dict[str, pd.DataFrame]:
    tables = read(root / "results" / "tiny")
    return {
        name: tables[name].drop(columns=[c for c in tables[name].columns if c == "wall_time_s"])
        for name in ("trials", "finals", "summary")
    }


def test_a_sweep_run_in_chunks_ends_with_the_tables_of_one_run(tmp_path, data_root, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(RUNNER_TINY_TRIPLET.replace("ITERATIONS", "150"))
    assert main(run_args(path, tmp_path / "whole", data_root)) == 0
    whole = _tables(tmp_path / "whole")
    began = time.perf_counter()
    assert main(run_args(path, tmp_path / "whole", data_root)) == 0  # nothing left: what a chunk costs besides units
    overhead = time.perf_counter() - began
    capsys.readouterr()
    # a chunk shorter than its start-up and one trial or seed gives that unit back and never advances, and one
    # longer than start-up and all eight units trains them all and stops with the floor alone; so a chunk is
    # that start-up (with a margin for noise) and two and a half units, measured on this machine now. The median
    # unit: the whole run's first unit also warmed the process up (8x the others on a fast CPU, where a chunk
    # sized by it, or the 4 s floor there was, held the whole sweep)
    units = read(tmp_path / "whole" / "results" / "tiny")
    walls = sorted(float(w) for name in ("trials", "finals") for w in units[name]["wall_time_s"])
    chunk = f"{1.25 * overhead + 2.5 * walls[len(walls) // 2]:.1f}"

    codes, lines = [], []
    for _ in range(40):
        codes.append(main(run_args(path, tmp_path / "chunked", data_root, "--stop-after", chunk)))
        err = capsys.readouterr().err
        lines += [line for line in err.splitlines() if "stopped at --stop-after" in line]
        if codes[-1] != EXIT_STOPPED:
            break
    assert codes[-1] == 0 and set(codes[:-1]) == {EXIT_STOPPED} and len(codes) >= 2, codes
    assert len(lines) == len(codes) - 1
    training = [line for line in lines if "iterations" in line]  # then, perhaps, the floor's seeds alone
    # a chunk that a load spike left without a finished unit says so; every other says to resume
    assert training and all("rerun the same command to resume" in x or "nothing finished" in x for x in training)
    assert all("untrained floor" in line for line in lines[len(training) :]), lines
    left = [int(re.search(r"([\d,]+) of [\d,]+ iterations", line).group(1).replace(",", "")) for line in training]
    assert left == sorted(left, reverse=True) and left[-1] > 0, lines  # never went back
    chunked = _tables(tmp_path / "chunked")
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(frame, chunked[name], check_like=False)


def test_a_stopped_run_says_what_is_left_and_when_it_may_end() -> None:
    left = {
        "cells": 2,
        "of_cells": 3,
        "trials": 4,
        "seeds": 6,
        "iterations": 12_000,
        "of_iterations": 30_000,
        "estimated_s": 3725.0,
    }
    line = remaining_line("tiny", left)
    assert "2 of 3 cells, 4 trials and 6 final seeds, 12,000 of 30,000 iterations" in line
    assert "about 1 h 02 min" in line
    stuck = remaining_line("tiny", {**left, "estimated_s": None})
    assert "unknown: nothing finished in this chunk" in stuck and "--stop-after longer than one trial" in stuck
    assert "untrained floor" in remaining_line("tiny", {**left, "cells": 0, "trials": 0, "seeds": 0})


@pytest.mark.parametrize(
    "option,value,word",
    [
        ("--stop-after", "0", "--stop-after"),
        ("--stop-after", "-1", "--stop-after"),
        ("--stop-after", "soon", "--stop-after"),
        ("--device", "tpu9", "device"),
    ],
)
def test_a_bad_time_limit_or_device_is_one_line_and_exit_2(tmp_path, data_root, capsys, option, value, word):
    path = tmp_path / "tiny.yaml"
    path.write_text(RUNNER_TINY_TRIPLET.replace("ITERATIONS", "5"))
    assert main(run_args(path, tmp_path, data_root, option, value)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0], err
    assert not (tmp_path / "optuna.db").exists()


def test_a_device_override_is_recorded_in_the_manifest(tmp_path, data_root):
    import json

    path = tmp_path / "tiny.yaml"
    path.write_text(RUNNER_TINY_TRIPLET.replace("ITERATIONS", "5").replace("P: 4, K: 4,", "P: 4, K: 4, device: cuda,"))
    code = main(run_args(path, tmp_path, data_root, "--device", "cpu"))
    assert code == 0
    manifest = json.loads((tmp_path / "results" / "tiny" / "manifest.json").read_text())
    assert manifest["device_override"] == "cpu"
    assert "device: cuda" in manifest["protocol_text"]  # the file as written, its hash unchanged
    (part,) = manifest["hardware"]  # the part itself names where it trained, whoever writes the manifest next
    assert part["device_override"] == "cpu" and part["device"].startswith("cpu: ")
    # the finished sweep started again elsewhere (two threads): it claims nothing, so it is no part of the result
    assert main(run_args(path, tmp_path, data_root, "--device", "cpu", "--threads", "2")) == 0
    again = json.loads((tmp_path / "results" / "tiny" / "manifest.json").read_text())
    assert again["finished"] and again["hardware"] == [part]


def test_a_trial_still_running_at_the_limit_is_given_back(tmp_path, data_root, capsys):
    """A trial far longer than the limit: stopped at the limit, its slot given back (no RUNNING trial is
    left for another worker to wait on), nothing recorded as done, and the rerun's claim re-asks it."""
    import sqlite3

    path = tmp_path / "tiny.yaml"
    path.write_text(RUNNER_TINY_TRIPLET.replace("ITERATIONS", "5"))
    assert main(run_args(path, tmp_path / "warm", data_root)) == 0  # imports and data warm: the limit is the trial's
    capsys.readouterr()
    path.write_text(RUNNER_TINY_TRIPLET.replace("ITERATIONS", "100000"))
    assert main(run_args(path, tmp_path, data_root, "--stop-after", "20")) == EXIT_STOPPED
    err = capsys.readouterr().err
    assert "2 of 2 cells, 4 trials and 4 final seeds" in err and "unknown" in err, err
    with sqlite3.connect(tmp_path / "optuna.db") as db:
        states = dict(db.execute("select state, count(*) from trials group by state").fetchall())
    assert states.get("RUNNING", 0) == 0 and states.get("COMPLETE", 0) == 0 and states.get("FAIL", 0) >= 1, states
