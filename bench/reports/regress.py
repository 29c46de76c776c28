"""Cell-by-cell comparison of two results tables of the same protocol.

A cell regresses when its primary metric fell by more than `tolerance`
(absolute, in the metric's own units) **and** Welch's one-sided t-test over
the per-seed values rejects "the current mean is not lower" at `alpha`.

Why both: the tolerance keeps drops too small to matter from failing a
build; the test keeps seed noise from failing it (with two or three seeds a
drop of a point is often noise). Why Welch: the two runs are independent
samples, and a code change may change the spread across seeds as well as
the mean, so equal variances are not assumed. Seeds are not paired: the same
seed under different code draws different batches and weights, so pairing
would claim a correlation that is not there.

With one seed on either side no variance can be estimated: a drop beyond
the tolerance is then reported as `worse?` (inconclusive) and never fails
the check; run more final seeds to make the check able to fail.

Statuses: `worse` (a regression: exit 1), `worse?` (drop beyond tolerance,
not significant), `same` (change within tolerance), `better?`, `better`
(the mirror image), `missing` (in the baseline, absent from the current
run: fails the check unless allowed, since a cell that produced nothing has
regressed completely), `new` (only in the current run), `not a number`
(a NaN or infinite value on either side: a comparison of nothing, never
read as `same`), `seeds differ` (a seed of the current run has no
baseline row: the baseline's interval is not over the seeds it claims).
The last two always fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.errors import BenchError
from bench.reports.source import Results
from bench.stats import Difference, Interval, t_interval, welch

TOLERANCE = 0.01
ALPHA = 0.05
NOT_A_NUMBER, SEEDS_DIFFER = "not a number", "seeds differ"
ALWAYS_FAILING = ("worse", NOT_A_NUMBER, SEEDS_DIFFER)
FAILING = (*ALWAYS_FAILING, "missing")


@dataclass(frozen=True)
class CellChange:
    """One cell compared: its status (the module docstring lists them) and the change behind it."""

    cell: str
    status: str
    baseline: Interval | None
    current: Interval | None
    change: Difference | None  # current - baseline, Welch interval and one-sided p-values

    @property
    def p_drop(self) -> float:
        return self.change.p_less if self.change is not None else math.nan


@dataclass(frozen=True)
class Comparison:
    """A regression check of ``current`` against ``baseline`` on ``metric``: a drop beyond ``tolerance``
    at level ``alpha`` fails; ``allow_missing`` lets cells absent from one side pass."""

    baseline: Results
    current: Results
    metric: str
    tolerance: float
    alpha: float
    allow_missing: bool
    cells: list[CellChange]

    @property
    def failures(self) -> list[CellChange]:
        bad = ALWAYS_FAILING if self.allow_missing else FAILING
        return [c for c in self.cells if c.status in bad]

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 0


def check_comparable(baseline: Results, current: Results) -> None:
    """Refuse to compare tables of two protocols or two data splits: one line, exit 2."""
    if baseline.protocol_hash != current.protocol_hash:
        raise BenchError(
            f"cannot compare: {baseline.root} is protocol {baseline.protocol} hash {baseline.protocol_hash[:12] or '?'}, "
            f"{current.root} is protocol {current.protocol} hash {current.protocol_hash[:12] or '?'}"
        )
    db, dc = baseline.manifest.get("data_fingerprint"), current.manifest.get("data_fingerprint")
    if db != dc:  # the samples themselves: same classes and split, other images (or no fingerprint recorded)
        raise BenchError(
            f"cannot compare: the data differ (data fingerprint {str(db or 'not recorded')[:8]} in {baseline.root}, "
            f"{str(dc or 'not recorded')[:8]} in {current.root}): the same protocol on other samples"
            + ("; a baseline made before dmlbench recorded its data must be made again" if not db or not dc else "")
        )
    fb, fc = baseline.fingerprints, current.fingerprints
    for key in sorted(set(fb) | set(fc)):
        if fb.get(key) != fc.get(key):
            raise BenchError(
                f"cannot compare: {key} fingerprints differ ({fb.get(key) or 'none'} in {baseline.root}, "
                f"{fc.get(key) or 'none'} in {current.root}): the same protocol on different data"
            )
    for col in ("train_fingerprint", "test_fingerprint"):
        if col in baseline.finals and col in current.finals:
            a = set(baseline.finals[col].astype(str))
            b = set(current.finals[col].astype(str))
            if a != b:
                raise BenchError(f"cannot compare: final runs have different {col} ({', '.join(sorted(a ^ b))})")


def classify(base: list[float], cur: list[float], tolerance: float, alpha: float) -> tuple[str, Difference]:
    """The status of one cell from its per-seed values."""
    d = welch(cur, base)
    if not math.isfinite(d.diff):
        return "same", d
    if -d.diff > tolerance:
        return ("worse" if d.testable and d.p_less < alpha else "worse?"), d
    if d.diff > tolerance:
        return ("better" if d.testable and d.p_greater < alpha else "better?"), d
    return "same", d


def compare(
    baseline: Results,
    current: Results,
    metric: str | None = None,
    tolerance: float = TOLERANCE,
    alpha: float = ALPHA,
    allow_missing: bool = False,
) -> Comparison:
    """Every cell of either table, in baseline order then new cells."""
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise BenchError(f"--tolerance must be a non-negative number, got {tolerance}")
    if not 0 < alpha < 1:
        raise BenchError(f"--alpha must lie strictly between 0 and 1, got {alpha}")
    check_comparable(baseline, current)
    metric = metric or baseline.primary
    for res in (baseline, current):
        if metric not in res.metrics:
            raise BenchError(f"{res.root}: no metric {metric!r} (have: {', '.join(res.metrics)})")
    out: list[CellChange] = []
    for cell in baseline.cells:
        b = baseline.values(cell, metric).tolist()
        if cell not in current.cells:
            out.append(CellChange(cell, "missing", t_interval(b), None, None))
            continue
        c = current.values(cell, metric).tolist()
        status, d = classify(b, c, tolerance, alpha)
        if not all(math.isfinite(v) for v in b + c):
            status = NOT_A_NUMBER
        elif set(current.seeds(cell)) - set(baseline.seeds(cell)):
            status = SEEDS_DIFFER  # a baseline row is missing: the baseline's interval is not the one it claims
        out.append(CellChange(cell, status, t_interval(b), t_interval(c), d))
    for cell in current.cells:
        if cell not in baseline.cells:
            out.append(CellChange(cell, "new", None, t_interval(current.values(cell, metric).tolist()), None))
    return Comparison(baseline, current, metric, tolerance, alpha, allow_missing, out)


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _iv(iv: Interval | None) -> dict | None:
    return (
        None
        if iv is None
        else {"mean": _num(iv.mean), "ci_low": _num(iv.low), "ci_high": _num(iv.high), "n_seeds": iv.n}
    )


def to_json(cmp: Comparison) -> dict:
    """The machine-readable report (`--json`)."""

    def side(r: Results) -> dict:
        return {
            "results": str(r.root),
            "protocol": r.protocol,
            "protocol_hash": r.protocol_hash,
            "fingerprints": r.fingerprints,
        }

    return {
        "baseline": side(cmp.baseline),
        "current": side(cmp.current),
        "metric": cmp.metric,
        "rule": {
            "tolerance": cmp.tolerance,
            "alpha": cmp.alpha,
            "test": "Welch one-sided t-test over seeds",
            "missing_fails": not cmp.allow_missing,
        },
        "cells": [
            {
                "cell": c.cell,
                "status": c.status,
                "baseline": _iv(c.baseline),
                "current": _iv(c.current),
                "change": None
                if c.change is None
                else {
                    "diff": _num(c.change.diff),
                    "ci_low": _num(c.change.low),
                    "ci_high": _num(c.change.high),
                    "df": _num(c.change.df),
                    "p_drop": _num(c.change.p_less),
                },
            }
            for c in cmp.cells
        ],
        "regressions": [c.cell for c in cmp.failures],
        "exit_code": cmp.exit_code,
    }


def text_table(cmp: Comparison) -> str:
    """One aligned line per cell for the terminal."""
    from bench.reports.leaderboard import fmt, fmt_interval

    head = ("cell", "status", f"baseline {cmp.metric}", f"current {cmp.metric}", "change [95% CI]", "p(drop)")
    rows = [head]
    for c in cmp.cells:
        ch = (
            "-"
            if c.change is None
            else (
                f"{c.change.diff:+.4f} [{c.change.low:+.4f}, {c.change.high:+.4f}]"
                if c.change.testable
                else f"{c.change.diff:+.4f} (untestable)"
            )
        )
        rows.append(
            (
                c.cell,
                c.status,
                fmt_interval(c.baseline) if c.baseline else "-",
                fmt_interval(c.current) if c.current else "-",
                ch,
                fmt(c.p_drop, 4),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    verdict = (
        f"{len(cmp.failures)} regression(s): {', '.join(c.cell for c in cmp.failures)}"
        if cmp.failures
        else "no regression"
    )
    lines.append(f"rule: drop > {cmp.tolerance:g} and Welch one-sided p < {cmp.alpha:g}; {verdict}")
    return "\n".join(lines)
