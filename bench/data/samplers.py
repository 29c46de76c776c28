"""PK batches (Hermans et al. 2017): P classes times K samples each, B = P*K.

Determinism is by step, not by state: `PKSampler.batch(step)` is a pure
function of (labels, P, K, seed, step), so batch 1000 is the same whether
the run got there in one go or resumed from a checkpoint at step 600
(``sampler.iterate(start=600)``). Nothing needs saving beyond the step the
training loop already records, and no batch depends on the batches before.

Batches are drawn ``CHUNK`` steps at a time, vectorised, from a generator
seeded with (seed, chunk) alone: a per-step generator and a Python loop over
the P classes cost more than a small trunk's step (the harness overhead goal
is 1.05x a bare loop). The chunk is an implementation detail of the stream,
not of its contract: any step can still be asked for on its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.utils.data

from bench.errors import BenchError

CHUNK = 64  # steps drawn per generator; changing it changes which batches a seed gives


class PKSampler:
    """Infinite, seeded PK batches of sample indices (LongTensor of P*K).

    Per batch: P distinct classes, uniformly; from each, K distinct samples
    (a uniform K-subset), or K drawn with replacement where the class has
    fewer than K (PML's ``MPerClassSampler`` does the same). Indices within a
    batch are grouped by class, K consecutive entries per class.
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
        self.classes = classes
        self._counts = counts
        self._table = _members_table(inverse, counts)  # row c: the sample indices of class c, padded
        self._cached: tuple[int, torch.Tensor] | None = None

    @property
    def batch_size(self) -> int:
        return self.P * self.K

    def batch(self, step: int) -> torch.Tensor:
        """The batch of training step `step`: a pure function of (labels, P, K, seed, step)."""
        chunk, row = divmod(int(step), CHUNK)
        if self._cached is None or self._cached[0] != chunk:
            self._cached = (chunk, self._draw_chunk(chunk))
        return self._cached[1][row]

    def iterate(self, start: int = 0) -> Iterator[torch.Tensor]:
        """Batches start, start+1, ... forever: resume a run by passing its next step."""
        step = int(start)
        while True:
            yield self.batch(step)
            step += 1

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self.iterate(0)

    def iterate_on(self, device: torch.device, start: int = 0) -> Iterator[torch.Tensor]:
        """The batches of `iterate`, already on ``device``: each chunk of CHUNK batches is drawn here and
        copied once (pinned and without blocking on CUDA), so a training step only takes a row of a
        tensor on the device and the host never waits for the copy. On the CPU the rows are those of
        `batch` (views of the same chunk), so a run's batches are equal bit for bit."""
        chunk, row = divmod(int(start), CHUNK)
        while True:
            drawn = self._draw_chunk(chunk)
            if device.type == "cuda":
                drawn = drawn.pin_memory().to(device, non_blocking=True)
            else:
                drawn = drawn.to(device)
            for r in range(row, CHUNK):
                yield drawn[r]
            chunk, row = chunk + 1, 0

    def _draw_chunk(self, chunk: int) -> torch.Tensor:
        """CHUNK batches at once: (CHUNK, P*K) sample indices."""
        g = torch.Generator().manual_seed(_mix(self.seed, chunk))
        num_classes = len(self._counts)
        # P distinct classes a step: the P smallest of C uniform keys are a uniform P-subset
        chosen = torch.rand(CHUNK, num_classes, generator=g).topk(self.P, dim=1, largest=False).indices.reshape(-1)
        n = self._counts[chosen]
        u = torch.rand(len(chosen), self.K, generator=g, dtype=torch.float64)
        pos = _floyd(u, n.clamp(min=self.K), self.K)
        small = n < self.K
        if bool(small.any()):  # fewer than K members: K draws with replacement (the same u, so no extra stream)
            pos = torch.where(small[:, None], (u * n[:, None]).long().clamp(max=n[:, None] - 1), pos)
        return self._table[chosen[:, None], pos].reshape(CHUNK, self.P * self.K)


class PKBatchSampler(torch.utils.data.Sampler):
    """Steps ``start .. stop-1`` of a `PKSampler` as a DataLoader batch sampler.

    Each item is (step, slot, sample index), so the dataset can seed a
    sample's augmentation from where it sits in the stream rather than from
    which worker decodes it; resuming at step s is ``start=s``.
    """

    def __init__(self, sampler: PKSampler, start: int, stop: int) -> None:
        self.sampler, self.start, self.stop = sampler, int(start), int(stop)

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        for step in range(self.start, self.stop):
            yield [(step, slot, i) for slot, i in enumerate(self.sampler.batch(step).tolist())]


def _members_table(inverse: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(classes, largest class) table of sample indices, class c's members first in row c (padding -1)."""
    order = torch.argsort(inverse, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    column = torch.arange(len(order)) - torch.repeat_interleave(starts, counts)
    table = torch.full((len(counts), int(counts.max())), -1, dtype=torch.long)
    table[inverse[order], column] = order
    return table


def _floyd(u: torch.Tensor, n: torch.Tensor, k: int) -> torch.Tensor:
    """A uniform k-subset of range(n[r]) for every row r (Floyd's algorithm), from uniforms u of shape (rows, k).

    O(k^2) a row whatever the class size, where sorting random keys would be
    O(n): step i draws t in [0, j] with j = n - k + i and keeps t, or j when t
    was already taken; every k-subset comes out with the same probability.
    """
    picked = torch.empty(u.shape, dtype=torch.long)
    for i in range(k):
        j = n - k + i
        t = torch.minimum((u[:, i] * (j + 1)).long(), j)
        taken = (picked[:, :i] == t[:, None]).any(dim=1)
        picked[:, i] = torch.where(taken, j, t)
    return picked


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BenchError(f"PK sampler {name} must be a positive integer, got {value!r}")
    return int(value)


def _mix(seed: int, chunk: int) -> int:
    """A 63-bit generator seed from (seed, chunk); hashing keeps nearby seeds' streams unrelated."""
    digest = hashlib.sha256(f"pk:{seed}:{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
