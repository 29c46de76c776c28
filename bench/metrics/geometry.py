"""The geometry embeddings are evaluated in: the one the protocol trains in.

A protocol with ``model.normalize: true`` trains every loss on L2-normalised
embeddings; ranking the raw trunk outputs instead would score a geometry the
model never saw (the gap is loss-dependent and measured above the claims'
equivalence margin; docs/METHODS.md, *Geometry*). So every metric and every saved embedding
goes through `to_geometry`, and every record names the geometry it used.
PML's testers normalise by default for the same reason.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.errors import BenchError

L2_NORMALIZED = "l2_normalized"
RAW = "raw"
GEOMETRIES = (L2_NORMALIZED, RAW)


def geometry(normalize: bool) -> str:
    """The geometry's name for a protocol's ``model.normalize`` (what records store)."""
    if not isinstance(normalize, bool):
        raise BenchError(f"normalize must be true or false, got {normalize!r}")
    return L2_NORMALIZED if normalize else RAW


def to_geometry(embeddings: torch.Tensor, name: str) -> torch.Tensor:
    """Embeddings as the metrics must see them: unit rows for ``l2_normalized``, untouched for ``raw``."""
    if name not in GEOMETRIES:
        raise BenchError(f"unknown geometry {name!r}: expected one of {', '.join(GEOMETRIES)}")
    return F.normalize(embeddings, p=2, dim=1) if name == L2_NORMALIZED else embeddings
