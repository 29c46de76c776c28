"""Miners a fair leaderboard carries without an own implementation: PML's, behind our call convention."""

from __future__ import annotations

from typing import Any

import torch

from bench.errors import BenchError
from bench.losses.pml_backed import adapter_class, lazy_adapters, pml_class_of
from bench.miners._common import BenchMiner, check_number


class MultiSimilarityMiner(BenchMiner):
    """Wang et al. 2019's pair mining, as PML's ``MultiSimilarityMiner(epsilon)`` (its default distance).

    Returns pairs ``(a1, p, a2, n)``: positives less similar than the
    anchor's most similar negative plus ``epsilon``, negatives more similar
    than its least similar positive minus ``epsilon``.
    """

    def __init__(self, epsilon: float = 0.1) -> None:
        from pytorch_metric_learning.miners import MultiSimilarityMiner as PML

        super().__init__()
        self.epsilon = check_number("epsilon", epsilon, low=0)
        self._pml = PML(epsilon=self.epsilon)

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """PML's pairs as they come, counted in ``stats``."""
        a1, p, a2, n = self._pml(embeddings, labels)
        self.stats.update(
            num_pos_pairs=float(len(a1)), num_neg_pairs=float(len(a2)), num_tuples=float(len(a1) + len(a2))
        )
        return a1, p, a2, n


# ---- any other PML miner, by class name (`pml:TripletMarginMiner`) ----------------------------------

# What each PML miner returns (PML's miners do not declare it): triplets (a, p, n) or pairs (a1, p, a2, n)
_TUPLES = {
    "TripletMarginMiner": "triplets",
    "BatchHardMiner": "triplets",
    "AngularMiner": "triplets",
    "PairMarginMiner": "pairs",
    "MultiSimilarityMiner": "pairs",
    "UniformHistogramMiner": "pairs",
    "BatchEasyHardMiner": "pairs",
    "HDCMiner": "pairs",
}


class _GenericPMLMiner(BenchMiner):
    """Holds a PML miner and returns its index tuple; PML measures with its own (default) distance."""

    tuples = ""

    def __init__(self, pml_miner: Any) -> None:
        super().__init__()
        self._pml = pml_miner

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._pml(embeddings, labels))


def adapter(name: str) -> type:
    """A miner class building PML's miner ``name`` from the registry's parameters (cached)."""
    from pytorch_metric_learning import miners

    if f"PML_{name}" in globals():
        return globals()[f"PML_{name}"]
    pml_class = pml_class_of(miners, miners.BaseMiner, "miner", name)
    if name not in _TUPLES:
        raise BenchError(
            f"pml:{name}: cannot tell which tuples it produces (known: {', '.join(sorted(_TUPLES))}); "
            "register an adapter of your own with bench.registry.register('miner', ..., tuples=...)"
        )
    return adapter_class(
        globals(),
        name,
        _GenericPMLMiner,
        pml_class,
        _TUPLES[name],
        lambda self, pml, params: _GenericPMLMiner.__init__(self, pml),
    )


__getattr__ = lazy_adapters(adapter, __name__)
