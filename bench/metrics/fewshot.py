"""Few-shot classification metrics: random N-way K-shot episodes and Lake et al.'s 20 runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.errors import BenchError


@dataclass(frozen=True)
class OneShotRun:
    """One of Lake et al.'s 20-way one-shot runs, as the data loader hands it over.

    The run is fixed by its authors (which images are training and which are test),
    so it is carried as images rather than indices into a dataset: a model is scored
    on exactly the published comparisons.

    * ``train_x``: ``(20, ...)`` one training image per class of the run.
    * ``test_x``: ``(20, ...)`` the test images, same trailing shape as ``train_x``.
    * ``answer``: LongTensor ``(len(test_x),)``, for each test image the index into
      ``train_x`` of the image of its class.
    * ``name``: where the run came from (e.g. ``"run01"``), for reports only.
    """

    train_x: torch.Tensor
    test_x: torch.Tensor
    answer: torch.Tensor
    name: str = ""

    def __post_init__(self) -> None:
        label = self.name or "one-shot run"
        if self.train_x.ndim < 1 or self.test_x.ndim < 1:
            raise BenchError(f"{label}: train_x and test_x need a leading sample dimension")
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise BenchError(
                f"{label}: train_x {tuple(self.train_x.shape)} and test_x {tuple(self.test_x.shape)} "
                "differ in their per-image shape"
            )
        if self.answer.ndim != 1 or self.answer.shape[0] != self.test_x.shape[0]:
            raise BenchError(
                f"{label}: answer has shape {tuple(self.answer.shape)}, expected ({self.test_x.shape[0]},)"
            )
        if self.answer.dtype != torch.long:
            raise BenchError(f"{label}: answer must be a LongTensor, got {self.answer.dtype}")
        n_train = self.train_x.shape[0]
        if self.answer.numel() and (int(self.answer.min()) < 0 or int(self.answer.max()) >= n_train):
            raise BenchError(f"{label}: answer indices must lie in 0..{n_train - 1}")
