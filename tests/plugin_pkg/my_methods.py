"""An example ``--plugin`` file: a loss and a miner of one's own, outside any package.

``dmlbench --plugin tests/plugin_pkg/my_methods.py list`` shows them; every
command that reads a protocol naming them needs the same ``--plugin``.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from bench.registry import register
from bench.tuples import all_pairs, triplets_to_pairs


def _pml_contrastive(pos_margin: float = 0.0, neg_margin: float = 1.0) -> torch.nn.Module:
    """The reference `dmlbench crosscheck` compares ``file_contrastive`` with."""
    from pytorch_metric_learning.losses import ContrastiveLoss

    return ContrastiveLoss(pos_margin=pos_margin, neg_margin=neg_margin)


@register(
    "loss",
    "file_contrastive",
    tuples="pairs",
    reference=_pml_contrastive,
    search_space={"neg_margin": {"type": "float", "low": 0.3, "high": 1.5}},
)
class FileContrastiveLoss(torch.nn.Module):
    """Contrastive loss on normalised embeddings; positive and negative pairs averaged apart (as PML)."""

    def __init__(self, pos_margin: float = 0.0, neg_margin: float = 1.0) -> None:
        super().__init__()
        self.pos_margin, self.neg_margin = float(pos_margin), float(neg_margin)

    def forward(
        self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: tuple[torch.Tensor, ...] | None = None
    ) -> torch.Tensor:
        if indices_tuple is None:
            indices_tuple = all_pairs(labels)
        elif len(indices_tuple) == 3:
            indices_tuple = triplets_to_pairs(tuple(indices_tuple))
        a1, p, a2, n = indices_tuple
        x = F.normalize(embeddings, dim=1)
        d = torch.cdist(x, x)
        terms = [torch.relu(d[a1, p] - self.pos_margin), torch.relu(self.neg_margin - d[a2, n])]
        total = embeddings.sum() * 0.0
        for t in terms:
            if bool((t > 0).any()):
                total = total + t[t > 0].mean()
        return total


@register("miner", "file_hardest", tuples="triplets", reference="pml:BatchHardMiner")
class FileHardestMiner:
    """Per anchor its farthest positive and nearest negative (batch hard), on normalised embeddings."""

    def __call__(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            x = F.normalize(embeddings.detach(), dim=1)
            d = torch.cdist(x, x)
            same = labels[:, None] == labels[None, :]
            eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
            has = (same & ~eye).any(1) & (~same).any(1)
            pos = d.masked_fill(~same | eye, -1.0).argmax(1)
            neg = d.masked_fill(same, float("inf")).argmin(1)
            anchors = torch.where(has)[0]
            return anchors, pos[anchors], neg[anchors]


@register("trunk", "file_linear")
class FileLinear(torch.nn.Module):
    """A linear embedding of the flattened input (an example trunk: built with in_shape and embedding_dim)."""

    def __init__(self, in_shape: tuple[int, ...], embedding_dim: int = 64, bias: bool = True) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(int(torch.tensor(in_shape).prod()), embedding_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))
