"""Verdicts on published claims, from the per-seed rows of one results table.

Every verdict rests on a 95% interval for an effect (a difference of
means, Welch's interval; or a mean against a published number, a one-sample
t interval) and on an equivalence margin `delta` (default 0.01: one point
of MAP@R), the smallest difference the claim's authors would call an
improvement. The rules, with `d` the effect and `[lo, hi]` its interval:

* `beats` (A beats B; d = A - B): supported if lo > 0 (A is better, however
  little: the effect and interval are printed beside it); contradicted if
  hi < delta (the data rule out an advantage of A of delta or more, which
  covers B being better); otherwise inconclusive.
* `no_better` (A does not beat B): the exact complement of `beats`:
  contradicted if lo > 0, supported if hi < delta, otherwise inconclusive.
* `within` (|A - B| <= points): supported if the whole interval lies inside
  (-points, points) (a two one-sided tests equivalence check, conservative
  at 95%); contradicted if it lies wholly outside; otherwise inconclusive.
* `reaches` (A reaches a value a paper reported for the same setting;
  d = A - value): supported if lo > -delta (A is not worse than the value
  by delta or more); contradicted if hi < -delta; otherwise inconclusive.
* `spread` (every pair of the cells lies within `below`): supported if every
  pairwise interval lies inside (-below, below) (an intersection-union test:
  each pair at 95% gives a 95% statement for all); contradicted if some pair's
  Bonferroni-widened interval (level 1 - 0.05/pairs) lies wholly outside;
  otherwise inconclusive. The effect is the largest gap between cell means.
* `against_reference` (a cell stands above or below a published figure of
  another system, e.g. people on Lake's runs): supported if the interval
  lies wholly on the expected side; contradicted if wholly on the other;
  otherwise inconclusive. Published figures are taken as exact: their own
  sampling error (people are a sample too) is not modelled.

A cell named `best` is the cell with the highest validation score of the
primary metric: chosen on validation folds of training classes, never on
the test metric it is then judged by (choosing on test would flatter it).

With one seed no interval exists and every verdict is inconclusive; with
two or three seeds most will be. That is the honest outcome of a small
budget, not a fault of the rule.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from bench.errors import BenchError
from bench.reports.source import Results
from bench.reports.stats import LEVEL, Difference, one_sample, welch

DELTA = 0.01
KINDS = ("beats", "no_better", "within", "reaches", "spread", "against_reference")

_cell = {"type": "string", "minLength": 1}
_num = {"type": "number"}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["protocol", "claims"],
    "additionalProperties": False,
    "properties": {
        "protocol": {"type": "string", "minLength": 1},
        "results": {"type": "string"},
        "description": {"type": "string"},
        "metric": {"type": "string"},
        "equivalence": {"type": "number", "minimum": 0},
        "claims": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "source", "kind"],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]+$"},
                    "source": {"type": "string", "minLength": 1},
                    "statement": {"type": "string"},
                    "note": {"type": "string"},
                    "kind": {"enum": list(KINDS)},
                    "metric": {"type": "string"},
                    "a": _cell, "b": _cell, "cell": _cell,
                    "cells": {"type": "array", "items": _cell, "minItems": 2, "uniqueItems": True},
                    "points": {"type": "number", "exclusiveMinimum": 0},
                    "below": {"type": "number", "exclusiveMinimum": 0},
                    "margin": {"type": "number", "minimum": 0},
                    "value": _num,
                    "unit": {"enum": ["fraction", "percent"]},
                    "reference": {"type": "string"},
                    "expect": {"enum": ["above", "below"]},
                },
                "allOf": [
                    {"if": {"properties": {"kind": {"enum": ["beats", "no_better"]}}},
                     "then": {"required": ["a", "b"]}},
                    {"if": {"properties": {"kind": {"const": "within"}}}, "then": {"required": ["a", "b", "points"]}},
                    {"if": {"properties": {"kind": {"const": "reaches"}}}, "then": {"required": ["cell", "value"]}},
                    {"if": {"properties": {"kind": {"const": "spread"}}}, "then": {"required": ["cells", "below"]}},
                    {"if": {"properties": {"kind": {"const": "against_reference"}}},
                     "then": {"required": ["cell", "value", "reference", "expect"]}},
                ],
            },
        },
    },
}


@dataclass(frozen=True)
class ClaimsFile:
    path: Path
    protocol: str
    results: str | None
    metric: str | None
    equivalence: float
    claims: list[dict[str, Any]]


def _where(error: jsonschema.ValidationError) -> str:
    parts = []
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else (f".{p}" if parts else str(p)))
    return "".join(parts) or "(top level)"


def parse(path: str | Path) -> ClaimsFile:
    """Read and validate a claims file; every problem names the file and the key."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise BenchError(f"claims file {path} does not exist") from None
    except (OSError, yaml.YAMLError) as e:
        raise BenchError(f"{path}: not readable YAML ({str(e).splitlines()[0]})") from None
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc))
    if error is not None:
        raise BenchError(f"{path}: {_where(error)}: {error.message}")
    ids = [c["id"] for c in doc["claims"]]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise BenchError(f"{path}: claim ids must be unique; repeated: {', '.join(dup)}")
    return ClaimsFile(path, doc["protocol"], doc.get("results"), doc.get("metric"),
                      float(doc.get("equivalence", DELTA)), doc["claims"])


@dataclass(frozen=True)
class Verdict:
    claim: dict[str, Any]
    verdict: str  # supported | contradicted | inconclusive
    reason: str
    metric: str
    effect: float
    low: float
    high: float
    cells: list[str]
    seeds: dict[str, list[int]] = field(default_factory=dict)
    values: dict[str, list[float]] = field(default_factory=dict)


def best_cell(res: Results) -> str:
    """Highest validation primary metric (ties: higher test mean, then cell id)."""
    col = f"val_{res.primary}"
    if col not in res.finals:
        raise BenchError(f"{res.finals_file}: no column {col}: cannot choose the best cell on validation")
    def key(cell: str) -> tuple[float, float, str]:
        rows = res.rows(cell)
        v = float(rows[col].mean())
        t = float(rows[res.primary].mean())
        return (-v if math.isfinite(v) else math.inf, -t if math.isfinite(t) else math.inf, cell)
    return min(res.cells, key=key)


def _decide(d: Difference, supported: bool, contradicted: bool) -> str:
    if not d.testable:
        return "inconclusive"
    if supported:
        return "supported"
    return "contradicted" if contradicted else "inconclusive"


def _ci(d: Difference) -> str:
    return f"{d.diff:+.4f} [{d.low:+.4f}, {d.high:+.4f}]" if d.testable else f"{d.diff:+.4f} (no interval: fewer than 2 seeds)"


def judge(claim: dict[str, Any], res: Results, cf: ClaimsFile) -> Verdict:
    """One claim's verdict; a cell or metric the results do not have is a user error."""
    cid = claim["id"]
    metric = claim.get("metric") or cf.metric or res.primary
    if metric not in res.metrics:
        raise BenchError(f"{cf.path}: claim {cid}: no metric {metric!r} in {res.root} (have: {', '.join(res.metrics)})")
    delta = float(claim.get("margin", cf.equivalence))
    kind = claim["kind"]

    def cell_of(name: str) -> str:
        cell = best_cell(res) if name == "best" else name
        res.require_cell(cell, f"{cf.path}: claim {cid}")
        return cell

    if kind in ("beats", "no_better", "within"):
        a, b = cell_of(claim["a"]), cell_of(claim["b"])
        if a == b:
            raise BenchError(f"{cf.path}: claim {cid}: a and b are the same cell {a!r}")
        d = welch(res.values(a, metric), res.values(b, metric))
        cells = [a, b]
        if kind == "beats":
            v = _decide(d, d.low > 0, d.high < delta)
            why = (f"{a} - {b} = {_ci(d)}; supported if the interval lies above 0, "
                   f"contradicted if it lies below +{delta:g}")
        elif kind == "no_better":
            v = "inconclusive" if not d.testable else ("contradicted" if d.low > 0 else "supported" if d.high < delta else "inconclusive")
            why = (f"{a} - {b} = {_ci(d)}; supported if the interval lies below +{delta:g}, "
                   f"contradicted if it lies above 0")
        else:
            x = float(claim["points"])
            v = _decide(d, -x < d.low and d.high < x, d.low > x or d.high < -x)
            why = f"{a} - {b} = {_ci(d)}; supported if the interval lies inside (-{x:g}, +{x:g})"
    elif kind in ("reaches", "against_reference"):
        a = cell_of(claim["cell"])
        value = float(claim["value"]) / (100.0 if claim.get("unit") == "percent" else 1.0)
        d = one_sample(res.values(a, metric), value)
        cells = [a]
        if kind == "reaches":
            v = _decide(d, d.low > -delta, d.high < -delta)
            why = f"{a} - reported {value:g} = {_ci(d)}; supported if the interval lies above -{delta:g}"
        else:
            above, below = d.low > 0, d.high < 0
            exp_above = claim["expect"] == "above"
            v = _decide(d, above if exp_above else below, below if exp_above else above)
            why = f"{a} - {claim['reference']} ({value:g}) = {_ci(d)}; expected {claim['expect']} the reference"
    else:  # spread
        names = [cell_of(c) for c in claim["cells"]]
        x = float(claim["below"])
        pairs = list(itertools.combinations(names, 2))
        level_b = 1 - (1 - LEVEL) / len(pairs)
        diffs = {(p, q): welch(res.values(p, metric), res.values(q, metric)) for p, q in pairs}
        wide = {(p, q): welch(res.values(p, metric), res.values(q, metric), level_b) for p, q in pairs}
        means = {c: float(res.values(c, metric).mean()) for c in names}
        hi_c, lo_c = max(names, key=means.get), min(names, key=means.get)
        d = welch(res.values(hi_c, metric), res.values(lo_c, metric))
        testable = all(e.testable for e in diffs.values())
        inside = testable and all(-x < e.low and e.high < x for e in diffs.values())
        outside = [pq for pq, e in wide.items() if e.testable and (e.low > x or e.high < -x)]
        v = "supported" if inside else "contradicted" if outside else "inconclusive"
        cells = names
        why = (f"largest gap {hi_c} - {lo_c} = {_ci(d)}; supported if every pairwise interval lies inside "
               f"(-{x:g}, +{x:g}), contradicted if a Bonferroni-widened one lies outside")
        if outside:
            why += f" ({' vs '.join(outside[0])})"
    return Verdict(claim, v, why, metric, d.diff, d.low, d.high, cells,
                   {c: res.seeds(c) for c in cells}, {c: [float(x) for x in res.values(c, metric)] for c in cells})


def resolve_results_dir(cf: ClaimsFile, explicit: str | Path | None) -> Path:
    if explicit is not None:
        return Path(explicit)
    if cf.results:
        return Path(cf.results)
    return Path("results") / cf.protocol


def evaluate(cf: ClaimsFile, res: Results) -> list[Verdict]:
    if res.protocol != cf.protocol:
        raise BenchError(f"{cf.path} is about protocol {cf.protocol!r}, but {res.root} holds results of {res.protocol!r}")
    return [judge(c, res, cf) for c in cf.claims]


def _n(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def to_json(cf: ClaimsFile, res: Results, verdicts: list[Verdict]) -> dict[str, Any]:
    return {
        "claims_file": str(cf.path),
        "protocol": res.protocol,
        "protocol_hash": res.protocol_hash,
        "results": str(res.root),
        "results_file": str(res.finals_file),
        "fingerprints": res.fingerprints,
        "equivalence": cf.equivalence,
        "interval": f"{LEVEL:.0%} (Welch for differences of cells, one-sample t against published values)",
        "verdicts": [
            {
                "id": v.claim["id"], "kind": v.claim["kind"], "source": v.claim["source"],
                "statement": v.claim.get("statement", ""), "verdict": v.verdict, "metric": v.metric,
                "effect": _n(v.effect), "ci_low": _n(v.low), "ci_high": _n(v.high), "reason": v.reason,
                "n_seeds": {c: len(s) for c, s in v.values.items()},
                "records": {"cells": v.cells, "seeds": v.seeds, "values": v.values,
                            "results_file": str(res.finals_file), "protocol_hash": res.protocol_hash},
            }
            for v in verdicts
        ],
        "counts": {k: sum(v.verdict == k for v in verdicts) for k in ("supported", "contradicted", "inconclusive")},
    }


def _f(x: float) -> str:
    return f"{x:+.4f}" if x is not None and math.isfinite(x) else "-"


def markdown(cf: ClaimsFile, res: Results, verdicts: list[Verdict]) -> str:
    out = [
        f"## Claims checked against `{res.protocol}`", "",
        f"Effects as difference of means with a {LEVEL:.0%} interval over final seeds; "
        f"equivalence margin {cf.equivalence:g} unless a claim sets its own.", "",
        "| claim | kind | verdict | metric | effect [95% CI] | seeds | cells | source |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in verdicts:
        seeds = ", ".join(str(len(s)) for s in v.values.values())
        ci = f"{_f(v.effect)} [{_f(v.low)}, {_f(v.high)}]"
        cells = ", ".join(f"`{c}`" for c in v.cells)
        src = v.claim["source"].replace("|", "\\|").replace("\n", " ")
        out.append(f"| {v.claim['id']} | {v.claim['kind']} | **{v.verdict}** | {v.metric} | {ci} | {seeds} | {cells} | {src} |")
    out += ["", "### Reasons", ""]
    out += [f"- **{v.claim['id']}** ({v.verdict}): {v.claim.get('statement', '').strip()} {v.reason}".replace("  ", " ")
            for v in verdicts]
    out += ["", "---", "",
            f"- results file `{res.finals_file}`, protocol `{res.protocol}` hash `{res.protocol_hash}`",
            *(f"- {k} split fingerprint `{fp}`" for k, fp in res.fingerprints.items()),
            f"- claims file `{cf.path}`"]
    return "\n".join(out) + "\n"


def text_table(verdicts: list[Verdict]) -> str:
    rows = [("claim", "verdict", "effect [95% CI]", "seeds", "cells")]
    for v in verdicts:
        rows.append((v.claim["id"], v.verdict, f"{_f(v.effect)} [{_f(v.low)}, {_f(v.high)}]",
                     "/".join(str(len(s)) for s in v.values.values()), " vs ".join(v.cells)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
