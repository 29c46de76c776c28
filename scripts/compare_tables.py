"""Does a cheaper protocol give the same answers as the full one? Two results folders of the same cells compared.

    python scripts/compare_tables.py results/omniglot-standard-sha results/omniglot-standard \
        --reference 'results/omniglot-standard@dc3c2141bac6' \
        --claims protocols/claims/omniglot-standard.yaml --out results/omniglot-standard-sha/comparison.md

Three figures, each against what the full protocol itself can promise:

1. **Ranking.** The cells both folders ran are ranked by the mean of the primary metric over final seeds;
   Kendall's tau between the cheap and the full ranking. How much two full runs agree bounds what a cheap
   one can be asked for: ``--reference`` (a second run of the full protocol, or an earlier version of it)
   gives tau between two full runs on their common cells; and a seed bootstrap gives the agreement that
   seed noise alone allows: each cell's final seeds of the full table resampled with replacement twice,
   tau between the two resampled rankings, over ``--bootstrap`` draws (its median and 10th percentile).
   The cheap ranking passes when its tau is at least the two full runs' tau (the bootstrap's 10th
   percentile where no reference is given).
2. **Verdicts.** The claims file judged on both folders (the cheap folder as if it were the claims file's
   protocol: same cells, other tuning and seed rules); every claim must get the same verdict.
3. **Compute.** Training iterations (every trial, rung and final seed the tables hold) of the cheap run
   over the full one's, and the same for the recorded wall seconds.

Exit status: 0 when the comparison was made (``--check``: 0 only when all three pass, with
``--max-fraction`` the compute bound, 1 otherwise); 2 for an unreadable folder or claims file.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from bench.errors import BenchError
from bench.reports import claims, source
from bench.reports.budget import kendall_tau


def ranks(means: dict[str, float]) -> dict[str, int]:
    """1 for the best mean; ties broken by cell id, so the ranking is a function of the means."""
    order = sorted(means, key=lambda c: (-means[c], c))
    return {c: i + 1 for i, c in enumerate(order)}


def means(res: source.Results, cells: list[str]) -> dict[str, float]:
    return {c: float(np.mean(res.values(c, res.primary))) for c in cells}


def tau_between(a: source.Results, b: source.Results) -> tuple[float, list[str]]:
    """Kendall's tau between two folders' rankings of the cells both ran, and those cells."""
    shared = sorted(set(a.cells) & set(b.cells))
    return kendall_tau(ranks(means(a, shared)), ranks(means(b, shared))), shared


def seed_bootstrap(res: source.Results, cells: list[str], draws: int, seed: int = 0) -> np.ndarray:
    """Tau between two independent seed resamplings of one table, ``draws`` times: the agreement seed noise
    alone leaves between two runs of the same tuned configurations."""
    rng = np.random.default_rng(seed)
    values = {c: np.asarray(res.values(c, res.primary), dtype=float) for c in cells}
    out = np.empty(draws)
    for k in range(draws):
        one, two = (ranks({c: float(rng.choice(v, size=v.size).mean()) for c, v in values.items()}) for _ in range(2))
        out[k] = kendall_tau(one, two)
    return out


def iterations(res: source.Results) -> tuple[int, float]:
    """Training iterations and wall seconds of every trial and final seed the folder's tables hold."""
    total, wall = 0, 0.0
    for frame in (res.trials, res.finals):
        if frame is None:
            continue
        total += int(frame["iterations"].fillna(0).sum())
        wall += float(frame["wall_time_s"].fillna(0).sum())
    return total, wall


def verdicts(cf: claims.ClaimsFile, res: source.Results) -> dict[str, str] | str:
    """Each claim's verdict on ``res`` judged as the claims file's protocol, or why it could not be judged."""
    try:
        judged = claims.evaluate(dataclasses.replace(cf, protocol=res.protocol), res)
    except BenchError as e:
        return str(e)
    return {str(v.claim["id"]): v.verdict for v in judged}


def compare(args: argparse.Namespace) -> tuple[str, bool]:
    cheap, full = source.load(args.cheap), source.load(args.full)
    if cheap.primary != full.primary:
        raise BenchError(f"the two folders rank by different metrics: {cheap.primary} and {full.primary}")
    tau, shared = tau_between(cheap, full)
    lines = [
        f"# {cheap.protocol} against {full.protocol}",
        "",
        f"- cheap: `{args.cheap}` (protocol hash {cheap.protocol_hash[:12]})",
        f"- full: `{args.full}` (protocol hash {full.protocol_hash[:12]})",
        f"- ranked by the mean test `{full.primary}` over final seeds; {len(shared)} cells in both",
        "",
        "## 1. Ranking",
        "",
        f"| cell | {cheap.protocol} | rank | {full.protocol} | rank |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    m_cheap, m_full = means(cheap, shared), means(full, shared)
    r_cheap, r_full = ranks(m_cheap), ranks(m_full)
    for c in sorted(shared, key=r_full.__getitem__):
        lines.append(f"| `{c}` | {m_cheap[c]:.4f} | {r_cheap[c]} | {m_full[c]:.4f} | {r_full[c]} |")
    only = sorted(set(cheap.cells) ^ set(full.cells))
    if only:
        lines += ["", "Cells only one folder ran (not ranked): " + ", ".join(f"`{c}`" for c in only)]
    boot = seed_bootstrap(full, shared, args.bootstrap)
    lines += [
        "",
        f"Kendall's tau, cheap against full: **{tau:.3f}**.",
        f"Seed noise alone (the full table's seeds resampled twice, {args.bootstrap} draws): median "
        f"{np.median(boot):.3f}, 10th percentile {np.percentile(boot, 10):.3f}.",
    ]
    bound = float(np.percentile(boot, 10))
    if args.reference is not None:
        reference = source.load(args.reference)
        tau_ref, shared_ref = tau_between(reference, full)
        bound = tau_ref
        lines.append(
            f"Two full runs (`{args.reference}`, hash {reference.protocol_hash[:12]}, against the full table, "
            f"{len(shared_ref)} common cells): {tau_ref:.3f}."
        )
    rank_ok = tau >= bound - 1e-12
    lines.append(f"Ranking: {'met' if rank_ok else 'missed'} (tau {tau:.3f} against the bound {bound:.3f}).")

    lines += ["", "## 2. Verdicts", ""]
    verdict_ok = True
    if args.claims is None:
        lines.append("No claims file given.")
    else:
        cf = claims.parse(args.claims)
        on_cheap, on_full = verdicts(cf, cheap), verdicts(cf, full)
        if isinstance(on_cheap, str) or isinstance(on_full, str):
            verdict_ok = False
            lines.append(f"Not judged: {on_cheap if isinstance(on_cheap, str) else on_full}")
        else:
            lines += ["| claim | cheap | full | same |", "| --- | --- | --- | --- |"]
            for claim_id, verdict in on_full.items():
                same = on_cheap.get(claim_id) == verdict
                verdict_ok &= same
                lines.append(
                    f"| `{claim_id}` | {on_cheap.get(claim_id, '-')} | {verdict} | {'yes' if same else 'NO'} |"
                )
            lines.append("")
            lines.append(f"Verdicts: {'all agree' if verdict_ok else 'some differ'} ({len(on_full)} claims).")

    (it_cheap, wall_cheap), (it_full, wall_full) = iterations(cheap), iterations(full)
    fraction = it_cheap / it_full if it_full else float("nan")
    compute_ok = fraction <= args.max_fraction
    lines += [
        "",
        "## 3. Compute",
        "",
        f"Training iterations (trials, rungs and final seeds): {it_cheap:,} against {it_full:,}: "
        f"**{fraction:.1%}** (bound {args.max_fraction:.0%}: {'met' if compute_ok else 'missed'}).",
        f"Recorded wall seconds of those runs: {wall_cheap:,.0f} against {wall_full:,.0f} "
        f"({wall_cheap / wall_full:.1%}; the two ran on the hardware their manifests name).",
    ]
    return "\n".join(lines) + "\n", rank_ok and verdict_ok and compute_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cheap", type=Path, help="results folder of the cheaper protocol")
    parser.add_argument("full", type=Path, help="results folder of the full protocol")
    parser.add_argument("--reference", type=Path, help="a second full run: its agreement with FULL is the bound")
    parser.add_argument("--claims", type=Path, help="claims file judged on both folders")
    parser.add_argument("--bootstrap", type=int, default=2000, help="seed-bootstrap draws (default 2000)")
    parser.add_argument("--max-fraction", type=float, default=0.25, help="compute bound (default 0.25)")
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    parser.add_argument("--check", action="store_true", help="exit 1 unless all three figures pass")
    args = parser.parse_args(argv)
    try:
        report, passed = compare(args)
    except BenchError as e:
        print(f"compare_tables: {e}", file=sys.stderr)
        return 2
    print(report, end="")
    if args.out is not None:
        args.out.write_text(report)
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
