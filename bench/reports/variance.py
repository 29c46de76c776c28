"""What a verdict costs: a cell's variance split into tuning noise and seed noise, and the design a claim needs.

Under ``tuning.repeats: R`` a cell's final rows are R tuning draws of S final
seeds each, and a seed's score is y_rs = mu + t_r + e_rs (t_r the draw's
effect, variance s_t^2; e_rs the seed's, variance s_e^2). One-way
random-effects ANOVA (docs/METHODS.md, *What a verdict costs*) estimates

* s_e^2 by the pooled within-draw variance, sum_r (n_r - 1) s_r^2 / sum_r (n_r - 1);
* s_t^2 by var(draw means) - s_e^2 mean_r(1/n_r), which is unbiased and may be
  negative; the reported value is max(0, that);
* the tuning share s_t^2 / (s_t^2 + s_e^2) (the intraclass correlation), with
  the F interval of a balanced design (Searle 1971), S the harmonic mean of
  the n_r when the draws lost seeds; s_e^2 with its chi-square interval.

A paired claim between two cells is tested over draws (each draw's mean
difference over its seeds), so one draw's difference has variance
s_t,d^2 + s_e,d^2 / S: the same ANOVA run on the per-(draw, seed) differences
of the two cells (common random numbers: the same seeds in both cells), or,
for one cell alone, two independent cells like it (2 s_t^2 + 2 s_e^2 / S,
the value without common random numbers; they usually make it smaller). The
number of draws a claim of effect d needs at power 1 - beta and two-sided
alpha is the smallest n >= 2 with n >= (t_{n-1, 1-alpha/2} + t_{n-1, 1-beta})^2
s^2 / d^2 (the normal formula with the t correction for small n).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as st

from bench.errors import BenchError
from bench.plan import trained_cell
from bench.reports.source import Results

__all__ = [
    "SEED_CHOICES",
    "Design",
    "Split",
    "aligned",
    "cell_split",
    "designs",
    "doubled",
    "draw_cost",
    "draws_needed",
    "pair_split",
    "require_draws",
    "split",
]

NAN = math.nan
SEED_CHOICES = (1, 2, 3, 5, 10)  # seeds per draw the design table offers, besides the sweep's own


@dataclass(frozen=True)
class Split:
    """One-way random-effects ANOVA of R groups (tuning draws) of values (final seeds)."""

    draws: int  # groups with at least one value
    seeds: float  # seeds per draw: the harmonic mean of the n_r (S, exact when every draw kept all its seeds)
    mean: float
    seed_var: float  # s_e^2, pooled within draws (NaN when no draw has two seeds)
    seed_df: int
    tuning_var_raw: float  # var(draw means) - s_e^2 mean(1/n_r): unbiased for s_t^2, may be negative
    seed_var_low: float = NAN
    seed_var_high: float = NAN
    share_low: float = NAN
    share_high: float = NAN

    @property
    def tuning_var(self) -> float:
        """s_t^2: the unbiased estimate truncated at zero (a variance is never negative)."""
        return max(0.0, self.tuning_var_raw) if math.isfinite(self.tuning_var_raw) else NAN

    @property
    def tuning_sd(self) -> float:
        return math.sqrt(self.tuning_var) if math.isfinite(self.tuning_var) else NAN

    @property
    def seed_sd(self) -> float:
        return math.sqrt(self.seed_var) if math.isfinite(self.seed_var) else NAN

    @property
    def share(self) -> float:
        """s_t^2 / (s_t^2 + s_e^2): the tuning's share of one run's variance (NaN when both are zero)."""
        total = self.tuning_var + self.seed_var
        return self.tuning_var / total if math.isfinite(total) and total > 0 else NAN

    def draw_var(self, seeds: float) -> float:
        """The variance of one draw's mean over ``seeds`` seeds: s_t^2 + s_e^2 / seeds."""
        return self.tuning_var + self.seed_var / seeds


def split(groups: Iterable[Sequence[float] | np.ndarray], level: float = 0.95) -> Split:
    """The ANOVA of ``groups`` (one sequence of seed values per draw; NaN values and empty draws dropped)."""
    arrays = [a[np.isfinite(a)] for a in (np.asarray(g, dtype=float) for g in groups)]
    arrays = [a for a in arrays if len(a)]
    r = len(arrays)
    if r == 0:
        return Split(0, NAN, NAN, NAN, 0, NAN)
    n = np.array([len(a) for a in arrays], dtype=float)
    means = np.array([a.mean() for a in arrays])
    grand = float(np.concatenate(arrays).mean())
    df_e = int((n - 1).sum())
    seed_var = float(sum(((a - a.mean()) ** 2).sum() for a in arrays) / df_e) if df_e else NAN
    inv = float((1 / n).mean())
    s = 1 / inv
    if r < 2 or not math.isfinite(seed_var):
        return Split(r, s, grand, seed_var, df_e, NAN)
    between = float(means.var(ddof=1))
    raw = between - seed_var * inv
    alpha = 1 - level
    e_low = df_e * seed_var / st.chi2.ppf(1 - alpha / 2, df_e)
    e_high = df_e * seed_var / st.chi2.ppf(alpha / 2, df_e)
    share_low = share_high = NAN
    if seed_var > 0:
        f0 = s * between / seed_var  # MS_between / MS_within
        f_low = f0 / st.f.ppf(1 - alpha / 2, r - 1, df_e)
        f_high = f0 / st.f.ppf(alpha / 2, r - 1, df_e)
        share_low = min(1.0, max(0.0, (f_low - 1) / (f_low + s - 1)))
        share_high = min(1.0, max(0.0, (f_high - 1) / (f_high + s - 1)))
    return Split(r, s, grand, seed_var, df_e, raw, float(e_low), float(e_high), share_low, share_high)


def draws_needed(sd: float, effect: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Units (draws, or seeds) a paired two-sided t-test at ``alpha`` needs to detect ``effect`` with ``power``,
    when one unit's difference has standard deviation ``sd``: the smallest n >= 2 with
    n >= (t_{n-1, 1-alpha/2} + t_{n-1, power})^2 sd^2 / effect^2. Starts from the normal formula; the t
    quantiles fall as n grows, so the first n that satisfies it is the answer."""
    if not (effect > 0 and math.isfinite(effect)):
        raise BenchError(f"the effect must be a positive number, not {effect!r}")
    if not math.isfinite(sd):
        raise ValueError("no standard deviation to size the design with")
    ratio = (sd / effect) ** 2
    n = max(2, math.ceil((st.norm.ppf(1 - alpha / 2) + st.norm.ppf(power)) ** 2 * ratio))
    if n > 1_000_000:  # t is the normal there
        return n
    while n < (st.t.ppf(1 - alpha / 2, n - 1) + st.t.ppf(power, n - 1)) ** 2 * ratio:
        n += 1
    return n


@dataclass(frozen=True)
class Design:
    """Seeds per draw and tuning draws that give a claim of ``effect`` its power, and what that costs a cell."""

    seeds: int
    draws: int
    draw_sd: float  # one draw's difference, sqrt(s_t,d^2 + s_e,d^2 / seeds)
    runs: float  # training runs per cell: draws x (tuning runs of a draw + seeds)
    iterations: float  # iterations per cell, at the sweep's recorded cost of a draw's tuning and of a seed


def designs(
    diff: Split,
    effect: float,
    tuning_runs: float,
    tuning_iterations: float,
    seed_iterations: float,
    seeds: Iterable[int] = SEED_CHOICES,
    alpha: float = 0.05,
    power: float = 0.8,
) -> list[Design]:
    """For each choice of seeds per draw, the draws a paired claim needs (``diff``: the split of one draw's
    difference) and the cost per cell; ``tuning_*``: one draw's tuning as the sweep recorded it."""
    out = []
    for s in sorted(set(seeds)):
        sd = math.sqrt(diff.draw_var(s))
        r = draws_needed(sd, effect, alpha, power)
        out.append(Design(s, r, sd, r * (tuning_runs + s), r * (tuning_iterations + s * seed_iterations)))
    return out


def require_draws(res: Results) -> None:
    """A one-line refusal for results of one tuning draw: the tuning share cannot be seen there."""
    if not res.draws:
        raise BenchError(
            f"{res.root}: one tuning draw (tuning.repeats: 1): the tuning's share of the variance is invisible "
            "there, and a design sized on the seeds alone would miss it; rerun with tuning.repeats: 2 or more"
        )


def _groups(rows: pd.DataFrame, metric: str) -> list[np.ndarray]:
    return [g[metric].to_numpy(dtype=float) for _, g in rows.sort_values(["draw", "seed"]).groupby("draw", sort=True)]


def cell_split(res: Results, cell: str, metric: str) -> Split:
    """The ANOVA of one cell's final seeds by tuning draw."""
    require_draws(res)
    res.require_cell(cell)
    return split(_groups(res.rows(cell), metric))


def pair_split(res: Results, a: str, b: str, metric: str) -> tuple[Split, int]:
    """The ANOVA of the differences ``a - b`` over the (draw, seed) pairs both cells completed (common random
    numbers: the same seeds, draw by draw), and how many pairs there are."""
    require_draws(res)
    for cell in (a, b):
        res.require_cell(cell)
    keep = ["draw", "seed", metric]
    joined = res.rows(a)[keep].merge(res.rows(b)[keep], on=["draw", "seed"], suffixes=("_a", "_b"))
    joined = joined.assign(d=joined[f"{metric}_a"] - joined[f"{metric}_b"])
    joined = joined[np.isfinite(joined["d"].to_numpy(dtype=float))]
    return split(_groups(joined.rename(columns={"d": "_d"}), "_d")), len(joined)


def doubled(s: Split) -> Split:
    """The split of the difference of two independent cells each like ``s``: every variance twice."""
    return Split(
        s.draws,
        s.seeds,
        0.0,
        2 * s.seed_var,
        s.seed_df,
        2 * s.tuning_var,
        2 * s.seed_var_low,
        2 * s.seed_var_high,
        s.share_low,
        s.share_high,
    )


def draw_cost(res: Results, cell: str) -> tuple[float, float, float]:
    """One tuning draw's training runs and iterations (its trials as recorded, each fold a run), and one
    final seed's iterations, for ``cell``: the cost a design is priced at."""
    recorded = res.manifest.get("budget")
    manifest_budget: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    draws = max(1, int(manifest_budget.get("draws", 1) or 1))
    folds = max(1, int(manifest_budget.get("folds", 1) or 1))
    trials = res.trials
    trained = trained_cell(cell)  # a final.mode folds row's trials are its trained cell's
    t = trials[trials["cell"].astype(str) == trained] if trials is not None and "cell" in trials else None
    if t is not None and len(t):
        runs = len(t) * folds / draws
        iterations = float(pd.to_numeric(t["iterations"], errors="coerce").fillna(0).sum()) / draws
    else:
        per = float(manifest_budget.get("iterations", NAN))
        runs = float(manifest_budget.get("trials", NAN)) * folds
        iterations = runs * per
    seed_it = float(pd.to_numeric(res.rows(cell)["iterations"], errors="coerce").mean())
    return runs, iterations, seed_it


def aligned(head: list[str], rows: list[list[str]]) -> str:
    """A plain terminal table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)])
