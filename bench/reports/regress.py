"""Cell-by-cell comparison of two results tables of the same protocol: the check a CI job trusts.

The rule, in the order it is applied to each cell of the baseline:

1. **Nothing the baseline has may be missing from the current tables.** A
   metric column of the baseline absent from the current table fails the
   whole comparison (`missing_columns`; the compared metric itself absent is
   unusable input, exit 2). A cell with no current row is `missing` (fails
   unless `allow_missing`); a cell whose every current final seed failed is
   `failed`; a baseline final seed with no completed current row (absent,
   or failed: its reason is shown) makes the cell `seeds missing`; a NaN,
   infinite or empty value in the compared metric on either side is `not a
   number`; such a value in any other metric where the baseline has a
   number is `values missing`; a current seed the baseline lacks is `seeds
   differ` (the baseline's interval is not over the seeds it claims). Each
   fails, whatever the statistics say, and `problems` names every missing
   seed and value.
2. **A cell regresses (`worse`) when its mean fell by more than
   `tolerance`** (absolute, in the metric's own units) **and the one-sided
   test of "the current mean is lower" gives p < `alpha`.** The tolerance
   keeps drops too small to matter from failing a build; the test keeps
   seed noise from failing it.

The test is the **paired t-test on the per-seed differences** (current -
baseline) when both tables hold the same final seeds of the cell, which the
harness makes the normal case: final seed s is a pure function of the
protocol, so both runs start from the same initialisation and batch order
(common random numbers) and the seed's luck cancels in the difference. The
paired test does not need that correlation to be valid: were the two runs
independent, the per-seed differences would still be independent draws
with mean (current - baseline), and pairing would only cost degrees of
freedom (n - 1 instead of about 2n - 2). Where it holds, a drop of 0.05 on
every one of three seeds is certain (Welch gave p = 0.14 and let it pass).
Where the seeds differ (only ever beside a failing status above), Welch's
unpaired test is used. The output names the test of every cell.

With one seed on either side no variance can be estimated: a drop beyond
the tolerance is then `worse?` (inconclusive) and never fails the check; run
more final seeds to make the check able to fail. A cell equal on every seed
has a difference of exactly 0 and is `same`.

Statuses: `worse` (a regression), `worse?` (drop beyond tolerance, not
significant), `same` (change within tolerance), `better?`, `better` (the
mirror image), `new` (only in the current run, never fails), and the
failing statuses of rule 1. Exit 1 when any cell fails or a column is
missing, else 0.

Across protocol versions (`match_versions`): two results whose manifests
record the same shared settings (``shared_hash``: everything but the grid)
and data are one experiment whose versions differ by their cells, and are
compared on the cells they share, a cell being the same when its cell key
is (`bench.plan.cell_key`). A cell of the baseline's version that the
current version lacks is `dropped` (removed from the grid, or redefined:
same name, another key), which fails like `missing`; a cell only the
current version has is `new`. Each list is also said in one line. Other
shared settings are another experiment: refused, exit 2. Results from
before cells had keys are compared only at the same protocol hash.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from bench.errors import BenchError
from bench.reports.leaderboard.cells import CLIP_NOTE, fmt, fmt_interval
from bench.reports.source import Results
from bench.stats import Difference, Interval, metric_range, paired, t_interval, welch, within

TOLERANCE = 0.01
ALPHA = 0.05
NOT_A_NUMBER, SEEDS_DIFFER = "not a number", "seeds differ"
FAILED, SEEDS_MISSING, VALUES_MISSING = "failed", "seeds missing", "values missing"
ALWAYS_FAILING = ("worse", FAILED, SEEDS_MISSING, NOT_A_NUMBER, VALUES_MISSING, SEEDS_DIFFER)
DROPPED = "dropped"
FAILING = (*ALWAYS_FAILING, "missing", DROPPED)
TESTS = "one-sided paired t-test on per-seed differences where both tables hold the same final seeds, else Welch's"


@dataclass(frozen=True)
class CellChange:
    """One cell compared: its status (the module docstring lists them), the change behind it, and
    ``problems``: each seed or value of the baseline the current tables lack, in words."""

    cell: str
    status: str
    baseline: Interval | None
    current: Interval | None
    change: Difference | None  # current - baseline, its interval and one-sided p-values; `change.test` names the test
    problems: tuple[str, ...] = ()

    @property
    def p_drop(self) -> float:
        return self.change.p_less if self.change is not None else math.nan

    @property
    def test(self) -> str:
        return self.change.test if self.change is not None else ""


@dataclass(frozen=True)
class Comparison:
    """A regression check of ``current`` against ``baseline`` on ``metric``: a drop beyond ``tolerance``
    at level ``alpha`` fails; ``allow_missing`` lets cells absent from one side pass;
    ``missing_columns`` are the baseline's metric (and seed) columns the current table lacks, which fail."""

    baseline: Results
    current: Results
    metric: str
    tolerance: float
    alpha: float
    allow_missing: bool
    cells: list[CellChange]
    missing_columns: tuple[str, ...] = ()
    versions: Versions | None = None

    @property
    def failures(self) -> list[CellChange]:
        bad = ALWAYS_FAILING if self.allow_missing else FAILING
        return [c for c in self.cells if c.status in bad]

    @property
    def exit_code(self) -> int:
        return 1 if self.failures or self.missing_columns else 0


@dataclass(frozen=True)
class Versions:
    """How the cells of two versions of one experiment line up: those of the current version the baseline's
    lacks (``added``), those of the baseline's the current lacks (``dropped``), and of those the ones still
    named but with another key (``redefined``: in both lists)."""

    added: list[str]
    dropped: list[str]
    redefined: list[str]

    def lines(self) -> list[str]:
        """One line each for the added and the dropped cells (none when there are none)."""
        out = []
        if self.added:
            out.append(f"added in the current version (not compared): {', '.join(self.added)}")
        if self.dropped:
            named = [f"{c} (redefined)" if c in self.redefined else c for c in self.dropped]
            out.append(f"dropped from the current version: {', '.join(named)}")
        return out


def match_versions(baseline: Results, current: Results) -> Versions:
    """The cells added and dropped between two versions, by cell key (none when either predates cell keys)."""
    b, c = baseline.cell_keys, current.cell_keys
    if not b or not c:
        return Versions([], [], [])
    redefined = [cell for cell in b if cell in c and b[cell] != c[cell]]
    return Versions(
        [cell for cell in c if b.get(cell) != c[cell]], [cell for cell in b if c.get(cell) != b[cell]], redefined
    )


def check_comparable(baseline: Results, current: Results) -> None:
    """Refuse to compare tables of two experiments (other shared settings, or another protocol hash where
    either predates cell keys) or two data splits: one line, exit 2."""
    sb, sc = baseline.manifest.get("shared_hash"), current.manifest.get("shared_hash")
    if baseline.protocol != current.protocol and (sb != sc or not sb):  # not versions of one protocol
        raise BenchError(
            f"cannot compare: {baseline.root} holds protocol {baseline.protocol} and {current.root} protocol "
            f"{current.protocol}: two different protocols, not versions of one (compare results of one protocol)"
        )
    if sb and sc:
        if sb != sc:
            raise BenchError(
                f"cannot compare: {baseline.root} and {current.root} are versions of {baseline.protocol} with other "
                f"shared settings (shared hash {str(sb)[:12]} and {str(sc)[:12]}: all but the grid differ): "
                "another experiment"
            )
    elif baseline.protocol_hash != current.protocol_hash:
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


def classify(
    base: list[float],
    cur: list[float],
    tolerance: float,
    alpha: float,
    base_seeds: list[int] | None = None,
    cur_seeds: list[int] | None = None,
) -> tuple[str, Difference]:
    """The status of one cell from its per-seed values (in seed order): paired by seed when both sides hold
    the same seeds, else (or when no seeds are given) Welch's test."""
    if base_seeds and cur_seeds is not None and list(cur_seeds) == list(base_seeds):
        d = paired(cur, base)
    else:
        d = welch(cur, base)
    if not math.isfinite(d.diff):
        return "same", d
    if -d.diff > tolerance:
        return ("worse" if d.testable and d.p_less < alpha else "worse?"), d
    if d.diff > tolerance:
        return ("better" if d.testable and d.p_greater < alpha else "better?"), d
    return "same", d


def _by_seed(rows: pd.DataFrame) -> dict[Any, pd.Series]:
    """Rows keyed by final seed (by position where the table has no seed column; by ``<seed> of draw <r>``
    under tuning.repeats, a seed once per tuning draw)."""
    if "seed" not in rows:
        return {i: row for i, (_, row) in enumerate(rows.iterrows())}
    if "draw" in rows:
        return {f"{int(row['seed'])} of draw {int(row['draw'])}": row for _, row in rows.iterrows()}
    return {int(row["seed"]): row for _, row in rows.iterrows()}


def _number(row: pd.Series, column: str) -> float:
    """A table value as a float; an empty or non-numeric one is NaN (the loader refused text in metrics)."""
    try:
        return float(row.get(column))
    except (TypeError, ValueError):
        return math.nan


def _shown(value: float) -> str:
    return "empty or NaN" if math.isnan(value) else f"{value:g}"


def _failure(row: pd.Series) -> str:
    """How a final run that did not complete ended: "failed: <reason>" (or the state it was left in)."""
    state = str(row.get("state", "")).strip()
    reason = row.get("reason")
    reason = "" if reason is None or (isinstance(reason, float) and math.isnan(reason)) else str(reason).strip()
    what = "failed" if state in ("FAIL", "") else f"not complete ({state})"
    return f"{what}: {reason or 'no reason recorded'}"


def gaps(baseline: Results, current: Results, cell: str, metric: str) -> tuple[list[str], list[str], list[str]]:
    """What the current tables lack of a baseline cell, in words: (seeds missing or failed, compared-metric
    values that are not numbers on either side, other metrics' values lost where the baseline has a number)."""
    if ("seed" in baseline.finals) != ("seed" in current.finals):
        return ["final seeds cannot be matched: one table has no seed column"], [], []
    base, cur = _by_seed(baseline.rows(cell)), _by_seed(current.rows(cell))
    failed = _by_seed(current.failed(cell))
    seeds = [f"seed {s} {_failure(failed[s]) if s in failed else 'missing'}" for s in base if s not in cur]
    columns = [m for m in baseline.metrics if m in current.finals]
    nan, values = [], []
    for s in (s for s in base if s in cur):
        for m in columns:
            b, c = _number(base[s], m), _number(cur[s], m)
            if m == metric and not (math.isfinite(b) and math.isfinite(c)):
                side = "current" if math.isfinite(b) else "baseline"
                nan.append(f"{m} at seed {s}: {_shown(c if side == 'current' else b)} in the {side}")
            elif m != metric and math.isfinite(b) and not math.isfinite(c):
                values.append(f"{m} at seed {s}: {_shown(c)} (baseline {b:g})")
    return seeds, nan, values


def compare(
    baseline: Results,
    current: Results,
    metric: str | None = None,
    tolerance: float = TOLERANCE,
    alpha: float = ALPHA,
    allow_missing: bool = False,
) -> Comparison:
    """Every cell of either table, in baseline order then new cells (the rule: the module docstring)."""
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise BenchError(f"--tolerance must be a non-negative number, got {tolerance}")
    if not 0 < alpha < 1:
        raise BenchError(f"--alpha must lie strictly between 0 and 1, got {alpha}")
    check_comparable(baseline, current)
    metric = metric or baseline.primary
    for res in (baseline, current):
        if metric not in res.metrics:
            raise BenchError(f"{res.root}: no metric {metric!r} (have: {', '.join(res.metrics)})")
    low, high = metric_range(metric)
    if tolerance >= high - low:  # no drop the metric can make would count: a check that always passes
        raise BenchError(
            f"--tolerance {tolerance:g} is not below the width of {metric}'s range [{low:g}, {high:g}]: no drop "
            "could fail the check"
        )
    lost = [m for m in ("seed", *baseline.metrics) if m in baseline.finals and m not in current.finals]
    versions = match_versions(baseline, current)

    def interval(values: list[float]) -> Interval:  # no bound beyond a value the metric can take
        return within(t_interval(values), metric)

    out: list[CellChange] = []
    for cell in baseline.cells:
        b = baseline.values(cell, metric).tolist()
        if cell in versions.dropped:
            out.append(CellChange(cell, DROPPED, interval(b), None, None, ("not in the current protocol version",)))
            continue
        if cell not in current.cells:
            out.append(_absent(baseline, current, cell, interval(b)))
            continue
        c = current.values(cell, metric).tolist()
        bs, cs = baseline.seeds(cell), current.seeds(cell)
        status, d = classify(b, c, tolerance, alpha, bs, cs)
        seeds, nan, values = gaps(baseline, current, cell, metric)
        extra = [f"seed {s} not in the baseline" for s in cs if s not in bs]
        if seeds:
            status = SEEDS_MISSING
        elif nan or not all(math.isfinite(v) for v in b + c):
            status = NOT_A_NUMBER
        elif values:
            status = VALUES_MISSING
        elif extra:
            status = SEEDS_DIFFER  # a baseline row is missing: the baseline's interval is not the one it claims
        problems = tuple(seeds + nan + values + extra)
        out.append(CellChange(cell, status, interval(b), interval(c), d, problems))
    for cell in current.cells:
        if cell not in baseline.cells or cell in versions.added:
            out.append(CellChange(cell, "new", None, interval(current.values(cell, metric).tolist()), None))
    return Comparison(baseline, current, metric, tolerance, alpha, allow_missing, out, tuple(lost), versions)


def _absent(baseline: Results, current: Results, cell: str, base: Interval) -> CellChange:
    """A baseline cell with no completed current row: `failed` when its final seeds ran and failed, else
    `missing` (with the budget audit's reason where it refused the cell)."""
    failed = current.failed(cell)
    refused = current.refusal(cell)
    if not refused and len(failed):
        runs = _by_seed(failed)
        return CellChange(cell, FAILED, base, None, None, tuple(f"seed {s} {_failure(r)}" for s, r in runs.items()))
    why = f"refused by the budget audit: {refused}" if refused else "no final row"
    return CellChange(cell, "missing", base, None, None, (why,))


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _iv(iv: Interval | None) -> dict | None:
    return (
        None
        if iv is None
        else {
            "mean": _num(iv.mean),
            "ci_low": _num(iv.low),
            "ci_high": _num(iv.high),
            "n_seeds": iv.n,
            "clipped": iv.clipped,
        }
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
            "test": TESTS,
            "missing_fails": not cmp.allow_missing,
        },
        "missing_columns": list(cmp.missing_columns),
        "cells": [
            {
                "cell": c.cell,
                "status": c.status,
                "test": c.test or None,
                "problems": list(c.problems),
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
                    "test": c.change.test,
                },
            }
            for c in cmp.cells
        ],
        "added": cmp.versions.added if cmp.versions else [],
        "dropped": cmp.versions.dropped if cmp.versions else [],
        "regressions": [c.cell for c in cmp.failures],
        "exit_code": cmp.exit_code,
    }


def text_table(cmp: Comparison) -> str:
    """One aligned line per cell for the terminal, then each cell's problems and the rule with the verdict."""
    head = ("cell", "status", f"baseline {cmp.metric}", f"current {cmp.metric}", "change [95% CI]", "test", "p(drop)")
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
                c.test or "-",
                fmt(c.p_drop, 4),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{c.cell}: {p}" for c in cmp.cells for p in c.problems]
    if any(iv is not None and iv.clipped for c in cmp.cells for iv in (c.baseline, c.current)):
        lines.append(CLIP_NOTE)
    lines += cmp.versions.lines() if cmp.versions else []
    if cmp.missing_columns:
        lines.append(f"columns of the baseline missing from the current table: {', '.join(cmp.missing_columns)}")
    verdict = (
        f"{len(cmp.failures)} regression(s): {', '.join(c.cell for c in cmp.failures)}"
        if cmp.failures
        else "no regression"
    )
    if cmp.missing_columns:
        verdict += f"; {len(cmp.missing_columns)} missing column(s)"
    lines.append(
        f"rule: a cell fails when it lacks a seed or value of the baseline, or its mean dropped by more than "
        f"{cmp.tolerance:g} with p < {cmp.alpha:g} ({TESTS} test); {verdict}"
    )
    return "\n".join(lines)
