"""Compare two procedures' rankings of the same methods: a `final.mode: folds` sweep (the Reality Check's
fold models, "separate" and "concatenated") against a retrain-with-seeds sweep, paired by cell.

    python scripts/compare_procedures.py results/omniglot-mlrc 'results/omniglot-standard@dc3c2141bac6' \
        --out results/omniglot-mlrc/procedures.md

(the retrain table of the protocol version the folds sweep was compared with, dc3c2141bac6: Kendall's tau
0.60 in both evaluations; against the rerun `results/omniglot-standard`, 6b03d10fd0ca, it is 0.40.)

For each evaluation of the folds sweep, the cells both sweeps ran are ranked by the mean of the primary
metric in each, and Kendall's tau between the two rankings is printed with the table of means and ranks.
Cells only one sweep ran are named, not ranked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.plan import EVALUATIONS, trained_cell
from bench.reports import source
from bench.reports.budget import kendall_tau


def ranks(means: dict[str, float]) -> dict[str, int]:
    order = sorted(means, key=lambda c: (-means[c], c))
    return {c: i + 1 for i, c in enumerate(order)}


def compare(folds_dir: Path, retrain_dir: Path) -> str:
    folds, retrain = source.load(folds_dir), source.load(retrain_dir)
    metric = folds.primary
    if retrain.primary != metric:
        raise SystemExit(f"the two sweeps rank by different metrics: {metric} and {retrain.primary}")
    base = {c: float(retrain.values(c, metric).mean()) for c in retrain.cells}
    lines = [
        f"## {folds.protocol} against {retrain.protocol}: rankings of `{metric}`, paired by cell",
        "",
        f"- folds sweep: `{folds_dir}` (protocol hash {folds.protocol_hash[:12]})",
        f"- retrain sweep: `{retrain_dir}` (protocol hash {retrain.protocol_hash[:12]})",
        "",
    ]
    for evaluation in EVALUATIONS:
        mine = {
            trained_cell(c): float(folds.values(c, metric).mean()) for c in folds.cells if c.endswith(":" + evaluation)
        }
        shared = sorted(set(mine) & set(base))
        a, b = ranks({c: mine[c] for c in shared}), ranks({c: base[c] for c in shared})
        tau = kendall_tau(a, b)
        lines += [
            f"### {evaluation}: Kendall's tau {tau:.3f} over {len(shared)} cells",
            "",
            f"| cell | {evaluation} {metric} | rank | retrain {metric} | rank |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        lines += [f"| `{c}` | {mine[c]:.3f} | {a[c]} | {base[c]:.3f} | {b[c]} |" for c in sorted(shared, key=a.get)]
        only = sorted(set(mine) ^ set(base))
        lines += ["", f"not in both: {', '.join(only) if only else 'none'}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folds", type=Path, help="results folder of the final.mode folds sweep")
    parser.add_argument("retrain", type=Path, help="results folder of the retrain sweep")
    parser.add_argument("--out", type=Path, help="also write the comparison to this Markdown file")
    args = parser.parse_args(argv)
    text = compare(args.folds, args.retrain)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
