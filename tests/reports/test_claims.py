"""`dmlbench claims`: decision rules, verdicts on a real tiny sweep, the shipped claims, bad input."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from _shared import RUNNER_TINY
from _sweeps import CELLS, sweep, sweep_base, sweep_copy  # noqa: F401  (fixtures)
from scipy import stats as st

from bench.cli import main
from bench.errors import BenchError
from bench.protocol import parse_protocol
from bench.reports import claims
from bench.reports.claims.render import to_json
from bench.reports.source import Results

REPO = Path(__file__).resolve().parents[2]


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dmlbench: error: "), err
    return err[0]


def _results(
    values: dict[str, list[float]], seeds: dict[str, list[int]] | None = None, floor: list[float] | None = None
) -> Results:
    """A results table held in memory (per-seed values given, seeds 0.. unless named), for the decision rules alone."""
    seeds = seeds or {}
    rows = [
        {"cell": c, "seed": s, "map_at_r": v, "val_map_at_r": 0.5}
        for c, vs in values.items()
        for s, v in zip(seeds.get(c, range(len(vs))), vs)
    ]
    fl = None if floor is None else pd.DataFrame({"protocol_hash": "h", "seed": range(len(floor)), "map_at_r": floor})
    return Results(
        Path("mem"), {"protocol": "p", "protocol_hash": "h", "primary_metric": "map_at_r"}, pd.DataFrame(rows), floor=fl
    )


def _judge(kind: str, values: dict[str, list[float]], res: Results | None = None, **fields) -> claims.Verdict:
    cf = claims.ClaimsFile(Path("c.yaml"), "p", None, None, 0.01, [])
    return claims.judge({"id": "x", "source": "s", "kind": kind, **fields}, res or _results(values), cf)


def _verdict(kind: str, values: dict[str, list[float]], **fields) -> str:
    return _judge(kind, values, **fields).verdict


def _unpaired(values: dict[str, list[float]]) -> Results:
    """The same values as if every cell had run its own seeds: the rules with Welch's test."""
    return _results(values, seeds={c: [10 * i + k for k in range(len(v))] for i, (c, v) in enumerate(values.items())})


@pytest.mark.parametrize(
    "a, b, beats",
    [
        ([0.60, 0.61, 0.62], [0.50, 0.51, 0.52], "supported"),  # interval above 0
        ([0.50, 0.51, 0.52], [0.60, 0.61, 0.62], "contradicted"),  # B better
        ([0.500, 0.501, 0.502], [0.500, 0.501, 0.502], "contradicted"),  # equivalent within 0.01
        ([0.40, 0.60, 0.55], [0.50, 0.45, 0.52], "inconclusive"),  # too noisy
        ([0.40, 0.60, 0.55, 0.5], [0.50, 0.45, 0.52], "inconclusive"),  # too noisy (Welch: other seeds)
        ([0.70], [0.50, 0.51, 0.52], "not testable"),  # one seed: no test, refused
    ],
)
def test_beats_and_its_complement(a: list[float], b: list[float], beats: str) -> None:
    got = _verdict("beats", {"A": a, "B": b}, a="A", b="B")
    assert got == beats
    flip = {
        "supported": "contradicted",
        "contradicted": "supported",
        "inconclusive": "inconclusive",
        "not testable": "not testable",
    }
    assert _verdict("no_better", {"A": a, "B": b}, a="A", b="B") == flip[beats]


def test_within_spread_and_references() -> None:
    close = {"A": [0.50, 0.51, 0.52], "B": [0.51, 0.52, 0.53], "C": [0.505, 0.515, 0.51]}
    assert _judge("within", close, _unpaired(close), a="A", b="B", points=0.05).verdict == "supported"
    assert _judge("within", close, _unpaired(close), a="A", b="B", points=0.001).verdict == "inconclusive"
    # Paired, B - A is +0.01 at every seed: no spread, so the gap is certain and lies outside 0.001.
    assert _verdict("within", close, a="A", b="B", points=0.001) == "contradicted"
    far = {**close, "D": [0.80, 0.81, 0.82]}
    assert _judge("spread", close, _unpaired(close), cells=["A", "B", "C"], below=0.05).verdict == "supported"
    assert _judge("spread", far, _unpaired(far), cells=["A", "B", "D"], below=0.05).verdict == "contradicted"
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
            {
                "id": "bh-beats-ba",
                "kind": "beats",
                "a": "triplet+batch_hard",
                "b": "triplet+batch_all",
                "source": "Hermans et al. 2017",
            },
            {
                "id": "contrastive-no-better",
                "kind": "no_better",
                "a": "contrastive+none",
                "b": "triplet+batch_hard",
                "source": "t",
            },
            {
                "id": "within",
                "kind": "within",
                "a": "contrastive+none",
                "b": "triplet+batch_all",
                "points": 0.05,
                "source": "t",
            },
            {"id": "spread", "kind": "spread", "cells": list(CELLS), "below": 0.05, "source": "Musgrave et al. 2020"},
            {
                "id": "people",
                "kind": "against_reference",
                "cell": "best",
                "metric": "lake_accuracy",
                "value": 95.5,
                "unit": "percent",
                "reference": "people",
                "expect": "below",
                "source": "Lake et al. 2015",
            },
        ],
        **extra,
    }
    if results is not None:
        doc["results"] = str(results)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_verdicts_on_a_real_sweep(sweep_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (sweep_copy / "floor.csv").unlink(missing_ok=True)  # the rules alone here; the floor has its own tests
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    cf = _claims_file(tmp_path / "c.yaml", manifest["protocol"])
    assert main(["claims", str(cf), "--results", str(sweep_copy)]) == 0
    out = json.loads((sweep_copy / "claims-c.json").read_text())
    md = (sweep_copy / "claims-c.md").read_text()
    assert "| **" in md and manifest["protocol_hash"] in md
    finals = pd.read_csv(sweep_copy / "finals.csv")
    per = {c: finals.loc[finals["cell"] == c].sort_values("seed") for c in CELLS}
    got = {v["id"]: v for v in out["verdicts"]}
    assert set(got) == {"bh-beats-ba", "contrastive-no-better", "within", "spread", "people"}
    # Effect sizes and intervals recomputed independently from the per-seed rows: every cell ran the
    # same final seeds (common random numbers), so the test is scipy's paired t.
    a, b = per["triplet+batch_hard"]["map_at_r"], per["triplet+batch_all"]["map_at_r"]
    assert a.index.size == 3 and per["triplet+batch_hard"]["seed"].tolist() == per["triplet+batch_all"]["seed"].tolist()
    ci = st.ttest_rel(a.to_numpy(), b.to_numpy()).confidence_interval(0.95)
    v = got["bh-beats-ba"]
    assert v["test"] == "paired"
    assert v["effect"] == pytest.approx(a.mean() - b.mean())
    assert (v["ci_low"], v["ci_high"]) == pytest.approx((ci.low, ci.high))
    rule = "supported" if ci.low > 0 else "contradicted" if ci.high < 0.01 else "inconclusive"
    assert (rule == "inconclusive") == (v["p"] >= 0.05)  # the raw p is the interval rule
    assert v["p_holm"] >= v["p"] and v["verdict"] == (rule if v["p_holm"] < 0.05 else "inconclusive")
    assert "one tuning draw" in v["reason"] and "Holm-adjusted" in v["reason"]
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
        assert v["verdict"] in ("supported", "contradicted", "inconclusive", "not testable")
    printed = capsys.readouterr().out
    assert all(k in printed for k in got)


def test_the_best_cell_is_unknown_while_a_planned_cell_has_no_result(sweep_copy: Path, tmp_path: Path) -> None:
    """Results with a planned cell missing (an unfinished run, one job of a split sweep) judge the claims on the
    cells they have and none on "best": the best of the cells that have results is another claim. Once no cell
    has a completed seed, "best" is not testable either."""
    (sweep_copy / "floor.csv").unlink(missing_ok=True)
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    cf = _claims_file(tmp_path / "c.yaml", manifest["protocol"])

    def verdicts(out: str) -> dict[str, dict]:
        assert main(["claims", str(cf), "--results", str(sweep_copy), "--out", str(tmp_path / out), "-q"]) == 0
        return {v["id"]: v for v in json.loads((tmp_path / out / "claims-c.json").read_text())["verdicts"]}

    whole = verdicts("whole")
    best = whole["people"]["records"]["cells"][0]
    assert whole["people"]["verdict"] != "not testable"
    gone = next(c for c in CELLS if c != best)  # the best of the rest is the same cell: a verdict was possible
    finals = pd.read_csv(sweep_copy / "finals.csv")
    finals[finals["cell"] != gone].to_csv(sweep_copy / "finals.csv", index=False)
    (sweep_copy / "manifest.json").write_text(json.dumps({**manifest, "finished": None}))  # mid-sweep tables
    part = verdicts("part")
    assert part["people"]["verdict"] == "not testable"
    # said once above the verdicts too: the family Holm corrects over is the testable claims alone
    gap = f"1 planned cell(s) have no result ({gone}): claims on them are not testable, and Holm's correction"
    assert gap in (tmp_path / "part" / "claims-c.md").read_text()
    assert gap not in (tmp_path / "whole" / "claims-c.md").read_text()
    assert (
        f"the best cell of the grid is unknown: 1 planned cell(s) have no result ({gone})" in part["people"]["reason"]
    )
    for cid, v in part.items():
        named = set(v["records"]["cells"]) if "records" in v else set()
        if cid == "people":
            continue
        if gone in whole[cid]["records"]["cells"]:
            assert v["verdict"] == "not testable" and f"cell {gone} has no result" in v["reason"], v
        else:  # the same cells, the same effect and interval (Holm's correction counts fewer claims)
            assert named == set(whole[cid]["records"]["cells"]) and v["verdict"] != "not testable"
            assert (v["effect"], v["ci_low"], v["ci_high"]) == pytest.approx(
                (whole[cid]["effect"], whole[cid]["ci_low"], whole[cid]["ci_high"])
            )

    # A finished sweep whose cell failed every trial (a summary row with no seed): that cell's result is
    # known, it failed, and the best of the others is the grid's best.
    summary = pd.read_csv(sweep_copy / "summary.csv")
    summary.loc[summary["cell"] == gone, "n_seeds"] = 0
    summary.to_csv(sweep_copy / "summary.csv", index=False)
    (sweep_copy / "manifest.json").write_text(json.dumps(manifest))
    failed_cell = verdicts("failed-cell")
    assert failed_cell["people"]["verdict"] == whole["people"]["verdict"]
    assert failed_cell["people"]["records"]["cells"] == [best]
    for cid, v in failed_cell.items():
        if gone in whole[cid]["records"]["cells"]:
            assert (
                v["verdict"] == "not testable"
                and f"cell {gone} has no result: every tuning trial failed" in v["reason"]
            )

    # No completed seed in any cell: the command refuses the folder (exit 2), and a claim on "best" judged on
    # such results in memory is not testable rather than an error.
    (sweep_copy / "manifest.json").write_text(json.dumps({**manifest, "finished": None}))
    finals.assign(state="FAIL").to_csv(sweep_copy / "finals.csv", index=False)
    assert main(["claims", str(cf), "--results", str(sweep_copy), "--out", str(tmp_path / "none")]) == 2
    res = Results(sweep_copy, manifest, finals.assign(state="FAIL"))
    v = _judge("reaches", {}, res, cell="best", value=0.3)
    assert v.verdict == "not testable" and "the best cell of the grid is unknown: no cell has a result" in v.reason


def test_results_dir_from_the_claims_file(sweep_copy: Path, tmp_path: Path) -> None:
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    cf = _claims_file(tmp_path / "c.yaml", manifest["protocol"], results=sweep_copy)
    assert main(["claims", str(cf), "--out", str(tmp_path / "o")]) == 0
    assert len(json.loads((tmp_path / "o" / "claims-c.json").read_text())["verdicts"]) == 5


@pytest.mark.parametrize("path", sorted((REPO / "protocols" / "claims").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_claims_name_planned_cells(path: Path) -> None:
    """Every cell a shipped claims file names is a cell its protocol plans."""
    from bench.plan import plan
    from bench.protocol import load_protocol

    cf = claims.parse(path)
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

    # A cell the grid does not hold is a typo, as `run --cells` treats it: one line, exit 2, nothing written.
    bad = {**good, "claims": [{**good["claims"][0], "a": "triplet+nothing"}, good["claims"][1]]}
    (tmp_path / "b1.yaml").write_text(yaml.safe_dump(bad))
    assert main(["claims", str(tmp_path / "b1.yaml"), "--results", str(sweep), "--out", str(tmp_path / "o1")]) == 2
    line = _error_line(capsys)
    assert "claim bh-beats-ba: no cell 'triplet+nothing' in reports-tiny; cells: contrastive+none" in line, line
    assert not (tmp_path / "o1").exists()

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


def test_collapsed_missing_or_thin_cells_make_a_claim_not_testable() -> None:
    """A claim resting on a cell not significantly above the floor, absent, or on one seed is refused, with the reason."""
    values = {"A": [0.30, 0.32, 0.31], "B": [0.10, 0.11, 0.12], "C": [0.50]}
    floor = [0.095, 0.105, 0.125]  # the untrained trunk, same seeds: B is not above it
    res = _results(values, floor=floor)
    v = _judge("beats", values, res, a="A", b="B")
    assert v.verdict == "not testable" and "B is collapsed" in v.reason and math.isnan(v.p_raw)
    p = st.ttest_rel(values["B"], floor, alternative="greater").pvalue
    assert p >= 0.05 and f"{p:.3g}" in v.reason
    # A is far above the floor: a claim on A alone is judged.
    assert _judge("reaches", values, res, cell="A", value=0.31).verdict != "not testable"
    one = _judge("beats", values, res, a="A", b="C")
    assert one.verdict == "not testable" and "C has 1 completed final seed" in one.reason
    with pytest.raises(BenchError, match="claim x: no cell 'D' in p; cells: A, B, C"):  # a typo: exit 2
        _judge("beats", values, res, a="A", b="D")
    # Without a floor table nothing is collapsed.
    assert _judge("beats", values, a="A", b="B").verdict == "supported"


def test_a_barely_trained_cell_makes_a_claim_not_testable() -> None:
    """Significantly above the floor yet with a sliver of the best cell's gain: a failed training, refused."""
    floor = [0.020, 0.025, 0.030, 0.022, 0.028]
    values = {
        "best": [0.47, 0.46, 0.47, 0.46, 0.48],
        "mid": [0.15, 0.16, 0.14, 0.15, 0.16],
        "weak": [0.045, 0.052, 0.058, 0.047, 0.050],
    }
    res = _results(values, floor=floor)
    assert st.ttest_rel(values["weak"], floor, alternative="greater").pvalue < 0.05  # not collapsed
    v = _judge("beats", values, res, a="weak", b="best")
    share = (np.mean(values["weak"]) - np.mean(floor)) / (np.mean(values["best"]) - np.mean(floor))
    assert share < 0.25
    assert v.verdict == "not testable" and "weak is barely trained" in v.reason, v.reason
    assert f"{share:.0%} of the best cell's gain" in v.reason
    # A quarter or more of the best cell's gain ((0.152 - 0.025) / 0.443 = 29%): judged.
    assert _judge("beats", values, res, a="mid", b="best").verdict == "contradicted"


def test_paired_when_the_seeds_match_else_welch() -> None:
    a, b = [0.50, 0.60, 0.55], [0.47, 0.58, 0.51]  # seed effects shared: pairing removes them
    same = _judge("beats", {"A": a, "B": b}, a="A", b="B")
    ref = st.ttest_rel(a, b)
    assert same.test == "paired"
    assert (same.low, same.high) == pytest.approx(tuple(ref.confidence_interval(0.95)))
    assert same.p_raw == pytest.approx(2 * st.ttest_rel(a, b, alternative="greater").pvalue)
    other = _judge("beats", {"A": a, "B": b}, _results({"A": a, "B": b}, seeds={"B": [3, 4, 5]}), a="A", b="B")
    welch = st.ttest_ind(a, b, equal_var=False)
    assert other.test == "Welch"
    assert (other.low, other.high) == pytest.approx(tuple(welch.confidence_interval(0.95)))
    assert other.p_raw == pytest.approx(2 * st.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
    assert same.verdict == "supported" and other.verdict == "inconclusive"  # the same numbers, the right test


def _holm_reference(p: list[float]) -> list[float]:
    """Holm by its definition: reject H_(1..k) while p_(i) <= alpha / (m - i + 1); the adjusted p of
    H_(i) is the smallest alpha at which it is rejected, found by trying every candidate alpha."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    candidates = sorted({min(1.0, (m - r) * p[i]) for r, i in enumerate(order)} | {1.0})
    out = [1.0] * m
    for alpha in reversed(candidates):
        for r, i in enumerate(order):
            if p[i] * (m - r) > alpha + 1e-15:
                break
            out[i] = alpha
    return out


def test_holm_against_a_hand_computation_and_its_definition() -> None:
    from bench.stats import holm

    # By hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.01, math.nan, 0.2]) == pytest.approx([0.02, math.nan, 0.2], nan_ok=True)
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = list(rng.uniform(0, 0.2, size=rng.integers(1, 8)))
        assert holm(p) == pytest.approx(_holm_reference(p))


def test_holm_decides_the_verdicts_of_one_file() -> None:
    """Each claim alone is supported at 5%; judged together, Holm's step-down leaves the weaker two inconclusive."""
    values = {
        "A": [0.60, 0.62, 0.64],
        "B": [0.50, 0.51, 0.52],
        "C": [0.565, 0.55, 0.60],
        "D": [0.50, 0.52, 0.55],
        "E": [0.57, 0.55, 0.60],
    }
    items = [
        {"id": "ab", "kind": "beats", "a": "A", "b": "B", "source": "s"},
        {"id": "cd", "kind": "beats", "a": "C", "b": "D", "source": "s"},
        {"id": "ed", "kind": "beats", "a": "E", "b": "D", "source": "s"},
    ]
    cf = claims.ClaimsFile(Path("c.yaml"), "p", None, None, 0.01, items)
    res = _results(values)
    alone = [claims.judge(c, res, cf) for c in items]
    together = claims.evaluate(cf, res)
    raw = [2 * st.ttest_rel(values[c["a"]], values[c["b"]], alternative="greater").pvalue for c in items]
    assert [v.p_raw for v in together] == pytest.approx(raw)
    assert [v.p_adjusted for v in together] == pytest.approx(_holm_reference(raw))
    assert [v.verdict for v in alone] == ["supported"] * 3
    assert 3 * raw[0] < 0.05 and max(raw[1:]) < 0.05 <= 2 * min(raw[1:])  # by hand: 3p, 2p, p in p's order
    assert [v.verdict for v in together] == ["supported", "inconclusive", "inconclusive"]
    md = claims.markdown(cf, res, together)
    assert f"{raw[1]:.3g} | {min(1, 2 * raw[1]):.3g}" in md and "one tuning draw" in md


def test_a_claim_about_another_method_is_refused(sweep_copy: Path, tmp_path: Path) -> None:
    """`requires` is checked against the protocol the results ran: another miner, another parameter value,
    a tuned parameter, or a protocol that cannot be found all make the claim not testable."""
    (sweep_copy / "floor.csv").unlink(missing_ok=True)
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    base = {"id": "x", "kind": "beats", "a": "triplet+batch_hard", "b": "triplet+batch_all", "source": "s"}
    cases = {
        "ok": {"a": {"loss": "triplet", "miner": "batch_hard"}, "b": {"miner": "batch_all"}},
        "miner": {"a": {"miner": "semihard", "miner_params": {"semantics": "nearest"}}},
        "param": {"a": {"loss": "triplet", "loss_params": {"normalize": False}}},
        "tuned": {"a": {"loss_params": {"margin": 0.2}}},
    }
    doc = {"protocol": manifest["protocol"], "claims": [{**base, "id": k, "requires": r} for k, r in cases.items()]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    assert main(["claims", str(tmp_path / "c.yaml"), "--results", str(sweep_copy)]) == 0
    got = {v["id"]: v for v in json.loads((sweep_copy / "claims-c.json").read_text())["verdicts"]}
    assert got["ok"]["verdict"] != "not testable"
    assert got["miner"]["verdict"] == "not testable"
    assert "triplet+batch_hard runs miner batch_hard, the claim is about miner semihard" in got["miner"]["reason"]
    assert "normalize=True, the claim requires normalize=False" in got["param"]["reason"]
    assert "tunes loss parameter margin" in got["tuned"]["reason"]
    # Results whose protocol file is gone (or was edited: another hash) cannot be checked: refused, not guessed.
    manifest["protocol_file"] = str(tmp_path / "moved.yaml")
    manifest.pop("protocol_text", None)  # results from before the manifest kept the protocol's text
    (sweep_copy / "manifest.json").write_text(json.dumps(manifest))
    assert main(["claims", str(tmp_path / "c.yaml"), "--results", str(sweep_copy)]) == 0
    got = {v["id"]: v for v in json.loads((sweep_copy / "claims-c.json").read_text())["verdicts"]}
    assert all(v["verdict"] == "not testable" and "was not found" in v["reason"] for v in got.values())


def test_a_requirement_keyed_by_nothing_the_claim_names_is_refused(tmp_path: Path, capsys) -> None:
    """A `requires` key that is neither a role of the claim nor a cell it names (a misspelt cell id) would be
    a requirement never checked: the file is refused in one line, whatever the results."""
    base = {"id": "x", "kind": "reaches", "cell": "triplet+batch_hard", "value": 0.5, "source": "s"}
    for key in ("triplet+batch-hard", "b", "zzz"):
        doc = {"protocol": "p", "claims": [{**base, "requires": {key: {"loss": "contrastive"}}}]}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
        assert main(["claims", str(tmp_path / "c.yaml"), "--results", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"claims[0].requires: {key!r} is neither a role of claim 'x' (cell)" in err and err.count("\n") == 1
    for key in ("cell", "triplet+batch_hard"):  # the role, or the cell it names
        doc = {"protocol": "p", "claims": [{**base, "requires": {key: {"loss": "contrastive"}}}]}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
        assert claims.parse(tmp_path / "c.yaml").claims[0]["requires"] == {key: {"loss": "contrastive"}}


def test_a_number_the_metric_cannot_take_is_refused_even_when_a_cell_is_not_testable() -> None:
    """`points: 3` on MAP@R is an error before any cell is looked at: a claim that is not testable today must
    not hide a bound that would make it always true once its cells have results."""
    values = {"A": [0.50, 0.51, 0.52], "B": [0.51]}  # B: one seed, not testable
    assert _verdict("within", values, a="A", b="B", points=0.03) == "not testable"
    with pytest.raises(BenchError, match="points 3 is wider than map_at_r's whole range"):
        _judge("within", values, a="A", b="B", points=3)
    with pytest.raises(BenchError, match="value 150 lies outside map_at_r's range"):
        _judge("reaches", values, cell="B", value=150, unit="percent")


def test_shipped_requires_match_the_planned_cells() -> None:
    """The shipped claims name the methods they test, and the protocol's cells are those methods."""
    from bench.plan import plan
    from bench.protocol import load_protocol

    cf = claims.parse(REPO / "protocols" / "claims" / "omniglot-quick.yaml")
    p = plan(load_protocol(REPO / "protocols" / f"{cf.protocol}.yaml"))
    facenet = next(c for c in cf.claims if c["id"].startswith("facenet2015"))
    assert facenet["a"] == "triplet+semihard-facenet" and facenet["b"] == "triplet+batch_hard"
    assert facenet["requires"]["a"]["miner_params"] == {"semantics": "nearest"}
    for c in cf.claims:
        if c["kind"] != "against_reference":
            assert c.get("requires"), f"claim {c['id']} names no method"
        for role, spec in c.get("requires", {}).items():
            assert claims.mismatch(p, c.get(role, role), spec) is None, (c["id"], role)
    assert "triplet+semihard" in {c.id for c in p.cells}
    assert claims.mismatch(p, "triplet+semihard", facenet["requires"]["a"]) == (
        "triplet+semihard runs miner semihard with semantics='all', the claim requires semantics='nearest'"
    )


@pytest.mark.parametrize(
    "kind, fields, words",
    [
        ("within", {"a": "A", "b": "B", "points": 3}, "points 3 is wider than map_at_r's whole range"),
        ("spread", {"cells": ["A", "B"], "below": 5}, "below 5 is wider than map_at_r's whole range"),
        ("beats", {"a": "A", "b": "B", "margin": 2}, "margin 2 is wider than map_at_r's whole range"),
        ("reaches", {"cell": "A", "value": 93.75}, "value 93.75 lies outside map_at_r's range"),
        ("reaches", {"cell": "A", "value": -0.2}, "value -0.2 lies outside map_at_r's range"),
    ],
)
def test_a_number_the_metric_cannot_take_is_refused_not_judged(kind, fields, words) -> None:
    """`points: 3` on MAP@R meant three points; read as 3.0 it made every `within` claim supported."""
    close = {"A": [0.50, 0.51, 0.52], "B": [0.51, 0.52, 0.53]}
    with pytest.raises(BenchError, match=words):
        _judge(kind, close, **fields)


def test_unit_percent_scales_every_number_of_a_claim() -> None:
    close = {"A": [0.50, 0.51, 0.52], "B": [0.51, 0.52, 0.53]}
    as_points = _judge("within", close, a="A", b="B", points=3, unit="percent")
    as_fraction = _judge("within", close, a="A", b="B", points=0.03)
    assert as_points.verdict == as_fraction.verdict == "supported"
    # the same bound, (-0.03, +0.03), whichever way it was written; each reason shows it in the claim's unit
    assert (as_points.effect, as_points.low, as_points.high) == (as_fraction.effect, as_fraction.low, as_fraction.high)
    assert "inside (-3 pp, +3 pp)" in as_points.reason and "inside (-0.03, +0.03)" in as_fraction.reason
    narrow = _judge("within", close, a="A", b="B", points=0.1, unit="percent")  # 0.001: far narrower
    assert narrow.verdict != "supported"
    assert (
        _judge("reaches", close, cell="A", value=51, unit="percent").verdict
        == _judge("reaches", close, cell="A", value=0.51).verdict
    )


def test_collapsed_is_for_a_cell_the_data_show_at_the_floor_not_one_too_few_seeds_cannot_place() -> None:
    """Three noisy seeds that cannot be told from the floor are 'not shown above the floor', not 'collapsed'."""
    from bench.reports import floor as floor_check

    floor = [0.10, 0.11, 0.12]
    values = {"best": [0.50, 0.51, 0.52], "flat": [0.105, 0.112, 0.118], "noisy": [0.05, 0.40, 0.12]}
    res = _results(values, floor=floor)
    flat, noisy = floor_check.check(res, "flat"), floor_check.check(res, "noisy")
    assert flat.below and flat.collapsed and "collapsed: at the floor" in flat.describe()
    assert noisy.below and not noisy.collapsed and noisy.unresolved
    assert "not shown above the floor on map_at_r with 3 seeds" in noisy.describe()
    # a claim rests on neither
    for cell in ("flat", "noisy"):
        assert _judge("beats", values, res, a="best", b=cell).verdict == "not testable"


def test_a_reason_never_names_a_finding_its_verdict_is_not() -> None:
    """Holm turns a raw finding into "inconclusive": the reason then says inconclusive and calls the raw one the
    nearer finding, never "p = ... (supported)" beside "inconclusive"."""
    values = {
        "A": [0.60, 0.61, 0.62],
        "B": [0.50, 0.51, 0.52],
        "C": [0.565, 0.55, 0.60],
        "D": [0.50, 0.52, 0.55],
    }
    items = [
        {"id": "ab", "kind": "beats", "a": "A", "b": "B", "source": "s"},
        {"id": "cd", "kind": "beats", "a": "C", "b": "D", "source": "s"},
        {"id": "dc", "kind": "beats", "a": "D", "b": "C", "source": "s"},
    ]
    cf = claims.ClaimsFile(Path("c.yaml"), "p", None, None, 0.01, items)
    got = {v.claim["id"]: v for v in claims.evaluate(cf, _results(values))}
    assert got["ab"].verdict == "supported" and "; supported: p = " in got["ab"].reason
    shown = [v for v in got.values() if v.verdict == "inconclusive"]
    assert shown, {k: v.verdict for k, v in got.items()}
    for v in shown:
        assert v.finding in ("supported", "contradicted")
        assert f"({v.finding})" not in v.reason and f"; {v.finding}:" not in v.reason, v.reason
        assert f"; inconclusive: the nearer finding, {v.finding}, has p = {v.p_raw:.3g}" in v.reason, v.reason
    for v in got.values():  # the other finding's name never appears as a finding in the reason
        other = {"supported": "contradicted", "contradicted": "supported"}[v.finding]
        assert f"; {other}:" not in v.reason and f"finding, {other}" not in v.reason


def test_a_claim_in_percent_shows_its_effect_in_percentage_points() -> None:
    """``unit: percent``: the effect, interval and thresholds read in the claim's unit on the terminal, in the
    Markdown and in the reason; the JSON keeps the metric's own scale (its `scale` says so)."""
    values = {"A": [0.60, 0.62, 0.61], "B": [0.50, 0.51, 0.52]}
    items = [
        {
            "id": "ref",
            "kind": "against_reference",
            "cell": "A",
            "value": 55,
            "unit": "percent",
            "reference": "r",
            "expect": "above",
            "source": "s",
        },
        {"id": "within", "kind": "within", "a": "A", "b": "B", "points": 15, "unit": "percent", "source": "s"},
        {"id": "raw", "kind": "reaches", "cell": "A", "value": 0.55, "source": "s"},
    ]
    cf = claims.ClaimsFile(Path("c.yaml"), "p", None, None, 0.01, items)
    res = _results(values)
    got = {v.claim["id"]: v for v in claims.evaluate(cf, res)}
    ref, within, raw = got["ref"], got["within"], got["raw"]
    assert ref.effect == pytest.approx(0.61 - 0.55)  # computed on the metric's scale
    shown = f"{100 * ref.effect:+.2f} [{100 * ref.low:+.2f}, {100 * ref.high:+.2f}] pp"
    assert shown == "+6.00 [+3.52, +8.48] pp"
    assert "A - r (55%) = " + shown in ref.reason, ref.reason
    assert f"{100 * within.effect:+.2f} [" in within.reason and "inside (-15 pp, +15 pp)" in within.reason
    assert f"{raw.effect:+.4f} [{raw.low:+.4f}, {raw.high:+.4f}] (one-sample)" in raw.reason  # its own scale
    table = claims.text_table(list(got.values()))
    rows = {line.split()[0]: line for line in table.splitlines()}
    assert shown in rows["ref"] and "+0.0600" not in rows["ref"] and f"{raw.effect:+.4f} [" in rows["raw"]
    md = claims.markdown(cf, res, list(got.values()))
    assert f"| {shown} |" in md
    doc = claims.to_json(cf, res, list(got.values()))
    assert doc["verdicts"][0]["effect"] == pytest.approx(0.06) and "metric's own scale" in doc["scale"]


def test_a_second_claims_file_keeps_the_first_files_verdicts(
    sweep_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Verdicts are written under the claims file's name: a second file on the same results adds its own files."""
    manifest = json.loads((sweep_copy / "manifest.json").read_text())
    first = _claims_file(tmp_path / "c.yaml", manifest["protocol"])
    doc = yaml.safe_load(first.read_text())
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({**doc, "claims": doc["claims"][:1]}))
    own = tmp_path / f"{manifest['protocol']}.yaml"  # the protocol's own claims file: claims.md, claims.json
    own.write_text(yaml.safe_dump({**doc, "claims": doc["claims"][1:2]}))
    for path in (first, tmp_path / "other.yaml", own):
        assert main(["claims", str(path), "--results", str(sweep_copy), "--quiet"]) == 0
    capsys.readouterr()
    ids = {
        name: [v["id"] for v in json.loads((sweep_copy / name).read_text())["verdicts"]]
        for name in ("claims-c.json", "claims-other.json", "claims.json")
    }
    assert ids == {
        "claims-c.json": [c["id"] for c in doc["claims"]],
        "claims-other.json": [doc["claims"][0]["id"]],
        "claims.json": [doc["claims"][1]["id"]],
    }
    assert all((sweep_copy / n).is_file() for n in ("claims-c.md", "claims-other.md", "claims.md"))


def test_a_verdict_names_its_cells_that_a_training_maximum_ended() -> None:
    """Under early stopping a cell whose chosen trial reached its maximum before its patience ran out is not
    converged: the verdict stands, and says it is about that maximum (tables, JSON and terminal)."""
    stopping = "early_stopping: {metric: map_at_r, patience: 2, check_every: 5, max_iterations: 40}"
    protocol = parse_protocol(RUNNER_TINY.replace("ITERATIONS}", f"40, {stopping}}}"))
    values = {"A": [0.60, 0.62, 0.64], "B": [0.50, 0.51, 0.52]}
    trials = pd.DataFrame(
        [  # A's chosen trial trained its whole 40 (one fold); B's stopped on its patience at 25
            {"cell": "A", "trial": 0, "state": "COMPLETE", "value": 0.7, "iterations": 40, "budget_iterations": 40},
            {"cell": "B", "trial": 0, "state": "COMPLETE", "value": 0.6, "iterations": 25, "budget_iterations": 40},
        ]
    )
    base = _results(values)
    manifest = {
        **base.manifest,
        "protocol_hash": protocol.hash,
        "protocol_text": protocol.text,
        "budget": {"early_stopping": True, "folds": 1},
    }
    res = Results(base.root, manifest, base.finals, trials)
    items = [
        {"id": "ab", "kind": "beats", "a": "A", "b": "B", "source": "s"},
        {"id": "ba", "kind": "beats", "a": "B", "b": "A", "source": "s"},
    ]
    cf = claims.ClaimsFile(Path("c.yaml"), "p", None, None, 0.01, items)
    ab, ba = claims.evaluate(cf, res)
    assert ab.verdict == "supported" and ab.ended == ["A"] and ba.ended == ["A"]
    assert ab.stable is None and ab.stability.startswith("A ended by a training maximum, not by early stopping")
    stopped = dataclasses.replace(res, trials=trials.assign(iterations=[35, 25]))  # A's patience ran out at 35
    assert [v.ended for v in claims.evaluate(cf, stopped)] == [[], []]
    assert "ab: A ended by a training maximum" in claims.text_table([ab, ba])
    assert to_json(cf, res, [ab, ba])["verdicts"][0]["ended_by_maximum"] == ["A"]
