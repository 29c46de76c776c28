"""Verdicts on published claims: supported, contradicted, inconclusive or not testable.

* `file`: the claims file read and validated (`parse`), where its verdicts
  are written, and a claim's numbers on the metric's own scale;
* `verdicts`: the decision rules (its docstring states them) and the
  statistics of each verdict: intervals, Holm's correction, the budget
  check's stability;
* `render`: the verdicts as JSON, as a Markdown table and as the terminal
  table.
"""

from bench.reports.claims.file import (
    DELTA,
    KINDS,
    SCHEMA,
    ClaimsFile,
    output_names,
    parse,
    resolve_results_dir,
    unit_of,
)
from bench.reports.claims.render import markdown, text_table, to_json, version_lines, versions
from bench.reports.claims.verdicts import (
    TUNING_CAVEAT,
    VERDICTS,
    Verdict,
    adjust,
    best_cell,
    evaluate,
    judge,
    mismatch,
    stability,
    tuning_caveat,
)

__all__ = [
    "DELTA",
    "KINDS",
    "SCHEMA",
    "TUNING_CAVEAT",
    "VERDICTS",
    "ClaimsFile",
    "Verdict",
    "adjust",
    "best_cell",
    "evaluate",
    "file",
    "judge",
    "markdown",
    "mismatch",
    "output_names",
    "parse",
    "render",
    "resolve_results_dir",
    "stability",
    "text_table",
    "to_json",
    "tuning_caveat",
    "unit_of",
    "verdicts",
    "version_lines",
    "versions",
]
