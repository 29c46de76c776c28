"""Verdicts written out: the JSON record a reader can recompute every number from, the README-ready Markdown
table with its reasons and provenance, and the terminal table; each number in the claim's own unit."""

from __future__ import annotations

import math
from typing import Any

from bench.reports import budget, floor
from bench.reports.claims.file import ClaimsFile, unit_of
from bench.reports.claims.verdicts import VERDICTS, Verdict, ended_note, tuning_caveat
from bench.reports.escape import md_code, md_text
from bench.reports.source import Results
from bench.stats import LEVEL


def _n(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def to_json(cf: ClaimsFile, res: Results, verdicts: list[Verdict]) -> dict[str, Any]:
    """The verdicts with the records behind each (cells, seeds, values, file, hash), so a reader can
    recompute any number; non-finite numbers become null."""
    return {
        "claims_file": str(cf.path),
        "protocol": res.protocol,
        "protocol_hash": res.protocol_hash,
        "results": str(res.root),
        "results_file": str(res.finals_file),
        "fingerprints": res.fingerprints,
        "equivalence": cf.equivalence,
        "scale": "effect, ci_low and ci_high on the metric's own scale (a fraction); the reasons and the tables "
        "show each claim's unit (percentage points for unit: percent)",
        "interval": f"{LEVEL:.0%} (paired t where both cells ran the same final seeds, else Welch; one-sample t "
        "against published values)",
        "correction": "Holm across the file's testable claims; verdicts use the adjusted p",
        "conditional_on": tuning_caveat(res),
        "verdicts": [
            {
                "id": v.claim["id"],
                "kind": v.claim["kind"],
                "source": v.claim["source"],
                "statement": v.claim.get("statement", ""),
                "verdict": v.verdict,
                "metric": v.metric,
                "effect": _n(v.effect),
                "ci_low": _n(v.low),
                "ci_high": _n(v.high),
                "reason": v.reason,
                "test": v.test or None,
                "finding": v.finding or None,
                "p": _n(v.p_raw),
                "p_holm": _n(v.p_adjusted),
                "stable": v.stable,
                "stability": v.stability or None,
                "verdict_at_multiple": v.verdict_at_multiple or None,
                "check_pending": v.check_pending,
                "ended_by_maximum": v.ended,
                "n_seeds": {c: len(s) for c, s in v.values.items()},
                "records": {
                    "cells": v.cells,
                    "seeds": v.seeds,
                    "values": v.values,
                    "results_file": str(res.finals_file),
                    "protocol_hash": res.protocol_hash,
                },
            }
            for v in verdicts
        ],
        "counts": {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS},
        "budget_check": _budget_doc(res),
        "versions": versions(res),
    }


def _budget_doc(res: Results) -> dict[str, Any] | None:
    """The table-level budget check the stability notes rest on (None: no check, stability unknown)."""
    check = budget.check(res)
    if check is None:
        return None
    return {
        "multiple": check.multiple,
        "iterations": check.iterations,
        "metric": check.metric,
        "kendall_tau": _n(check.tau),
        "moved": check.moved,
        "not_checked": check.missing,
        "stable": check.stable,
    }


def _budget_line(res: Results) -> str:
    """What the markdown says of the budget check above the verdicts."""
    check = budget.check(res)
    if check is None:
        return (
            "No budget check (`dmlbench budget-check`): whether these verdicts hold when every cell trains "
            "longer is unknown."
        )
    head = (
        "The table's ranking is stable"
        if check.stable
        else "**The table's ranking is not stable**"
        if check.moved
        else "**The table's ranking is not yet shown stable** (the check is incomplete)"
    )
    return (
        f"{head} under the budget check: {md_text(check.summary())}. Beside each verdict: whether it holds "
        f"at {check.multiple}x (judged again there by the same rules)."
    )


def versions(res: Results) -> dict[str, Any] | None:
    """When the protocol file `requires` is checked against is another version than the one the results ran
    (same shared settings, other cells): its hash, the cells it adds (not in the results, or redefined) and the
    cells of the results it drops (or redefines), by cell key. None when it is the results' own version."""
    plan = res.plan
    if plan is None or plan.protocol.hash == res.protocol_hash:
        return None
    planned = [c.id for c in plan.cells]
    return {
        "protocol_file_hash": plan.protocol.hash,
        "added": [c for c in planned if c not in res.cell_keys or not res.same_cell(plan, c)],
        "dropped": [c for c in res.cell_keys if not res.same_cell(plan, c)],
    }


def version_lines(res: Results) -> list[str]:
    """What the verdicts rest on short of the whole grid, one line each: planned cells without a result (an
    unfinished run), and `versions`' added and dropped cells (none when the versions are one)."""
    out = []
    if res.unreported:  # their claims say "not testable"; the others' correction is over a smaller family
        out.append(
            f"{len(res.unreported)} planned cell(s) have no result ({', '.join(res.unreported)}): claims on them "
            "are not testable, and Holm's correction spans the testable claims alone, so a verdict may change "
            "once they have results"
        )
    v = versions(res)
    if v is None:
        return out
    head = f"the protocol file ({res.plan.protocol.source if res.plan else '?'}, hash {v['protocol_file_hash'][:12]})"
    if v["added"]:
        out.append(f"{head} adds cells these results do not hold: {', '.join(v['added'])}")
    if v["dropped"]:
        out.append(f"{head} drops cells of these results (claims on them are not testable): {', '.join(v['dropped'])}")
    return out


def _p(x: float) -> str:
    return f"{x:.3g}" if x is not None and math.isfinite(x) else "-"


def _effect(v: Verdict) -> str:
    """The effect and its interval in the claim's unit (`unit_of`): ``-11.58 [-16.60, -6.56] pp`` for a claim
    in percent, ``-0.1158 [-0.1660, -0.0656]`` for one on the metric's scale."""
    scale, places, suffix = unit_of(v.claim)

    def f(x: float) -> str:
        return f"{x * scale:+.{places}f}" if x is not None and math.isfinite(x) else "-"

    if v.effect is None or not math.isfinite(v.effect):
        return "-"
    return f"{f(v.effect)} [{f(v.low)}, {f(v.high)}]{suffix}"


def markdown(cf: ClaimsFile, res: Results, verdicts: list[Verdict]) -> str:
    """A README-ready table of the verdicts, their reasons, and the files and fingerprints they rest on."""
    out = [
        f"## Claims checked against {md_code(res.protocol)}",
        "",
        f"Effects as difference of means with a {LEVEL:.0%} interval over final seeds (paired t where both cells "
        f"ran the same seeds, else Welch); equivalence margin {cf.equivalence:g} unless a claim sets its own. "
        "Each verdict uses its Holm-adjusted p (across this file's testable claims); every interval is "
        f"{tuning_caveat(res)}. A claim on a missing, collapsed (not above the floor), barely trained (above it by "
        f"less than {floor.WEAK_SHARE:.0%} of the best cell's gain) or different method is not testable.",
        "",
        _budget_line(res),
        "",
        *(line for text in version_lines(res) for line in (md_text(text[0].upper() + text[1:]) + ".", "")),
        "| claim | kind | verdict | budget check | metric | effect [95% CI] | test | p | p (Holm) | seeds | cells | "
        "source |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in verdicts:
        seeds = ", ".join(str(len(s)) for s in v.values.values())
        ci = _effect(v)
        cells = ", ".join(md_code(c) for c in v.cells)
        src = md_text(v.claim["source"])
        out.append(
            f"| {v.claim['id']} | {v.claim['kind']} | **{v.verdict}** | {md_text(v.stability or '-')} | "
            f"{v.metric} | {ci} | {v.test or '-'} | "
            f"{_p(v.p_raw)} | {_p(v.p_adjusted)} | {seeds or '-'} | {cells} | {src} |"
        )
    out += ["", "### Reasons", ""]
    out += [
        f"- **{v.claim['id']}** ({v.verdict}): {md_text(v.claim.get('statement', '').strip())} {md_text(v.reason)}".replace(
            "  ", " "
        )
        for v in verdicts
    ]
    out += [
        "",
        "---",
        "",
        f"- results file {md_code(res.finals_file)}, protocol {md_code(res.protocol)} hash "
        f"{md_code(res.protocol_hash)}",
        *(f"- {md_text(k)} split fingerprint {md_code(fp)}" for k, fp in res.fingerprints.items()),
        f"- claims file {md_code(cf.path)}",
    ]
    return "\n".join(out) + "\n"


def _stability_cell(v: Verdict) -> str:
    """The terminal's word for a verdict at the budget check's multiple."""
    if v.stable is None:
        return "-"
    if v.stable:
        return "stable"
    return "not yet shown (check incomplete)" if v.check_pending else f"NOT STABLE ({v.verdict_at_multiple} there)"


def text_table(verdicts: list[Verdict]) -> str:
    """One aligned line per claim for the terminal."""
    rows = [("claim", "verdict", "effect [95% CI]", "p (Holm)", "seeds", "cells", "at the budget check")]
    for v in verdicts:
        rows.append(
            (
                v.claim["id"],
                v.verdict,
                _effect(v),
                _p(v.p_adjusted),
                "/".join(str(len(s)) for s in v.values.values()) or "-",
                " vs ".join(v.cells),
                _stability_cell(v),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{v.claim['id']}: {ended_note(v.ended)}" for v in verdicts if v.ended]
    return "\n".join(lines)
