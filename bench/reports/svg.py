"""Inline SVG charts as strings: no plotting library, no fonts or scripts from the network.

The leaderboard page must open from a file on a machine without network,
and must stay the same from one matplotlib version to the next: so the few
chart types it needs are drawn here directly. Every function returns one
`<svg>` element (no `xmlns`, which HTML does not need and which would put a
URL into the page).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from html import escape

import numpy as np

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
FONT = 'font-family="sans-serif" font-size="11"'


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    out = []
    v = start
    while v <= hi + 1e-9 * step:
        out.append(round(v, 12))
        v += step
    return out


def _span(values: Iterable[float | None], pad: float = 0.05) -> tuple[float, float]:
    a = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if a.size == 0:
        return 0.0, 1.0
    lo, hi = float(a.min()), float(a.max())
    if hi - lo <= 1e-9 * max(1.0, abs(hi)):  # constant up to float noise
        d = abs(lo) * 0.05 or 0.5
        return lo - d, hi + d
    d = (hi - lo) * pad
    return lo - d, hi + d


class Frame:
    """Maps data coordinates to pixels inside margins, and draws the axes."""

    def __init__(
        self,
        width: int,
        height: int,
        x: tuple[float, float],
        y: tuple[float, float],
        left: int = 60,
        right: int = 15,
        top: int = 28,
        bottom: int = 40,
    ):
        self.w, self.h = width, height
        self.x0, self.x1 = x
        self.y0, self.y1 = y
        self.l, self.r, self.t, self.b = left, right, top, bottom

    def px(self, x: float) -> float:
        """The pixel column of data value ``x``."""
        return self.l + (x - self.x0) / (self.x1 - self.x0) * (self.w - self.l - self.r)

    def py(self, y: float) -> float:
        """The pixel row of data value ``y`` (SVG rows grow downwards)."""
        return self.h - self.b - (y - self.y0) / (self.y1 - self.y0) * (self.h - self.t - self.b)

    def axes(self, xlabel: str, ylabel: str, xticks: bool = True, yticks: bool = True) -> list[str]:
        """The plot area, tick marks with values, and the axis labels, as SVG elements."""
        parts = [
            f'<rect x="{self.l}" y="{self.t}" width="{self.w - self.l - self.r}" '
            f'height="{self.h - self.t - self.b}" fill="#fff" stroke="#999"/>'
        ]
        if xticks:
            for v in ticks(self.x0, self.x1):
                x = self.px(v)
                parts.append(
                    f'<line x1="{x:.1f}" y1="{self.h - self.b}" x2="{x:.1f}" y2="{self.h - self.b + 4}" stroke="#666"/>'
                )
                parts.append(
                    f'<text x="{x:.1f}" y="{self.h - self.b + 15}" text-anchor="middle" {FONT}>{_num(v)}</text>'
                )
        if yticks:
            for v in ticks(self.y0, self.y1):
                y = self.py(v)
                parts.append(f'<line x1="{self.l - 4}" y1="{y:.1f}" x2="{self.l}" y2="{y:.1f}" stroke="#666"/>')
                parts.append(f'<text x="{self.l - 6}" y="{y + 4:.1f}" text-anchor="end" {FONT}>{_num(v)}</text>')
        parts.append(
            f'<text x="{(self.l + self.w - self.r) / 2:.1f}" y="{self.h - 6}" text-anchor="middle" {FONT}>{escape(xlabel)}</text>'
        )
        if ylabel:
            cy = (self.t + self.h - self.b) / 2
            parts.append(
                f'<text transform="translate(12,{cy:.1f}) rotate(-90)" text-anchor="middle" {FONT}>{escape(ylabel)}</text>'
            )
        return parts


def _num(v: float) -> str:
    return f"{v:.4g}"


def _svg(width: int, height: int, title: str, parts: list[str], kind: str) -> str:
    body = "\n".join(parts)
    return (
        f'<svg class="plot plot-{kind}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        f"<title>{escape(title)}</title>"
        f'<text x="{width / 2:.0f}" y="16" text-anchor="middle" font-family="sans-serif" font-size="13" font-weight="bold">{escape(title)}</text>'
        f"\n{body}\n</svg>"
    )


def ci_plot(
    labels: Sequence[str],
    means: Sequence[float],
    lows: Sequence[float],
    highs: Sequence[float],
    title: str,
    xlabel: str,
) -> str:
    """Horizontal dot-and-whisker chart: one row per cell, its mean and interval."""
    n = len(labels)
    left = min(260, 12 + 7 * max((len(s) for s in labels), default=4))
    height = 60 + 22 * max(n, 1)
    lo, hi = _span([*means, *lows, *highs])
    f = Frame(640, height, (lo, hi), (n - 0.5, -0.5), left=left)
    parts = f.axes(xlabel, "", yticks=False)
    for i, (lab, m, a, b) in enumerate(zip(labels, means, lows, highs)):
        y = f.py(i)
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" {FONT}>{escape(lab)}</text>')
        if math.isfinite(a) and math.isfinite(b):
            parts.append(
                f'<line class="ci" x1="{f.px(a):.1f}" y1="{y:.1f}" x2="{f.px(b):.1f}" y2="{y:.1f}" stroke="{PALETTE[0]}" stroke-width="2"/>'
            )
        if math.isfinite(m):
            parts.append(
                f'<circle class="mean" cx="{f.px(m):.1f}" cy="{y:.1f}" r="4" fill="{PALETTE[0]}"><title>{escape(lab)}: {_num(m)}</title></circle>'
            )
    return _svg(640, height, title, parts, "ci")


def scatter(
    points: Sequence[tuple[float, float, str]],
    title: str,
    xlabel: str,
    ylabel: str,
    yerr: Sequence[tuple[float, float]] | None = None,
    diagonal: bool = False,
    note: str = "",
) -> str:
    """Labelled points, optional vertical intervals and the y = x line (validation vs test)."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    extra = [v for e in (yerr or []) for v in e]
    x0, x1 = _span(xs + (ys if diagonal else []), 0.1)
    y0, y1 = _span(ys + extra + (xs if diagonal else []), 0.1)
    f = Frame(520, 400, (x0, x1), (y0, y1))
    parts = f.axes(xlabel, ylabel)
    if diagonal:
        a, b = max(x0, y0), min(x1, y1)
        if a < b:
            parts.append(
                f'<line x1="{f.px(a):.1f}" y1="{f.py(a):.1f}" x2="{f.px(b):.1f}" y2="{f.py(b):.1f}" stroke="#bbb" stroke-dasharray="4 3"/>'
            )
    for i, (x, y, lab) in enumerate(points):
        if not (math.isfinite(x) and math.isfinite(y)):
            continue
        c = PALETTE[i % len(PALETTE)]
        if yerr and math.isfinite(yerr[i][0]) and math.isfinite(yerr[i][1]):
            parts.append(
                f'<line class="ci" x1="{f.px(x):.1f}" y1="{f.py(yerr[i][0]):.1f}" x2="{f.px(x):.1f}" y2="{f.py(yerr[i][1]):.1f}" stroke="{c}"/>'
            )
        parts.append(
            f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="4" fill="{c}"><title>{escape(lab)}</title></circle>'
        )
        right = f.px(x) > (f.l + f.w - f.r) / 2  # labels point inwards so they stay inside the chart
        tx, anchor = (f.px(x) - 6, "end") if right else (f.px(x) + 6, "start")
        parts.append(
            f'<text x="{tx:.1f}" y="{f.py(y) - 6:.1f}" text-anchor="{anchor}" {FONT} fill="{c}">{escape(lab)}</text>'
        )
    if note:
        parts.append(f'<text x="{f.l + 6}" y="{f.t + 14}" {FONT}>{escape(note)}</text>')
    return _svg(520, 400, title, parts, "scatter")


def histograms(series: dict[str, np.ndarray], title: str, xlabel: str, bins: int = 40) -> str:
    """Overlaid density histograms on shared bins (positive vs negative pair distances)."""
    arrays = {k: np.asarray(v, dtype=float).ravel() for k, v in series.items()}
    arrays = {k: v[np.isfinite(v)] for k, v in arrays.items()}
    allv = np.concatenate([v for v in arrays.values() if v.size] or [np.zeros(1)])
    lo, hi = float(allv.min()), float(allv.max())
    if hi <= lo:
        hi = lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    dens = {k: (np.histogram(v, edges, density=True)[0] if v.size else np.zeros(bins)) for k, v in arrays.items()}
    top = max((float(d.max()) for d in dens.values()), default=1.0) or 1.0
    f = Frame(420, 280, (lo, hi), (0.0, top * 1.05))
    parts = f.axes(xlabel, "density")
    for i, (name, d) in enumerate(dens.items()):
        c = PALETTE[i % len(PALETTE)]
        pts = [f"{f.px(edges[0]):.1f},{f.py(0):.1f}"]
        for j, v in enumerate(d):
            pts += [f"{f.px(edges[j]):.1f},{f.py(v):.1f}", f"{f.px(edges[j + 1]):.1f},{f.py(v):.1f}"]
        pts.append(f"{f.px(edges[-1]):.1f},{f.py(0):.1f}")
        parts.append(f'<polygon class="hist" points="{" ".join(pts)}" fill="{c}" fill-opacity="0.35" stroke="{c}"/>')
        parts.append(f'<rect x="{f.w - f.r - 150}" y="{f.t + 8 + 16 * i}" width="10" height="10" fill="{c}"/>')
        parts.append(
            f'<text x="{f.w - f.r - 135}" y="{f.t + 17 + 16 * i}" {FONT}>{escape(name)} (n={arrays[name].size})</text>'
        )
    return _svg(420, 280, title, parts, "hist")


def lines(
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    markers: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
) -> str:
    """Step lines (best so far) with optional points (each trial's value)."""
    allx = [x for xs, _ in [*series.values(), *(markers or {}).values()] for x in xs]
    ally = [y for _, ys in [*series.values(), *(markers or {}).values()] for y in ys]
    f = Frame(420, 260, _span(allx), _span(ally))
    parts = f.axes(xlabel, ylabel)
    for i, (name, (xs, ys)) in enumerate((markers or {}).items()):
        c = PALETTE[(i + 1) % len(PALETTE)]
        for x, y in zip(xs, ys):
            if math.isfinite(x) and math.isfinite(y):
                parts.append(
                    f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="3" fill="{c}" fill-opacity="0.7"><title>{escape(name)} {_num(x)}: {_num(y)}</title></circle>'
                )
    for i, (xs, ys) in enumerate(series.values()):
        c = PALETTE[i % len(PALETTE)]
        pts = [(x, y) for x, y in zip(xs, ys) if math.isfinite(x) and math.isfinite(y)]
        if pts:
            d = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in pts)
            parts.append(f'<polyline class="line" points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
    return _svg(420, 260, title, parts, "lines")


def points2d(xy: np.ndarray, labels: np.ndarray, title: str, max_points: int = 2000) -> str:
    """A 2-D embedding, one colour per class (colours repeat past eight classes)."""
    xy = np.asarray(xy, dtype=float)
    labels = np.asarray(labels).ravel()
    if len(xy) > max_points:
        keep = np.random.default_rng(0).choice(len(xy), max_points, replace=False)
        xy, labels = xy[np.sort(keep)], labels[np.sort(keep)]
    f = Frame(420, 420, _span(xy[:, 0]), _span(xy[:, 1]))
    parts = f.axes("dimension 1", "dimension 2")
    classes = {c: i for i, c in enumerate(dict.fromkeys(labels.tolist()))}
    for (x, y), c in zip(xy, labels.tolist()):
        parts.append(
            f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="2" fill="{PALETTE[classes[c] % len(PALETTE)]}" fill-opacity="0.7"/>'
        )
    return _svg(420, 420, title, parts, "embedding")
