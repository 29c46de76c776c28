"""Verdicts on published claims, from the per-seed rows of one results table: the decision rules.

Every verdict rests on a 95% interval for an effect (a difference of
means: the paired t interval when both cells ran the same final seeds,
which the runner gives the same initialisation and batch order in every
cell, else Welch's; or a mean against a published number, a one-sample t
interval) and on an equivalence margin `delta` (default 0.01: one point
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

Numbers are on the metric's own scale (MAP@R 0.03 is three points) unless
the claim says ``unit: percent``, which divides every number it holds
(``value``, ``points``, ``below``, ``margin``) by 100. A bound wider than
the metric's range, or a value it cannot take, is refused with one line:
``points: 3`` on MAP@R would otherwise make an always-true claim.

Each rule is a one-sided test at 2.5% (an interval bound past a value).
The finding the data point to gets a p-value on the intervals' two-sided
scale (the smaller one-sided p of its two rules, doubled); one file judges
several claims on one table, so the p-values of its testable claims are
adjusted with Holm's step-down method and a verdict is supported or
contradicted only when its adjusted p is below 0.05. Raw and adjusted p
are both printed. The tuning stage runs once per cell unless the protocol
repeats it (tuning.repeats), so an interval is conditional on that one tuning
draw, and each verdict says so; with R draws the unit is a draw's mean and the
tuner's noise is inside the interval (docs/METHODS.md, *Tuning noise*).

A fourth verdict, "not testable", refuses a claim instead of
approximating it: a cell it names is not in the results (the grid has no
such cell, the audit refused it, every seed failed), has fewer than two
completed seeds, is collapsed (not significantly above the floor, the
untrained trunk: `bench.reports.floor`) or barely trained (above it by
less than a quarter of the best cell's gain: a failed training, whose
verdict would be about the failure), or does not run the method the
claim is about (`requires`, checked against the cell's fixed parameters in
the re-planned protocol: e.g. `requires: {a: {miner: semihard,
miner_params: {semantics: nearest}}}`).

A cell named `best` is the cell with the highest validation score of the
primary metric: chosen on validation folds of training classes, never on
the test metric it is then judged by (ties by cell id, never by a test score).

With one seed no interval exists and every verdict is inconclusive; with
two or three seeds most will be. That is the honest outcome of a small
budget, not a fault of the rule.

Where the results hold a budget check (`dmlbench budget-check`: every
cell retrained at a multiple of the budget with the same seeds,
`bench.reports.budget`), each claim is judged a second time on the table at
that multiple (same rules, same Holm family), and each verdict says beside
it whether it is *stable*. A verdict is not stable when any of these holds:
the table's ranking moved (Kendall's tau below 1) or the check lacks a cell;
a cell the claim names changed rank; the verdict at the multiple differs.
The verdict itself stays the one on the table as run: the budget check says
how far to trust it, it does not replace it (a longer budget is another
protocol, whose own budget would need its own check).

Under early stopping, a cell of the claim that a training maximum ended
rather than its validation score (`bench.reports.maximum`) is named beside
the verdict too, with or without a budget check: the verdict is about that
maximum, not about the method trained to convergence.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

from bench import registry
from bench.errors import BenchError
from bench.plan import Plan, trained_cell
from bench.reports import budget, floor, maximum
from bench.reports.claims.file import ClaimsFile, scaled, unit_of
from bench.reports.source import Results
from bench.stats import LEVEL, Difference, compare, holm, one_sample

VERDICTS = ("supported", "contradicted", "inconclusive", "not testable")
TUNING_CAVEAT = (
    "conditional on one tuning draw: the tuning stage ran once, so the interval holds the final "
    "seeds' noise, not the tuner's"
)


def tuning_caveat(res: Results) -> str:
    """What every interval holds: one tuning draw's seeds, or under tuning.repeats the draws' means."""
    if not res.draws:
        return TUNING_CAVEAT
    n = len(res.finals["draw"].unique())
    return (
        f"over {n} independent tuning draws (tuning.repeats): each cell's unit is a draw's mean over its final "
        "seeds, so the interval holds the tuner's noise and the seeds'; cells are paired draw by draw"
    )


@dataclass(frozen=True)
class Verdict:
    """One claim judged: the verdict and why, the effect with its interval, and the records it rests on."""

    claim: dict[str, Any]
    verdict: str  # one of VERDICTS
    reason: str
    metric: str
    effect: float
    low: float
    high: float
    cells: list[str]
    seeds: dict[str, list[int]] = field(default_factory=dict)
    values: dict[str, list[float]] = field(default_factory=dict)
    finding: str = ""  # what the data point to before the correction: supported or contradicted
    p_raw: float = math.nan  # two-sided scale: the smaller one-sided p of the two rules, doubled
    p_adjusted: float = math.nan  # Holm across the file's testable claims; the verdict uses this one
    test: str = ""  # paired, Welch, one-sample
    stable: bool | None = None  # at the budget check's multiple; None when the results hold no budget check
    stability: str = ""  # why (not) stable, beside the verdict
    verdict_at_multiple: str = ""
    check_pending: bool = False  # the budget check is incomplete and nothing it holds so far moved this verdict
    ended: list[str] = field(default_factory=list)  # its cells a training maximum ended (early stopping)

    @property
    def testable(self) -> bool:
        return self.verdict != "not testable"


def best_cell(res: Results) -> str:
    """Highest validation primary metric (ties: cell id; never broken by a test score)."""
    col = f"val_{res.primary}"
    if col not in res.finals:
        raise BenchError(f"{res.finals_file}: no column {col}: cannot choose the best cell on validation")

    def key(cell: str) -> tuple[float, str]:
        v = float(res.rows(cell)[col].mean())
        return (-v if math.isfinite(v) else math.inf, cell)

    return min(res.cells, key=key)


def _ci(d: Difference, claim: dict[str, Any]) -> str:
    scale, places, suffix = unit_of(claim)
    if not d.testable:
        return f"{d.diff * scale:+.{places}f}{suffix} (no interval: fewer than 2 seeds)"
    return (
        f"{d.diff * scale:+.{places}f} [{d.low * scale:+.{places}f}, {d.high * scale:+.{places}f}]{suffix} ({d.test})"
    )


def _g(x: float, claim: dict[str, Any], level: bool = False) -> str:
    """A threshold (a difference: percentage points) or, with ``level``, a reported value (percent) of a claim
    in the claim's unit."""
    scale, _, suffix = unit_of(claim)
    return f"{x * scale:g}{'%' if level and suffix else suffix}"


def _finding(p_support: float, p_contradict: float, support_first: bool = True) -> tuple[str, float]:
    """The finding the data point to and its p-value on the two-sided scale of the 95% intervals.

    Each rule is a one-sided test at 2.5% (an interval bound past a
    value); doubling the smaller p puts both on the scale that Holm
    adjusts at 5%. Where both rules hold (an interval inside (0, delta)
    for `beats`), the rule named first wins, as the interval rules say.
    """
    first, second = (
        (("supported", p_support), ("contradicted", p_contradict))
        if support_first
        else (("contradicted", p_contradict), ("supported", p_support))
    )
    name, p = first if (2 * first[1] < 1 - LEVEL or first[1] <= second[1]) else second
    return name, min(1.0, 2 * p)


def _tost(d: Difference, x: float) -> tuple[float, float]:
    """(p inside (-x, x), p wholly outside): the equivalence test and its negation, one-sided each."""
    above_low, below_low = d.shifted(-x)
    above_high, below_high = d.shifted(x)
    return max(above_low, below_high), min(above_high, below_low)


def mismatch(plan: Plan, cell: str, spec: dict[str, Any]) -> str | None:
    """Why the planned cell is not the method a claim's `requires` describes; None when it is.

    Names compare with the registry's (`semihard`, `pml:multi_similarity`,
    `none` for no miner); a parameter compares with the cell's fixed value,
    else the method's default, and a parameter the cell tunes is never the
    fixed value a claim is about.
    """
    try:
        c = plan.cell(cell)
    except KeyError:
        return f"the protocol plans no cell {cell}"
    for role in ("loss", "miner"):
        got = getattr(c, role) or "none"
        if role in spec and spec[role] != got:
            return f"{cell} runs {role} {got}, the claim is about {role} {spec[role]}"
        fixed = spec.get(f"{role}_params") or {}
        if not fixed:
            continue
        entry = registry.get(role, getattr(c, role)) if getattr(c, role) else None
        defaults = entry.parameters() if entry is not None else {}
        params = c.loss_params if role == "loss" else c.miner_params
        for name, want in fixed.items():
            if f"{role}.{name}" in c.search_space:
                return f"{cell} tunes {role} parameter {name}, the claim requires it fixed at {want!r}"
            have = params.get(name, defaults.get(name, "(unset)"))
            if have != want:
                return f"{cell} runs {role} {got} with {name}={have!r}, the claim requires {name}={want!r}"
    return None


def _untestable(res: Results, cell: str, name: str, claim: dict[str, Any]) -> str | None:
    """Why a claim cannot rest on this cell: missing, too few seeds, collapsed or barely trained, or not the
    method named."""
    if cell not in res.cells:
        if res.refusal(cell):
            return f"cell {cell} was refused by the budget audit ({res.refusal(cell)})"
        if cell in res.reported_cells:
            return f"cell {cell} has no completed final seed ({len(res.failed(cell))} failed)"
        if cell in res.unreported:
            return f"cell {cell} has no result: no final seed is recorded (not run, or the run is unfinished)"
        if cell in res.failed_every_trial:
            return f"cell {cell} has no result: every tuning trial failed"
        return f"the grid has no cell {cell!r} (no cell {cell!r} in {res.root})"
    n = len(res.values(cell, res.primary))
    if n < 2:
        return f"cell {cell} has {n} completed final seed; a test needs 2"
    fc = floor.check(res, cell)
    if fc is not None and (fc.below or fc.weak):
        return f"cell {cell} is {fc.describe()}"
    roles = [r for r in ("a", "b", "cell") if claim.get(r) == name] + [name, cell]
    spec = next((claim.get("requires", {})[r] for r in roles if r in claim.get("requires", {})), None)
    if not spec:
        return None
    if res.plan is None:
        return (
            f"the protocol with hash {res.protocol_hash[:12]} (the manifest's `protocol_file`) was not found, "
            f"so what {cell} runs cannot be checked against `requires`"
        )
    if not res.same_cell(res.plan, cell):  # a version of the protocol that shares the experiment, not the cell
        return (
            f"the protocol file found ({res.plan.protocol.source}, hash {res.plan.protocol.hash12}) defines {cell} "
            f"otherwise than the run did (another cell key), so what it ran cannot be checked against `requires`"
        )
    return mismatch(res.plan, cell, spec)


def _refused(claim: dict[str, Any], metric: str, cells: list[str], why: str) -> Verdict:
    nan = math.nan
    return Verdict(claim, "not testable", f"not testable: {why}", metric, nan, nan, nan, cells)


def judge(claim: dict[str, Any], res: Results, cf: ClaimsFile) -> Verdict:
    """One claim's verdict before the family's correction (`evaluate` applies Holm).

    A metric the results do not have, or a claim comparing a cell with
    itself, is a user error; a cell the results cannot support (missing,
    fewer than 2 seeds, collapsed or barely trained, not the method the claim names) makes
    the claim "not testable", never approximated by a neighbour.
    """
    cid = claim["id"]
    metric = claim.get("metric") or cf.metric or res.primary
    if metric not in res.metrics:
        raise BenchError(f"{cf.path}: claim {cid}: no metric {metric!r} in {res.root} (have: {', '.join(res.metrics)})")
    own = "margin" in claim  # else the file's equivalence margin, on the metric's own scale
    delta = scaled(cf, claim if own else {"equivalence": cf.equivalence}, "margin" if own else "equivalence", metric)
    for key in ("points", "value", "below"):  # a number the metric cannot take is an error whatever the cells
        if key in claim:
            scaled(cf, claim, key, metric)
    kind = claim["kind"]
    names = (
        [claim["a"], claim["b"]]
        if kind in ("beats", "no_better", "within")
        else [claim["cell"]]
        if kind in ("reaches", "against_reference")
        else list(claim["cells"])
    )
    # "best" is the best of the whole grid: while a planned cell has no result (an unfinished run, a job of
    # `run --cells`, a cell the budget audit refused) or no cell has a completed seed, it is not known, and
    # the best of the rest would be another claim
    unknown = "best" in names and (res.unreported or not res.cells)
    cells = [best_cell(res) if n == "best" and not unknown else n for n in names]
    if len(set(cells)) < len(cells):
        raise BenchError(f"{cf.path}: claim {cid}: a cell is named twice ({', '.join(cells)})")
    grid = set(res.reported_cells) | set(res.refused) | ({c.id for c in res.plan.cells} if res.plan else set())
    for cell in cells:  # a name the grid does not hold is a typo in the claims file, as `run --cells` treats it
        if cell not in grid and not (unknown and cell == "best"):
            raise BenchError(
                f"{cf.path}: claim {cid}: no cell {cell!r} in {res.protocol}; cells: {', '.join(sorted(grid))}"
            )
    if unknown:
        gaps = res.unreported
        gap = f"{len(gaps)} planned cell(s) have no result ({', '.join(gaps)})" if gaps else "no cell has a result"
        return _refused(claim, metric, cells, f"the best cell of the grid is unknown: {gap}")
    for name, cell in zip(names, cells):
        why = _untestable(res, cell, name, claim)
        if why:
            return _refused(claim, metric, cells, why)

    def diff(p: str, q: str) -> Difference:
        return compare(res.values(p, metric), res.values(q, metric), res.seeds(p), res.seeds(q))

    if kind in ("beats", "no_better", "within"):
        a, b = cells
        d = diff(a, b)
        if kind == "beats":
            finding = _finding(d.p_greater, d.shifted(delta)[1])
            why = f"{a} - {b} = {_ci(d, claim)}; supported if it lies above 0, contradicted if it lies below +{_g(delta, claim)}"
        elif kind == "no_better":
            finding = _finding(d.shifted(delta)[1], d.p_greater, support_first=False)
            why = f"{a} - {b} = {_ci(d, claim)}; supported if it lies below +{_g(delta, claim)}, contradicted if it lies above 0"
        else:
            x = scaled(cf, claim, "points", metric)
            finding = _finding(*_tost(d, x))
            why = f"{a} - {b} = {_ci(d, claim)}; supported if it lies inside (-{_g(x, claim)}, +{_g(x, claim)})"
    elif kind in ("reaches", "against_reference"):
        a = cells[0]
        value = scaled(cf, claim, "value", metric)
        d = one_sample(res.values(a, metric), value)
        if kind == "reaches":
            finding = _finding(*d.shifted(-delta))
            why = f"{a} - reported {_g(value, claim, level=True)} = {_ci(d, claim)}; supported if it lies above -{_g(delta, claim)}"
        else:
            above = claim["expect"] == "above"
            finding = _finding(d.p_greater, d.p_less) if above else _finding(d.p_less, d.p_greater)
            why = f"{a} - {claim['reference']} ({_g(value, claim, level=True)}) = {_ci(d, claim)}; expected {claim['expect']} the reference"
    else:  # spread
        x = scaled(cf, claim, "below", metric)
        pairs = list(itertools.combinations(cells, 2))
        tests = [_tost(diff(p, q), x) for p, q in pairs]
        means = {c: float(res.values(c, metric).mean()) for c in cells}
        hi_c, lo_c = max(cells, key=means.__getitem__), min(cells, key=means.__getitem__)
        d = diff(hi_c, lo_c)
        finding = _finding(max(t[0] for t in tests), min(1.0, len(pairs) * min(t[1] for t in tests)))
        why = (
            f"largest gap {hi_c} - {lo_c} = {_ci(d, claim)}; supported if every pairwise interval lies inside "
            f"(-{_g(x, claim)}, +{_g(x, claim)}), contradicted if a Bonferroni-widened one lies outside"
        )
    name, p = finding
    verdict = name if p < 1 - LEVEL else "inconclusive"
    return Verdict(
        claim,
        verdict,
        why,
        metric,
        d.diff,
        d.low,
        d.high,
        cells,
        {c: res.seeds(c) for c in cells},
        {c: [float(v) for v in res.values(c, metric)] for c in cells},
        name,
        p,
        p,
        d.test,
    )


def adjust(verdicts: list[Verdict], caveat: str = TUNING_CAVEAT) -> list[Verdict]:
    """Holm's correction across the testable claims of one file; each verdict then rests on its adjusted p
    (``caveat``: what the intervals are conditional on, `tuning_caveat`)."""
    adjusted = holm([v.p_raw for v in verdicts])
    out = []
    for v, p in zip(verdicts, adjusted):
        if not v.testable:
            out.append(v)
            continue
        verdict = v.finding if p < 1 - LEVEL else "inconclusive"
        n = sum(x.testable for x in verdicts)
        # the words follow the verdict: the nearer finding is named as such, never as the verdict
        reason = (
            f"{v.reason}; {v.finding}: p = {v.p_raw:.3g}, Holm-adjusted {p:.3g} over {n} claims; {caveat}"
            if verdict == v.finding
            else f"{v.reason}; inconclusive: the nearer finding, {v.finding}, has p = {v.p_raw:.3g}, Holm-adjusted "
            f"{p:.3g} over {n} claims, not below {1 - LEVEL:g}; {caveat}"
        )
        out.append(replace(v, verdict=verdict, p_adjusted=p, reason=reason))
    return out


def evaluate(cf: ClaimsFile, res: Results) -> list[Verdict]:
    """Every claim of the file judged on ``res``, Holm-adjusted together; refuses results of another protocol."""
    if res.protocol != cf.protocol:
        raise BenchError(
            f"{cf.path} is about protocol {cf.protocol!r}, but {res.root} holds results of {res.protocol!r}"
        )
    return stability(cf, res, adjust([judge(c, res, cf) for c in cf.claims], tuning_caveat(res)))


def stability(cf: ClaimsFile, res: Results, verdicts: list[Verdict]) -> list[Verdict]:
    """Each verdict with whether it holds at the budget check's multiple (the rule in the module's docstring),
    and under early stopping which of its cells a maximum ended rather than their validation score
    (`bench.reports.maximum`): the verdict is then about that maximum, whatever the check says."""
    ends = maximum.ended(res)
    verdicts = [_ended_note(v, ends) for v in verdicts]
    check = budget.check(res)
    if check is None:
        return verdicts
    at = budget.at_multiple(res, check.multiple)
    later = adjust([judge(c, at, cf) for c in cf.claims], tuning_caveat(at)) if at.cells else None
    out = []
    m = check.multiple
    for i, v in enumerate(verdicts):
        problems = []
        if not check.stable:
            tau = f"{check.tau:.2f}" if math.isfinite(check.tau) else "undefined"
            problems.append(
                f"the table's ranking moved at {m}x (Kendall's tau {tau})"
                if check.moved
                else f"the budget check lacks {', '.join(check.missing)}"
            )
        moved = [c for c in v.cells if c in check.moved]
        if moved:
            problems.append(
                "its cells changed rank: "
                + ", ".join(f"{c} (rank {check.ranks[c]} to {check.ranks_at_multiple[c]})" for c in moved)
            )
        again = later[i].verdict if later is not None else "not testable"
        if again != v.verdict:
            problems.append(f"at {m}x it would be {again}")
        # A check still running has shown nothing against a verdict whose checked cells kept their ranks and
        # whose only change is being untestable for want of its unchecked cells: "not yet shown", never
        # "not stable", which would report a movement nobody measured.
        pending = (
            not check.complete
            and not check.moved
            and (again == v.verdict or (again == "not testable" and any(c in check.missing for c in v.cells)))
        )
        head = f"not yet shown stable at {m}x the budget" if pending else f"not stable at {m}x the budget"
        note = (
            (head + ": " + "; ".join(problems))
            if problems
            else f"stable at {m}x the budget: ranking unchanged, verdict the same"
        )
        note += f"; {v.stability}" if v.stability else ""
        out.append(replace(v, stable=not problems, stability=note, verdict_at_multiple=again, check_pending=pending))
    return out


def _ended_note(v: Verdict, ends: dict[str, maximum.Ended]) -> Verdict:
    """The verdict with the cells of it a training maximum ended (under early stopping) said in its stability."""
    hit = [c for c in v.cells if (e := ends.get(trained_cell(c))) is not None and e.hit]
    if not hit:
        return v
    return replace(v, stability=ended_note(hit), ended=hit)


def ended_note(cells: list[str]) -> str:
    """What a verdict says of its cells that a training maximum ended."""
    return f"{', '.join(cells)} ended by a training maximum, not by early stopping: the verdict is about that maximum"
