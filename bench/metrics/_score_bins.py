"""The binned ranks of re-ID mAP: each score mapped to a histogram bin by a monotone affine map per query row,
so that a correct item's rank is the count of the bins below its own plus exact comparisons inside its bin.

`bench.metrics.query_gallery` (`_Scorer.positive_ranks`) is the one caller; the bins are computed a slice of
rows at a time so the passes over them stay in a core's cache.
"""

from __future__ import annotations

import torch

# float32 2^23: adding it to a value in [0, 2^23) leaves round(value) in the low bits of the sum's bit pattern
MAGIC, MAGIC_BITS = float(1 << 23), 0x4B000000


def bin_maps(q: torch.Tensor, t: torch.Tensor, rows: int, M: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's (scale, offset) for `score_bins`: its correct scores ``t`` (rows ``q``) from lo to hi onto
    bins 1 to M - 2, 2^23 added to the offset. A row with no spread gets scale (M - 3) / 1; one whose map
    overflows (a subnormal spread) gets (1, 2^23): any finite increasing map keeps the counts exact."""
    inf = torch.full((rows,), float("inf"))
    lo = inf.scatter_reduce(0, q, t, "amin")
    hi = (-inf).scatter_reduce(0, q, t, "amax")
    span = hi - lo
    span = torch.where(torch.isfinite(span) & (span > 0), span, torch.ones_like(span))
    lo = torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo))
    scale = (M - 3) / span
    offset = (1 - lo * scale) + MAGIC
    odd = ~(torch.isfinite(scale) & torch.isfinite(offset))
    return torch.where(odd, 1.0, scale), torch.where(odd, MAGIC, offset)


def score_bins(
    block: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, unbase: torch.Tensor, M: int, buffer: torch.Tensor
) -> torch.Tensor:
    """Each score's bin, flat int32: ``clamp(score x scale + offset, 2^23, 2^23 + M - 1)``, an integer
    (float32 has no fraction from 2^23 up), whose bit pattern less ``unbase`` (2^23's bits less the row's
    first bin, row x M) is the bin. Separate IEEE multiply, add and clamp: an increasing function of the
    score, the same for every element; +inf (excluded items) goes to the row's last bin. Four passes,
    in place in ``buffer`` after the first."""
    rows, G = block.shape
    y = torch.mul(block, scale.unsqueeze(1), out=buffer[: rows * G].view(rows, G))
    y.add_(offset.unsqueeze(1))
    y.clamp_(MAGIC, MAGIC + (M - 1))
    bins = y.view(torch.int32)
    bins.sub_(unbase.unsqueeze(1))
    return bins.view(-1)


def true_positions(mask: torch.Tensor) -> torch.Tensor:
    """Increasing positions of a flat bool tensor's True entries, found 8 bytes at a time (few are True:
    nonzero over the int64 words, then over the bytes of the words that are not zero)."""
    n = len(mask) // 8 * 8
    words = mask[:n].view(torch.int64).nonzero().squeeze(1)
    within = mask[:n].view(-1, 8).index_select(0, words).nonzero()
    found = words[within[:, 0]] * 8 + within[:, 1]
    if n < len(mask):
        found = torch.cat((found, mask[n:].nonzero().squeeze(1) + n))
    return found


def near_ranks(
    flat: torch.Tensor, near: torch.Tensor, q: torch.Tensor, j: torch.Tensor, counted: torch.Tensor, G: int
) -> torch.Tensor:
    """1-based rank of each correct item (row q, column j): ``counted`` (its row's items below its bin
    that share no bin with a correct item) + its row's near items before it in (score, position) order.

    ``flat`` (row x G + column, increasing) and ``near`` (their scores) list the near items, the correct
    items among them. A near item in a lower bin has a lower score, one in a higher bin a higher score,
    so within the row the near items decide the order alone. One stable sort by (row, score) orders them,
    the float32 bits made an increasing integer (negative floats' magnitude bits flipped; -0.0 made +0.0
    first, which compares equal): equal scores keep their position order."""
    bits = (near + 0.0).view(torch.int32).to(torch.int64)
    increasing = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits) + (1 << 31)  # in [0, 2^32)
    sorted_keys, order = torch.sort(((flat // G) << 32) | increasing, stable=True)
    place = torch.empty_like(order)
    place[order] = torch.arange(len(order))
    row_start = torch.searchsorted(sorted_keys, q << 32)
    return counted + place[torch.searchsorted(flat, q * G + j)] - row_start + 1


def equal_pairs(
    query_keys: torch.Tensor,
    gallery_keys: torch.Tensor,
    sorted_gallery: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (query, gallery) index pair with equal keys, by query then gallery position (``sorted_gallery``:
    the gallery keys' stable sort, values and indices, when made beforehand)."""
    sorted_keys, order = sorted_gallery if sorted_gallery is not None else torch.sort(gallery_keys, stable=True)
    lo = torch.searchsorted(sorted_keys, query_keys)
    count = torch.searchsorted(sorted_keys, query_keys, right=True) - lo
    q = torch.repeat_interleave(torch.arange(len(query_keys)), count)
    start = torch.cumsum(count, dim=0) - count
    return q, order[lo[q] + torch.arange(len(q)) - start[q]]


# --------------------------------------------------------------------------- inputs and blocks
