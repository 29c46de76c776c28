"""What a result was trained on: the CPU (model, AMX, avx512_bf16) and the torch thread count, in every manifest
and on every MLflow run; a sweep resumed with another thread count says so, and lists each part (real runs)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import torch
from _shared import MINIMAL

from bench.cli import main
from bench.devices import cpu_model
from bench.stores import provenance

XEON = """\
processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu vme sse avx512f avx512_bf16 amx_bf16 amx_tile
processor	: 1
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu vme sse avx512f avx512_bf16 amx_bf16 amx_tile
"""
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC 7763 64-Core Processor\nflags\t\t: fpu sse avx2 avx512f\n"
ONE_CELL = MINIMAL.replace("miners: [{name: none}, {name: batch_hard}]", "miners: [{name: none}]")
assert ONE_CELL != MINIMAL
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\n"  # no model name, no flags line


def test_the_cpu_is_read_from_cpuinfo() -> None:
    assert provenance.cpu(XEON) == {"model": "Intel(R) Xeon(R) Platinum 8480+", "amx_bf16": True, "avx512_bf16": True}
    assert provenance.cpu(EPYC) == {"model": "AMD EPYC 7763 64-Core Processor", "amx_bf16": False, "avx512_bf16": False}
    arm = provenance.cpu(ARM)
    assert arm["amx_bf16"] is None and arm["avx512_bf16"] is None and arm["model"]  # unknown flags: not "no"


def _run(root: Path, data_root: Path, threads: int) -> int:
    return main(
        [
            "run",
            str(root / "tiny.yaml"),
            "--results-dir",
            str(root / "results"),
            "--storage",
            f"sqlite:///{root / 'optuna.db'}",
            "--tracking-uri",
            str(root / "mlruns"),
            "--data-root",
            str(data_root),
            "--threads",
            str(threads),
            "--quiet",
        ]
    )


@pytest.mark.slow
def test_the_manifest_and_mlflow_record_the_cpu_and_threads_and_a_resume_with_other_threads_warns(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = torch.get_num_threads()
    try:
        (tmp_path / "tiny.yaml").write_text(ONE_CELL)
        assert _run(tmp_path, data_root, 1) == 0
        manifest = json.loads((tmp_path / "results" / "tiny" / "manifest.json").read_text())
        here = provenance.cpu()
        assert manifest["threads"] == 1
        (part,) = manifest["hardware"]
        assert part["cpu"] == here["model"] and part["threads"] == 1
        assert (part["amx_bf16"], part["avx512_bf16"]) == (here["amx_bf16"], here["avx512_bf16"])
        with sqlite3.connect(tmp_path / "mlruns" / "mlflow.db") as db:
            tags = pd.read_sql("select run_uuid, key, value from tags", db)
        runs = tags["run_uuid"].nunique()
        for key, want in (("dmlbench.cpu", here["model"]), ("dmlbench.threads", "1")):
            got = tags[tags["key"] == key]
            assert len(got) == runs and (got["value"] == want).all(), key
        assert (tags[tags["key"] == "dmlbench.amx_bf16"]["value"] == str(here["amx_bf16"]).lower()).all()
        assert "--threads" not in capsys.readouterr().err  # one thread count so far: nothing to say

        # a cell added with 2 threads: one warning line, and both parts listed
        (tmp_path / "tiny.yaml").write_text(MINIMAL)
        assert _run(tmp_path, data_root, 2) == 0
        err = [line for line in capsys.readouterr().err.splitlines() if "--threads" in line]
        assert len(err) == 1 and "trains with 2 thread(s)" in err[0] and "so far with 1" in err[0], err
        manifest = json.loads((tmp_path / "results" / "tiny" / "manifest.json").read_text())
        assert manifest["threads"] == 2 and [p["threads"] for p in manifest["hardware"]] == [1, 2]
        model = cpu_model()  # as every record's `device` names the CPU
        assert [p["device"] for p in manifest["hardware"]] == [f"cpu: {model} (1 thread)", f"cpu: {model} (2 threads)"]
        assert not any("device_override" in p for p in manifest["hardware"])
    finally:
        torch.set_num_threads(before)
