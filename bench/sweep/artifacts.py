"""What the first final seed of a cell leaves for the reports: test pair distances and the 2-D embedding.

The pairs are drawn with a generator seeded by the protocol seed alone, so
every cell's histogram is over the same test pairs (common random numbers,
as for training). File names and folders are bench.sweep.tables'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bench.atomic import write_npz
from bench.evaluation import embed
from bench.sweep import tables
from bench.sweep.seeds import derive_seed

PAIR_SAMPLE = 20000  # positive and negative pairs kept in pair_distances.npz


def write_cell_artifacts(
    model: Any,
    test: Any,
    directory: Path,
    *,
    protocol_seed: int,
    normalize: bool,
    device: str = "cpu",
    metric: Any = None,
) -> list[Path]:
    """Embed the test data with ``model`` and write pair distances (and the 2-D embedding when 2-d).

    The distances are Euclidean in the protocol geometry, or, for a cell
    ranked by its learned metric (``metric``, `bench.evaluation.pair_scorer_of`),
    that metric's ``g`` of the same pairs. Returns the files written, for the
    caller to attach to its records.
    """
    emb = embed(model, test.x, device=device, normalize=normalize)  # the geometry every metric uses
    if metric is not None:
        prepared = metric.prepare(embed(model, test.x, device=device))

        def distance(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
            return metric.paired(prepared[i], prepared[j])
    else:

        def distance(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
            return (emb[i] - emb[j]).norm(dim=1)

    y = test.y
    generator = torch.Generator().manual_seed(derive_seed(protocol_seed, "pairs"))
    n = len(y)
    a = torch.randint(0, n, (PAIR_SAMPLE * 4,), generator=generator)
    b = torch.randint(0, n, (PAIR_SAMPLE * 4,), generator=generator)
    keep = a != b
    a, b = a[keep], b[keep]
    same = y[a] == y[b]
    d = distance(a, b)
    pos, neg = d[same][:PAIR_SAMPLE].numpy(), d[~same][:PAIR_SAMPLE].numpy()
    # positives are rare among random pairs: add every positive pair of up to PAIR_SAMPLE anchors
    if len(pos) < PAIR_SAMPLE:
        i, j = positive_pairs(y)
        order = torch.randperm(len(i), generator=generator)[:PAIR_SAMPLE]
        pos = distance(i[order], j[order]).numpy()
    written = [directory / tables.PAIR_DISTANCES]
    write_npz(written[0], pos=pos, neg=neg)
    if emb.shape[1] == 2:
        written.append(directory / tables.EMBEDDING_2D)
        write_npz(written[1], x=emb.numpy(), y=y.numpy())
    return written


def positive_pairs(y: Any) -> tuple[Any, Any]:
    """Every pair ``(i, j)`` with ``i < j`` and ``y[i] == y[j]``, in row-major order (by ``i``, then ``j``): what
    ``torch.where((y[:, None] == y[None, :]).triu(1))`` gives, built class by class in memory of the pairs
    themselves rather than of the N x N mask (174 million entries for Omniglot's 13,180 test images)."""
    n = len(y)
    members = torch.argsort(y, stable=True)  # each class's samples together, ascending within it
    _, counts = torch.unique_consecutive(y[members], return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    keys = []
    for size in torch.unique(counts).tolist():
        if size < 2:
            continue
        first = starts[counts == size]
        rows = members[first[:, None] + torch.arange(size)]  # (classes of this size, size), ascending
        a, b = torch.triu_indices(size, size, 1)
        keys.append((rows[:, a] * n + rows[:, b]).reshape(-1))
    key = torch.sort(torch.cat(keys)).values if keys else torch.empty(0, dtype=torch.int64)
    return key // n, key % n
