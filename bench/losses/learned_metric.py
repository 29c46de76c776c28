"""Chen et al.'s learned metric ``g`` (Beyond triplet loss, CVPR 2017).

The two embeddings of a pair are concatenated and fed to a small MLP
(``layers`` fully connected layers of ``hidden`` ReLU units, the paper's
experiment: 3 x 10), then a 2-way softmax; the "dissimilar" probability is
the distance, so ``g`` lies in ``[0, 1]`` and margins such as 1 and 0.5 keep
their meaning.

Concatenation order makes the network asymmetric. dmlbench symmetrises:
``g(a, b) = (h([a; b]) + h([b; a])) / 2``, so the matrix is exactly
symmetric and a quadruplet's value does not depend on which end of a pair is
listed first. ``g(a, a)`` is not forced to 0: the diagonal is never used by
the losses (no tuple pairs a sample with itself).

Cost of a (B, B) matrix: the first layer is linear in the concatenation,
``W [a; b] = W_1 a + W_2 b``, so it is computed once per sample and
broadcast; only the ``hidden``-wide layers run on the B^2 pairs
(B^2 * hidden values per layer: 164k for B = 128). The input width is taken
from the first batch (a lazy layer), so the metric needs no embedding size
at build time; its parameters are materialised in place, so an optimiser
built before the first call still trains them.
"""

from __future__ import annotations

import torch
from torch import nn


class LearnedMetric(nn.Module):
    """Symmetrised 'dissimilar' probability of a pair, in [0, 1]."""

    def __init__(self, hidden: int = 10, layers: int = 3) -> None:
        super().__init__()
        self.first = nn.LazyLinear(hidden)
        rest: list[nn.Module] = [nn.ReLU()]
        for _ in range(layers - 1):
            rest += [nn.Linear(hidden, hidden), nn.ReLU()]
        rest.append(nn.Linear(hidden, 2))
        self.rest = nn.Sequential(*rest)

    def _materialize(self, x: torch.Tensor) -> None:
        if nn.parameter.is_lazy(self.first.weight):
            self.first(torch.cat([x[:1], x[:1]], dim=1))

    def _dissimilar(self, hidden_in: torch.Tensor) -> torch.Tensor:
        # softmax([z0, z1])[1] == sigmoid(z1 - z0), without forming the softmax
        z = self.rest(hidden_in)
        return torch.sigmoid(z[..., 1] - z[..., 0])

    def one_way(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """``h([x_a; y_b])`` for every a, b: the unsymmetrised network output, (len(x), len(y))."""
        y = x if y is None else y
        self._materialize(x)
        d = x.shape[1]
        w, b = self.first.weight, self.first.bias
        left = x @ w[:, :d].T + b
        right = y @ w[:, d:].T
        return self._dissimilar(left[:, None, :] + right[None, :, :])

    def matrix(self, x: torch.Tensor) -> torch.Tensor:
        """(B, B) symmetric ``g`` between all rows of ``x``."""
        h = self.one_way(x)
        return (h + h.T) / 2

    def paired(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``g(x_i, y_i)`` row by row, through the plain concatenation (the paper's form)."""
        self._materialize(x)
        forward = self._dissimilar(self.first(torch.cat([x, y], dim=1)))
        backward = self._dissimilar(self.first(torch.cat([y, x], dim=1)))
        return (forward + backward) / 2
