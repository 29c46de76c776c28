"""Entries made on their first lookup: any PML loss or miner as ``pml:<Class>`` behind the generic adapter,
and any timm model as ``timm:<model>``."""

from __future__ import annotations

import copy
import importlib
import inspect
from typing import Any

from bench.registry._builtin import BY_KEY
from bench.registry._entry import Entry
from bench.registry._entry import float_space as _f
from bench.registry._entry import int_space as _i

# The Reality Check's search space of each PML class it tuned (Musgrave, Belongie, Lim, ECCV 2020): the ranges
# of protocols/reality-check-*.yaml, which hold every optimum the paper published (docs/papers/mlrc.md) and its
# known bounds, less what the generic adapter cannot take (a loss's own learning rate, a regulariser's weight).
# `pml:<Class>` searches these unless its protocol says otherwise (`pml_search_space`).
PML_SEARCH_SPACES: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("loss", "ContrastiveLoss"): {"pos_margin": _f(-0.2, 1.0), "neg_margin": _f(0.0, 2.0)},
    ("loss", "TripletMarginLoss"): {"margin": _f(0.001, 1.0, log=True)},
    ("loss", "NTXentLoss"): {"temperature": _f(1e-4, 1.0, log=True)},
    ("loss", "ProxyNCALoss"): {"softmax_scale": _f(1.0, 100.0, log=True)},
    ("loss", "MarginLoss"): {"margin": _f(-0.5, 1.0), "beta": _f(0.0, 2.0)},
    ("loss", "NormalizedSoftmaxLoss"): {"temperature": _f(0.01, 1.0, log=True)},
    ("loss", "CosFaceLoss"): {"margin": _f(0.0, 1.0), "scale": _f(1.0, 256.0, log=True)},
    ("loss", "ArcFaceLoss"): {"margin": _f(0.0, 90.0), "scale": _f(1.0, 256.0, log=True)},
    ("loss", "FastAPLoss"): {"num_bins": _i(2, 100)},
    ("loss", "SignalToNoiseRatioContrastiveLoss"): {"pos_margin": _f(0.0, 1.0), "neg_margin": _f(0.0, 2.0)},
    ("loss", "MultiSimilarityLoss"): {
        "alpha": _f(0.01, 100.0, log=True),
        "beta": _f(0.01, 100.0, log=True),
        "base": _f(0.0, 1.0),
    },
    ("loss", "SoftTripleLoss"): {"la": _f(1.0, 100.0), "gamma": _f(0.01, 100.0, log=True), "margin": _f(0.0, 1.0)},
    ("miner", "MultiSimilarityMiner"): {"epsilon": _f(0.0, 1.0)},
}
# PML classes the Reality Check did not tune that a built-in entry wraps: `pml:<Class>` searches that entry's space
PML_WRAPPED = {("loss", "CircleLoss"): "pml:circle", ("loss", "SupConLoss"): "pml:supcon"}
PML_WRAPPED[("loss", "ProxyAnchorLoss")] = "pml:proxy_anchor"


def pml_search_space(kind: str, cls_name: str) -> dict[str, dict[str, Any]]:
    """The default search space of ``pml:<cls_name>``: the Reality Check's, a wrapping entry's, or none."""
    if (kind, cls_name) in PML_SEARCH_SPACES:
        return copy.deepcopy(PML_SEARCH_SPACES[(kind, cls_name)])
    wrapper = PML_WRAPPED.get((kind, cls_name))
    return copy.deepcopy(BY_KEY[(kind, wrapper)].search_space) if wrapper else {}


def pml_entry(kind: str, name: str) -> Entry:
    """Any PML loss or miner by its class name, behind the generic adapter (`get` caches it like a
    registered one). Its default search space is `pml_search_space`'s."""
    module = "bench.losses.pml_backed" if kind == "loss" else "bench.miners.pml_backed"
    adapters = importlib.import_module(module)
    cls_name = name[len("pml:") :]
    adapter = adapters.adapter(cls_name)  # a BenchError for an unknown class or one whose tuples are unknown
    needs = tuple(n for n in ("num_classes", "embedding_size") if n in inspect.signature(adapter).parameters)
    return Entry(
        name,
        kind,
        f"{module}:{adapter.__name__}",
        f"PML's {cls_name}, through the generic adapter",
        f"is PML's {cls_name}",
        adapter.tuples,
        pml_search_space(kind, cls_name),
        needs=needs,
        pml_backed=True,
        source="pml",
    )


def timm_entry(name: str) -> Entry:
    """Any timm model as ``timm:<model>``, without its classifier, with an embedding head. Not cached in the
    registered entries (unlike PML's), so `names` lists the built-in trunks only, not every timm name looked up."""
    from bench.models import backbones

    model = name[len("timm:") :]
    backbones.check_timm_name(model)  # a BenchError without timm (how to install it) or for an unknown model
    return Entry(
        name,
        "trunk",
        f"bench.models.backbones:timm_{model}",
        f"timm's {model}, a linear embedding head",
        "",
        "",
        source="timm",
        version=backbones.timm_module().__version__,
    )
