"""What a cell's loss and miner cost a training step, beside the trunk: timed, not assumed.

`plan` sizes a sweep from the trunk's step time, the same for every cell.
That holds while the loss and miner cost little next to the trunk, which
is true of most of them and false of a few: MargOHNM listing every
violating quadruplet took 0.8 s a step at 32 x 4, six times a Conv-4 step,
and a protocol sized on the trunk alone ran twice as long as planned.
`plan --time-methods` therefore builds each cell's loss and miner as
training does (the miner bound to the loss, the registry defaults plus the
cell's fixed parameters) and times mining, loss and backward on batches of
the protocol's shape: P x K labels, ``embedding_dim`` columns, on the unit
sphere when the protocol normalises. The batches are random, the state
early in training where the most tuples violate, so the figure is an upper
bound for methods whose work shrinks as training sorts the classes.

Dataset-level miners are not timed here: their cost is embedding the
training set, which `plan` already counts (`Entry.embeds_per_step`).
"""

from __future__ import annotations

import statistics
import time

import torch

from bench import registry

from bench.plan.cost import dataset_size
from bench.plan.types import Cell
from bench.protocol import Protocol


def time_cell(protocol: Protocol, cell: Cell, repeats: int = 3) -> float | None:
    """Median seconds of one step's mining, loss and backward for ``cell`` (None: dataset-level miner)."""
    if cell.dataset_level:
        return None
    doc = protocol.doc
    p, k, dim = doc["training"]["P"], doc["training"]["K"], doc["model"]["embedding_dim"]
    device = torch.device(str(doc["training"]["device"]))
    labels = torch.arange(p, device=device).repeat_interleave(k)
    classes, _ = dataset_size(doc["data"]["train"], doc["data"]["train_classes"])  # proxies: one per training class
    context = {"num_classes": max(p, int(classes)), "embedding_size": dim}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # leaves every RNG as it was
        torch.manual_seed(0)
        loss_fn = registry.build_loss(cell.loss, context, **cell.loss_params)
        if isinstance(loss_fn, torch.nn.Module):
            loss_fn = loss_fn.to(device)
        miner = registry.build_miner(cell.miner, context, **cell.miner_params) if cell.miner else None
        if miner is not None and hasattr(miner, "bind_loss"):
            miner.bind_loss(loss_fn)
        times = []
        for _ in range(repeats + 1):  # the first call warms up allocators and lazy imports
            x = torch.randn(len(labels), dim, device=device)
            if doc["model"]["normalize"]:
                x = torch.nn.functional.normalize(x, dim=1)
            x.requires_grad_(True)
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
