"""Loop references and batches shared by the loss and miner tests (tests/losses/, tests/miners/)."""

from __future__ import annotations

import torch

from bench.crosscheck import rel_diff
from bench.registry import ENTRIES
from bench.tuples import Quadruplets

OWN = ("contrastive", "lifted_structure", "npair", "infonce")


PML_BACKED = [e.name for e in ENTRIES if e.kind == "loss" and e.pml_backed]


PROXY = {"num_classes": 4, "embedding_size": 6}


def batch(b: int = 10, dim: int = 5, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(b) % classes
    return torch.randn(b, dim, generator=g, dtype=torch.float64), labels[torch.randperm(b, generator=g)]


def quadruplet(labels: torch.Tensor) -> Quadruplets:
    """One quadruplet (i, j, l, k): y_i = y_j, and l, k of two other, different classes."""
    i, j = torch.where(labels == labels[0])[0][:2].tolist()
    others = torch.where(labels != labels[0])[0]
    l = int(others[0])
    k = int(others[labels[others] != labels[l]][0])
    return Quadruplets(*(torch.tensor([v]) for v in (i, j, l, k)))


def value_and_grad(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    v = fn(x)
    v.backward()
    return v.detach(), x.grad


def assert_same(fn_a, fn_b, x: torch.Tensor, tol: float = 1e-12) -> None:
    va, ga = value_and_grad(fn_a, x)
    vb, gb = value_and_grad(fn_b, x)
    assert rel_diff(va, vb) <= tol, (float(va), float(vb))
    assert rel_diff(ga, gb) <= tol
