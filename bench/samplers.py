"""PK batches (Hermans et al. 2017): P classes times K samples each, B = P*K.

Determinism is by step, not by state: `PKSampler.batch(step)` draws from a
generator seeded with (seed, step) alone, so batch 1000 is the same whether
the run got there in one go or resumed from a checkpoint at step 600
(``sampler.iterate(start=600)``). Nothing needs saving beyond the step the
training loop already records, and no batch depends on the batches before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from bench.errors import BenchError


class PKSampler:
    """Infinite, seeded PK batches of sample indices (LongTensor of P*K).

    Per batch: P distinct classes, uniformly; from each, K distinct samples,
    or K drawn with replacement where the class has fewer than K (PML's
    ``MPerClassSampler`` does the same). Indices within a batch are grouped
    by class, K consecutive entries per class.
    """

    def __init__(self, labels: torch.Tensor | np.ndarray | Sequence[int], P: int, K: int, seed: int = 0):
        self.P = _positive("P", P)
        self.K = _positive("K", K)
        self.seed = int(seed)
        y = torch.as_tensor(np.asarray(labels)).reshape(-1)
        if y.dtype.is_floating_point or y.dtype == torch.bool:
            raise BenchError(f"PK sampler labels must be integer class ids, got {y.dtype}")
        classes, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
        if len(classes) < 2:
            raise BenchError(f"PK sampler needs at least 2 classes, the labels have {len(classes)}")
        if len(classes) < self.P:
            raise BenchError(
                f"PK sampler with P={self.P} needs at least {self.P} classes, the labels have {len(classes)}"
            )
        order = torch.argsort(inverse, stable=True)
        self.classes = classes
        self._members = list(torch.split(order, counts.tolist()))  # sample indices of each class

    @property
    def batch_size(self) -> int:
        return self.P * self.K

    def batch(self, step: int) -> torch.Tensor:
        """The batch of training step `step`: a pure function of (labels, P, K, seed, step)."""
        g = torch.Generator().manual_seed(_mix(self.seed, int(step)))
        chosen = torch.randperm(len(self._members), generator=g)[: self.P]
        parts = []
        for c in chosen.tolist():
            members = self._members[c]
            n = len(members)
            if n >= self.K:
                pick = torch.randperm(n, generator=g)[: self.K]
            else:
                pick = torch.randint(n, (self.K,), generator=g)
            parts.append(members[pick])
        return torch.cat(parts)

    def iterate(self, start: int = 0) -> Iterator[torch.Tensor]:
        """Batches start, start+1, ... forever: resume a run by passing its next step."""
        step = int(start)
        while True:
            yield self.batch(step)
            step += 1

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self.iterate(0)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BenchError(f"PK sampler {name} must be a positive integer, got {value!r}")
    return int(value)


def _mix(seed: int, step: int) -> int:
    """A 63-bit generator seed from (seed, step); hashing keeps nearby seeds' streams unrelated."""
    digest = hashlib.sha256(f"pk:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
