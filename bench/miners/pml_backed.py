"""Miners a fair leaderboard carries without an own implementation: PML's, behind our call convention."""

from __future__ import annotations

import torch

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
        self.stats.update(num_pos_pairs=float(len(a1)), num_neg_pairs=float(len(a2)),
                          num_tuples=float(len(a1) + len(a2)))
        return a1, p, a2, n
