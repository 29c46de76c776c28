"""What a cell's loss and miner cost a training step, beside the trunk: timed, not assumed.

`plan` sizes a sweep from the trunk's step time, the same for every cell.
That holds while the loss and miner cost little next to the trunk, which
is true of most of them and false of a few (MargOHNM listing every
violating quadruplet costs several Conv-4 steps at 32 x 4), which a plan
sized on the trunk alone would miss by a factor.
`plan --time-methods` therefore builds each cell's loss and miner as
training does (the miner bound to the loss, the registry defaults plus the
cell's fixed parameters) and times mining, loss and backward on batches of
the protocol's shape: P x K labels, ``embedding_dim`` columns, on the unit
sphere when the protocol normalises. The batches are random, the state
early in training where the most tuples violate, so the figure is an upper
bound for methods whose work shrinks as training sorts the classes.

Dataset-level miners are not timed here: their cost is embedding the
training set, which `plan` already counts (`Entry.embeds_per_step`).

The same build serves the pre-flight's `check_cell` (bench.sweep.preflight):
one step of every cell's methods on the CPU, so a loss or miner that raises
is refused by `validate` and `run` before a trial is spent on it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.cell import build_methods, method_call, planned_classes
from bench.errors import BenchError
from bench.plan.cost import dataset_size
from bench.plan.types import Cell
from bench.protocol import Protocol
from bench.training import loss_value


def _built(
    protocol: Protocol, cell: Cell, device: torch.device
) -> tuple[Any, Any, torch.Tensor, Callable[[], torch.Tensor]]:
    """The cell's loss and miner as training builds them (the miner bound to the loss, `method_call` naming a
    ``bind_loss`` that raises), the labels of a P x K batch and a maker of random embeddings of its shape (on the
    unit sphere when the protocol normalises, requiring grad). Call it under `_rng_kept`."""
    spec = protocol.spec
    p, k, dim = spec.training.P, spec.training.K, spec.model.embedding_dim
    labels = torch.arange(p, device=device).repeat_interleave(k)
    classes, _ = dataset_size(spec.data.train, spec.data.train_classes)  # proxies: one per training class
    torch.manual_seed(0)
    loss_fn, miner = build_methods(
        cell.loss,
        cell.loss_params,
        cell.miner,
        cell.miner_params,
        num_classes=planned_classes(p, classes),
        embedding_dim=dim,
        device=device,
    )

    def batch() -> torch.Tensor:
        x = torch.randn(len(labels), dim, device=device)
        if spec.model.normalize:
            x = torch.nn.functional.normalize(x, dim=1)
        return x.requires_grad_(True)

    return loss_fn, miner, labels, batch


def _rng_kept(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Every RNG left as it was (building a proxy loss and drawing batches take random numbers)."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


def check_cell(protocol: Protocol, cell: Cell) -> str | None:
    """What is wrong with running ``cell``'s loss and miner, or None: one step (mining, loss, backward) on a random
    batch of the protocol's shape, on the CPU, so a method that raises is found before a trial is spent on it.

    A dataset-level miner (registry scope ``dataset``) picks its batches by embedding the training set, which needs
    the data and a trunk: it is built and bound to the loss, not called, and the loss runs on the batch without it
    (``indices_tuple`` None). The message names the method and its exception (`bench.errors.MethodError`); an
    exception out of the harness itself (a BenchError aside) is not caught here."""
    device = torch.device("cpu")
    try:
        with _rng_kept(device):
            loss_fn, miner, labels, batch = _built(protocol, cell, device)
            x = batch()
            tuples = None
            if miner is not None and not cell.dataset_level:
                tuples = method_call("miner", str(cell.miner), 1, miner, x, labels)
            loss = loss_value(cell.loss, 1, method_call("loss", cell.loss, 1, loss_fn, x, labels, tuples))
            if loss.requires_grad:
                method_call("loss", cell.loss, 1, loss.backward, where="backward")
    except BenchError as e:
        return str(e)
    return None


def time_cell(protocol: Protocol, cell: Cell, repeats: int = 3) -> float | None:
    """Median seconds of one step's mining, loss and backward for ``cell`` (None: dataset-level miner)."""
    if cell.dataset_level:
        return None
    device = torch.device(str(protocol.spec.training.device))
    with _rng_kept(device):
        loss_fn, miner, labels, batch = _built(protocol, cell, device)
        times = []
        for _ in range(repeats + 1):  # the first call warms up allocators and lazy imports
            x = batch()
            _sync(device)
            start = time.perf_counter()
            loss = loss_fn(x, labels, miner(x, labels) if miner is not None else None)
            if loss.requires_grad:
                loss.backward()
            _sync(device)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def time_cells(protocol: Protocol, cells: tuple[Cell, ...], repeats: int = 3) -> dict[str, float]:
    """Seconds a step for every cell that can be timed this way, by cell id, on one CPU thread (what
    `run --threads 1` trains with; on a busy machine two threads can stall many times over)."""
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for cell in cells:
            seconds = time_cell(protocol, cell, repeats)
            if seconds is not None:
                out[cell.id] = seconds
    finally:
        torch.set_num_threads(threads)
    return out


def _sync(device: torch.device) -> None:
    """Wait for queued kernels, so that a time is the work's and not its launch's."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
