"""A test side made of a query set and a separate gallery (In-shop, Market-1501), as `data.test` may name it.

A protocol's ``data.test`` is either one spec (the test set retrieves
itself) or ``{query: SPEC, gallery: SPEC}``. The test classes are the
query's; the gallery may hold more (Market-1501's distractors and junk).
Which gallery item is which query is said by sample ids: when both sides
name the same spec they are one set, sample i of one being sample i of the
other, so a query never retrieves itself; otherwise they share no sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bench.data.labeled import LabeledData
from bench.errors import BenchError

CAMERA = "camera"


def is_query_gallery(test: Any) -> bool:
    """Whether a protocol's ``data.test`` is the query/gallery form."""
    return isinstance(test, dict)


def test_specs(test: Any) -> list[str]:
    """The dataset specs a ``data.test`` names: one, or the query's and the gallery's."""
    return [test["query"], test["gallery"]] if is_query_gallery(test) else [test]


def describe(test: Any) -> str:
    """``data.test`` as plan and validate print it."""
    return f"query {test['query']} vs gallery {test['gallery']}" if is_query_gallery(test) else str(test)


def per_sample(data: Any, key: str) -> torch.Tensor | None:
    """A per-sample fact of a `LabeledData` (``per_sample[key]``, one value a sample), or None."""
    values = data.per_sample.get(key)
    return None if values is None else torch.as_tensor(values)


@dataclass(frozen=True)
class QueryGallery:
    """The test data of a query/gallery protocol: two `LabeledData` and the ids that pair their samples."""

    query: Any
    gallery: Any
    query_ids: torch.Tensor | None = None
    gallery_ids: torch.Tensor | None = None

    @classmethod
    def of(cls, query: Any, gallery: Any, same_set: bool, by_name: bool = False) -> QueryGallery:
        """Query and gallery; ``same_set`` when both sides are one dataset, whose samples then pair by position;
        ``by_name`` when classes are known by name only (two folders), see `align_by_name`."""
        if same_set:
            ids = torch.arange(len(query))
            return cls(query, gallery, ids, ids)
        return cls(query, align_by_name(query, gallery) if by_name else gallery)

    @property
    def classes(self) -> tuple[int, ...]:
        """The test classes: the query's."""
        return self.query.classes

    @property
    def meta(self) -> dict[str, Any]:
        """The query's per-class facts (class names), what a class selection reads."""
        return self.query.meta

    def __len__(self) -> int:
        """The gallery's size: what a query ranks (Recall@k's k must stay below it)."""
        return len(self.gallery)

    def cameras(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample cameras of query and gallery, which the re-ID rules need; a side without them is an error."""
        out = []
        for side, data in (("query", self.query), ("gallery", self.gallery)):
            values = per_sample(data, CAMERA)
            if values is None:
                raise BenchError(
                    f"{data.name}: the {side} data has no per-sample camera: reid_map and cmc_at_k "
                    "need one (an npz gives it as an array named camera)"
                )
            out.append(values)
        return out[0], out[1]

    def matched_queries(self) -> int:
        """Queries whose class has at least one gallery sample (other than themselves)."""
        in_gallery = torch.isin(self.query.y, self.gallery.y)
        if self.query_ids is not None:  # one set: a class needs a second sample
            _, inverse, counts = torch.unique(self.query.y, return_inverse=True, return_counts=True)
            in_gallery &= counts[inverse] > 1
        return int(in_gallery.sum())


def align_by_name(query: Any, gallery: Any) -> Any:
    """The gallery with the query's class ids for the classes the two share by name, new ids for the others.

    Two image folders each number their classes 0.. in their own sorted
    order, so class ``b`` may be 1 in the query folder and 2 in the gallery
    folder: only the sub-folder names say which classes match.
    """
    q_names, g_names = query.meta.get("class_names", {}), gallery.meta.get("class_names", {})
    ids = {name: c for c, name in q_names.items()}
    fresh = max(query.classes) + 1
    mapping: dict[int, int] = {}
    for c in sorted(g_names):
        if g_names[c] not in ids:
            ids[g_names[c]] = fresh
            fresh += 1
        mapping[c] = ids[g_names[c]]
    lookup = torch.tensor([mapping.get(c, -1) for c in range(max(g_names) + 1)], dtype=torch.int64)
    meta = {**gallery.meta, "class_names": {mapping[c]: n for c, n in g_names.items()}}
    return LabeledData(gallery.x, lookup[gallery.y], gallery.name, meta)


def one_set(test: Any) -> Any:
    """The single `LabeledData` standing for the test side in pair-distance artifacts: the gallery, if two."""
    return test.gallery if isinstance(test, QueryGallery) else test
