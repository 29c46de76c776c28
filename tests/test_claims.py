"""`dmlbench claims`: decision rules, verdicts on a real tiny sweep, the shipped claims, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as st

from _sweeps import CELLS, sweep, sweep_base, sweep_copy  # noqa: F401  (fixtures)
from bench.cli import main
from bench.reports import claims
from bench.reports.source import Results

REPO = Path(__file__).resolve().parents[1]


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dmlbench: error: "), err
    return err[0]


def _results(values: dict[str, list[float]]) -> Results:
    """A results table held in memory (per-seed values given), for the decision rules alone."""
    rows = [{"cell": c, "seed": s, "map_at_r": v, "val_map_at_r": 0.5} for c, vs in values.items() for s, v in enumerate(vs)]
    return Results(Path("mem"), {"protocol": "p", "protocol_hash": "h", "primary_metric": "map_at_r"}, pd.DataFrame(rows))


def _verdict(kind: str, values: dict[str, list[float]], **fields) -> str:
    cf = claims.ClaimsFile(Path("c.yaml"), "p", None, None, 0.01, [])
    return claims.judge({"id": "x", "source": "s", "kind": kind, **fields}, _results(values), cf).verdict


@pytest.mark.parametrize(
    "a, b, beats",
    [
        ([0.60, 0.61, 0.62], [0.50, 0.51, 0.52], "supported"),      # interval above 0
        ([0.50, 0.51, 0.52], [0.60, 0.61, 0.62], "contradicted"),   # B better
        ([0.500, 0.501, 0.502], [0.500, 0.501, 0.502], "contradicted"),  # equivalent within 0.01
        ([0.40, 0.60, 0.55], [0.50, 0.45, 0.52], "inconclusive"),   # too noisy
        ([0.70], [0.50, 0.51, 0.52], "inconclusive"),               # one seed
    ],
)
def test_beats_and_its_complement(a: list[float], b: list[float], beats: str) -> None:
    got = _verdict("beats", {"A": a, "B": b}, a="A", b="B")
    assert got == beats
    flip = {"supported": "contradicted", "contradicted": "supported", "inconclusive": "inconclusive"}
    assert _verdict("no_better", {"A": a, "B": b}, a="A", b="B") == flip[beats]


def test_within_spread_and_references() -> None:
    close = {"A": [0.50, 0.51, 0.52], "B": [0.51, 0.52, 0.53], "C": [0.505, 0.515, 0.51]}
    assert _verdict("within", close, a="A", b="B", points=0.05) == "supported"
    assert _verdict("within", close, a="A", b="B", points=0.001) == "inconclusive"
    far = {**close, "D": [0.80, 0.81, 0.82]}
    assert _verdict("spread", close, cells=["A", "B", "C"], below=0.05) == "supported"
    assert _verdict("spread", far, cells=["A", "B", "D"], below=0.05) == "contradicted"
    assert _verdict("reaches", close, cell="A", value=0.49) == "supported"  # lo = +0.02 - 0.0248
    assert _verdict("reaches", close, cell="A", value=0.60) == "contradicted"
    ref = dict(metric="map_at_r", reference="people", unit="percent")
    assert _verdict("against_reference", close, cell="A", value=95.5, expect="below", **ref) == "supported"
    assert _verdict("against_reference", close, cell="A", value=95.5, expect="above", **ref) == "contradicted"
    assert _verdict("against_reference", close, cell="A", value=51.0, expect="above", **ref) == "inconclusive"


def _claims_file(path: Path, protocol: str, results: Path | None = None, **extra) -> Path:
    doc = {
        "protocol": protocol,
        "claims": [
            {"id": "bh-beats-ba", "kind": "beats", "a": "triplet+batch_hard", "b": "triplet+batch_all", "source": "Hermans et al. 2017"},
            {"id": "contrastive-no-better", "kind": "no_better", "a": "contrastive+none", "b": "triplet+batch_hard", "source": "t"},
            {"id": "within", "kind": "within", "a": "contrastive+none", "b": "triplet+batch_all", "points": 0.05, "source": "t"},
            {"id": "spread", "kind": "spread", "cells": list(CELLS), "below": 0.05, "source": "Musgrave et al. 2020"},
            {"id": "people", "kind": "against_reference", "cell": "best", "metric": "lake_accuracy", "value": 95.5,
             "unit": "percent", "reference": "people", "expect": "below", "source": "Lake et al. 2015"},
        ],
        **extra,
    }
    if results is not None:
        doc["results"] = str(results)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_verdicts_on_a_real_sweep(sweep_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    cf = _claims_file(tmp_path / "c.yaml", manifest["protocol"])
    assert main(["claims", str(cf), "--results", str(sweep_copy)]) == 0
    out = json.loads((sweep_copy / "claims.json").read_text())
    md = (sweep_copy / "claims.md").read_text()
    assert "| **" in md and manifest["protocol_hash"] in md
    finals = pd.read_csv(sweep_copy / "finals.csv")
    per = {c: finals.loc[finals["cell"] == c].sort_values("seed") for c in CELLS}
    got = {v["id"]: v for v in out["verdicts"]}
    assert set(got) == {"bh-beats-ba", "contrastive-no-better", "within", "spread", "people"}
    # Effect sizes and intervals recomputed independently (scipy's Welch) from the per-seed rows.
    a, b = per["triplet+batch_hard"]["map_at_r"], per["triplet+batch_all"]["map_at_r"]
    ci = st.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    v = got["bh-beats-ba"]
    assert v["effect"] == pytest.approx(a.mean() - b.mean())
    assert (v["ci_low"], v["ci_high"]) == pytest.approx((ci.low, ci.high))
    rule = "supported" if ci.low > 0 else "contradicted" if ci.high < 0.01 else "inconclusive"
    assert v["verdict"] == rule
    assert v["n_seeds"] == {"triplet+batch_hard": 3, "triplet+batch_all": 3}
    rec = v["records"]
    assert rec["protocol_hash"] == manifest["protocol_hash"] and rec["results_file"].endswith("finals.csv")
    assert rec["seeds"]["triplet+batch_hard"] == sorted(per["triplet+batch_hard"]["seed"].tolist())
    assert rec["values"]["triplet+batch_hard"] == pytest.approx(a.tolist())
    # "best" is chosen on validation, and the reference is compared as a fraction.
    val = finals.groupby("cell")["val_map_at_r"].mean()
    best = got["people"]["records"]["cells"][0]
    assert val[best] == val.max()
    lake = per[best]["lake_accuracy"]
    assert got["people"]["effect"] == pytest.approx(lake.mean() - 0.955)
    for v in out["verdicts"]:
        assert v["verdict"] in ("supported", "contradicted", "inconclusive")
    printed = capsys.readouterr().out
    assert all(k in printed for k in got)


def test_results_dir_from_the_claims_file(sweep_copy: Path, tmp_path: Path) -> None:
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    cf = _claims_file(tmp_path / "c.yaml", manifest["protocol"], results=sweep_copy)
    assert main(["claims", str(cf), "--out", str(tmp_path / "o")]) == 0
    assert len(json.loads((tmp_path / "o" / "claims.json").read_text())["verdicts"]) == 5


def test_shipped_claims_name_planned_cells() -> None:
    """Every cell the omniglot-quick claims name is a cell that protocol plans."""
    from bench.plan import plan
    from bench.protocol import load_protocol

    cf = claims.parse(REPO / "protocols" / "claims" / "omniglot-quick.yaml")
    proto = load_protocol(REPO / "protocols" / f"{cf.protocol}.yaml")
    planned = {c.id for c in plan(proto).cells}
    named = set()
    for c in cf.claims:
        named |= {c.get("a"), c.get("b"), c.get("cell"), *c.get("cells", [])} - {None, "best"}
    assert named and named <= planned, named - planned
    kinds = {c["kind"] for c in cf.claims}
    assert {"beats", "no_better", "spread", "against_reference"} <= kinds


def test_bad_claims_are_one_line_errors(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = json.loads((sweep / "manifest.json").read_text())
    good = yaml.safe_load(_claims_file(tmp_path / "g.yaml", manifest["protocol"]).read_text())
    out = ["--results", str(sweep), "--out", str(tmp_path / "o")]

    bad = {**good, "claims": [{**good["claims"][0], "a": "triplet+nothing"}]}
    (tmp_path / "b1.yaml").write_text(yaml.safe_dump(bad))
    assert main(["claims", str(tmp_path / "b1.yaml"), *out]) == 2
    assert "no cell 'triplet+nothing'" in _error_line(capsys)

    bad = {**good, "claims": [{k: v for k, v in good["claims"][0].items() if k != "b"}]}
    (tmp_path / "b2.yaml").write_text(yaml.safe_dump(bad))
    assert main(["claims", str(tmp_path / "b2.yaml"), *out]) == 2
    assert "claims[0]" in _error_line(capsys)

    (tmp_path / "b3.yaml").write_text("protocol: [unclosed\n")
    assert main(["claims", str(tmp_path / "b3.yaml"), *out]) == 2
    assert "not readable YAML" in _error_line(capsys)

    (tmp_path / "b4.yaml").write_text(yaml.safe_dump({**good, "protocol": "omniglot-quick"}))
    assert main(["claims", str(tmp_path / "b4.yaml"), *out]) == 2
    assert "holds results of" in _error_line(capsys)

    assert main(["claims", str(tmp_path / "g.yaml"), "--results", str(tmp_path / "nope")]) == 2
    assert "does not exist" in _error_line(capsys)
    assert main(["claims", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in _error_line(capsys)
    assert not (tmp_path / "o").exists()
