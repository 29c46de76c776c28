"""Chen et al.'s learned metric ``g`` (Beyond triplet loss, CVPR 2017), and ranking by it.

A pair of embeddings is fed to a small MLP (``layers`` fully connected
layers of ``hidden`` ReLU units; 3 x 10 is Craeymeersch's Omniglot
re-implementation's choice, not the paper's), then a 2-way softmax; the
"dissimilar" probability is ``g``, in ``[0, 1]``. The quadruplet loss puts
``g^2`` in its terms, as the paper writes them (`bench.losses.quadruplet`).

What the network sees of a pair (``pair_input``):

* ``concat`` (the paper's): ``[a; b]``. The order makes the network
  asymmetric, so dmlbench symmetrises: ``g(a, b) = (h([a; b]) + h([b; a])) / 2``.
  Its first layer is linear in the concatenation, ``W [a; b] = W_1 a + W_2 b``,
  computed once per sample and broadcast: only the ``hidden``-wide layers run
  on the pairs. It does not train on Omniglot (docs/METHODS.md, *Learned
  metric*): a fresh network gives nearly the same ``g`` to every pair, and
  the gradient reaching the trunk is small and unrelated to the classes.
* ``difference_product`` (a documented departure): ``[|a - b|; a * b]``,
  symmetric by construction, the pair features of Koch et al.'s Siamese
  network (``sigma(sum_j alpha_j |h1_j - h2_j|)``), not Chen's. A fresh network
  already orders pairs by a weighted distance, and it trains. The product
  part of the first layer is a bilinear form per hidden unit
  (``a^T diag(W_2[h]) b``), one matrix product; the ``|a - b|`` part needs
  the (pairs, D) differences.

``g(a, a)`` is not forced to 0 (the losses never pair a sample with itself;
ranking removes the query itself). The input width comes from the first
batch (a lazy layer) or from `LearnedMetric.materialize`, which the trainer
calls right after building the loss so that the initial metric is a
function of the seed (the floor rebuilds it). Parameters are materialised
in place, so an optimiser built before still trains them.

`PairScorer` is the trained metric as evaluation uses it: ``g`` between a
block of query rows and every reference, in chunks whose working set is
bounded (`PairScorer.cost`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.errors import BenchError
from bench.losses import pair_kernel

PAIR_INPUTS = ("concat", "difference_product")


class LearnedMetric(nn.Module):
    """'Dissimilar' probability of a pair, in [0, 1], symmetric in the pair."""

    def __init__(self, hidden: int = 10, layers: int = 3, pair_input: str = "concat") -> None:
        super().__init__()
        if pair_input not in PAIR_INPUTS:
            raise BenchError(f"pair_input must be one of {', '.join(PAIR_INPUTS)}, got {pair_input!r}")
        self.pair_input = pair_input
        self.hidden = hidden
        self.first = nn.LazyLinear(hidden)
        rest: list[nn.Module] = [nn.ReLU()]
        for _ in range(layers - 1):
            rest += [nn.Linear(hidden, hidden), nn.ReLU()]
        rest.append(nn.Linear(hidden, 2))
        self.rest = nn.Sequential(*rest)

    def materialize(self, dim: int, like: torch.Tensor | None = None) -> None:
        """Create the first layer's weights for embeddings of width ``dim`` (no-op when they exist), in the
        dtype of ``like`` (default: the module's)."""
        if nn.parameter.is_lazy(self.first.weight):
            w = self.first.weight
            self.first(torch.zeros(1, 2 * dim, device=w.device, dtype=w.dtype if like is None else like.dtype))

    def _dissimilar(self, hidden_in: torch.Tensor) -> torch.Tensor:
        # softmax([z0, z1])[1] == sigmoid(z1 - z0), without forming the softmax
        z = self.rest(hidden_in)
        return torch.sigmoid(z[..., 1] - z[..., 0])

    def features(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The network's input for the pairs ``(x_i, y_i)`` row by row: ``[x; y]`` or ``[|x-y|; x*y]``."""
        if self.pair_input == "concat":
            return torch.cat([x, y], dim=1)
        return torch.cat([(x - y).abs(), x * y], dim=1)

    def one_way(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """The network's output for every pair ``(x_a, y_b)``, (len(x), len(y)); for ``concat`` the
        unsymmetrised ``h([x_a; y_b])``."""
        y = x if y is None else y
        self.materialize(x.shape[1], x)
        d = x.shape[1]
        w, b = self.first.weight, self.first.bias
        if self.pair_input == "concat":
            pre = (x @ w[:, :d].T + b)[:, None, :] + (y @ w[:, d:].T)[None, :, :]
        else:
            n, m = len(x), len(y)
            diff = x[:, None, :] - y[None, :, :]  # (n, m, D): the one pair-sized input
            diff = diff.abs() if torch.is_grad_enabled() else diff.abs_()
            diff = (diff.view(n * m, d) @ w[:, :d].T).view(n, m, -1)  # (n, m, hidden)
            product = torch.matmul(x[:, None, :] * w[None, :, d:], y.T)  # (n, hidden, m): x^T diag(w2_h) y
            pre = diff + product.transpose(1, 2) + b
        return self._dissimilar(pre)

    def scores(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``g(x_a, y_b)`` for every a, b: (len(x), len(y)), symmetric in the pair."""
        h = self.one_way(x, y)
        if self.pair_input == "concat":
            h = (h + self.one_way(y, x).T) / 2
        return h

    def matrix(self, x: torch.Tensor) -> torch.Tensor:
        """(B, B) exactly symmetric ``g`` between all rows of ``x`` (for ``difference_product`` the average
        with the transpose only removes rounding: its input is symmetric in the pair)."""
        h = self.one_way(x)
        return (h + h.T) / 2

    def paired(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``g(x_i, y_i)`` row by row, through the plain network input (the loop form)."""
        self.materialize(x.shape[1], x)
        forward = self._dissimilar(self.first(self.features(x, y)))
        if self.pair_input != "concat":
            return forward
        backward = self._dissimilar(self.first(self.features(y, x)))
        return (forward + backward) / 2

    def pair_cost(self, dim: int) -> int:
        """Float values held per scored pair at the peak of `scores` or `tile` without gradient (an upper
        bound): for ``concat`` two directions of about two ``hidden``-wide layers each; for
        ``difference_product`` the (pairs, ``dim``) differences and about three ``hidden``-wide layers."""
        if self.pair_input == "concat":
            return 4 * self.hidden + 4
        return dim + 3 * self.hidden + 4

    def tile(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """`scores` of a tile of pairs without gradient, computed hidden unit first: every layer is a
        (hidden x hidden) @ (hidden x pairs) product, which runs several times faster on the CPU than
        the (pairs x hidden) layout of `scores`. Equal to `scores` up to rounding."""
        self.materialize(x.shape[1], x)
        d, n, m = x.shape[1], len(x), len(y)
        w, b = self.first.weight, self.first.bias
        if self.pair_input == "concat":
            # h([x_a; y_b]) and h([y_b; x_a]): each first layer is one sample's part plus the other's
            fwd = (w[:, :d] @ x.T + b[:, None])[:, :, None] + (w[:, d:] @ y.T)[:, None, :]
            bwd = (w[:, d:] @ x.T)[:, :, None] + (w[:, :d] @ y.T + b[:, None])[:, None, :]
            return (self._head(fwd.view(-1, n * m)) + self._head(bwd.view(-1, n * m))).view(n, m) / 2
        diff = (x.T[:, :, None] - y.T[:, None, :]).abs_().view(d, n * m)  # (D, pairs)
        pre = (w[:, :d] @ diff).view(-1, n, m)
        pre += torch.matmul(x[None] * w[:, None, d:], y.T)  # (hidden, n, m): x^T diag(w2_h) y
        pre += b[:, None, None]
        return self._head(pre.view(-1, n * m)).view(n, m)

    def _head(self, pre: torch.Tensor) -> torch.Tensor:
        """``g`` of (hidden, pairs) first-layer outputs, in place; the last layer reduced to the logit
        difference (softmax([z0, z1])[1] == sigmoid(z1 - z0))."""
        *inner, last = self.rest
        assert isinstance(last, nn.Linear)
        h = pre
        for layer in inner:
            h = torch.addmm(layer.bias[:, None], layer.weight, h) if isinstance(layer, nn.Linear) else h.relu_()
        return torch.sigmoid((last.weight[1] - last.weight[0]) @ h + (last.bias[1] - last.bias[0]))


# On the CPU, `PairScorer` scores tiles of at most `CPU_TILE_COLUMNS` references by as many query rows as
# make about `CPU_TILE_PAIRS` pairs, so that a tile's (hidden, pairs) layers stay in cache. At 64-d on one
# thread (13,180 references) this took g from 526 to about 170 ns a pair (difference_product) and from 428
# to about 95 (concat), against `scores` over pieces of a few whole query rows.
CPU_TILE_PAIRS = 16384
CPU_TILE_COLUMNS = 512


class PairScorer:
    """A trained `LearnedMetric` as ranking uses it: ``g`` of query rows against references, no gradient.

    Embeddings are given raw (the trunk's outputs) and L2-normalised here
    when the loss trained on normalised ones (``normalize``), as the loss
    does before the metric. Blocks are computed on the metric's device, in its dtype (`LearnedMetric.tile`),
    and returned as float32 on the CPU; on the CPU by the compiled kernel (`bench.losses.pair_kernel`), else in
    tiles of about `CPU_TILE_PAIRS` pairs.
    """

    # g(a, b) == g(b, a) for both pair inputs (concat is symmetrised, difference_product's input is
    # symmetric), up to rounding: ranking a set against itself scores one triangle (`bench.metrics.query_gallery`)
    symmetric = True

    def __init__(self, metric: LearnedMetric, normalize: bool) -> None:
        self.metric, self.normalize = metric, normalize

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The metric's input geometry of raw embeddings."""
        return F.normalize(x, p=2, dim=1) if self.normalize else x

    def __call__(self, query: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """(len(query), len(reference)) ``g``; both are already in the metric's geometry (`prepare`)."""
        p = next(self.metric.parameters())
        q, r = query.to(p.device, p.dtype), reference.to(p.device, p.dtype)
        with torch.no_grad():
            if p.device.type != "cpu":
                return self.metric.tile(q, r).float().cpu()
            fused = pair_kernel.scores(self.metric, q, r)  # None where the compiled kernel does not apply
            if fused is not None:
                return fused
            cols = max(1, min(len(r), CPU_TILE_COLUMNS))
            rows = max(1, CPU_TILE_PAIRS // cols)
            out = torch.empty(len(q), len(r), dtype=p.dtype)
            for i in range(0, len(q), rows):
                for j in range(0, len(r), cols):
                    out[i : i + rows, j : j + cols] = self.metric.tile(q[i : i + rows], r[j : j + cols])
            return out.float()

    def cost(self, dim: int) -> int:
        """Float values of working memory per scored pair: the compiled kernel's (`pair_kernel.pair_cost`),
        else the torch layout's (`LearnedMetric.pair_cost`). A smaller cost lets ranking take more query rows
        a chunk: fewer calls, and fewer pieces of the triangle kept (`bench.metrics.query_gallery`)."""
        if pair_kernel.applies(self.metric):
            return pair_kernel.pair_cost(self.metric)
        return self.metric.pair_cost(dim)

    def paired(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``g(x_i, y_i)`` row by row (prepared inputs), float32 on the CPU: the saved pair distances."""
        p = next(self.metric.parameters())
        with torch.no_grad():
            return self.metric.paired(x.to(p.device, p.dtype), y.to(p.device, p.dtype)).float().cpu()
