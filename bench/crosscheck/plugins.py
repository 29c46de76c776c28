"""Cross-check of plugin entries against the reference they declare (`register(..., reference=...)`).

The reference is a registry name (``pml:TripletMarginLoss``, any entry) or a
callable returning the reference module. Both sides are built with the
plugin's default parameters (those the reference accepts), then compared on
random float64 P x K batches and batches of random labels: a loss by value
and gradient, a miner by the set of tuples it returns.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Iterable
from typing import Any

import torch

from bench import registry
from bench.crosscheck.base import CheckResult, rel_diff

_CONTEXT = {"num_classes": 8, "embedding_size": 16}


def _build(entry: Any) -> tuple[Any, Any, str]:
    """The plugin and its reference, each with the plugin's defaults; and the reference in words."""

    def call(name: str, params: dict[str, Any]) -> str:
        return f"{name}({', '.join(f'{k}={v!r}' for k, v in params.items())})"

    defaults = {n: d for n, d in entry.parameters().items() if d is not inspect.Parameter.empty}
    needs = {n: _CONTEXT[n] for n in entry.needs}
    own = entry.resolve()(**defaults, **needs)
    ref = entry.reference
    if isinstance(ref, str):
        ref_entry = registry.get(entry.kind, ref)
        accepted = ref_entry.parameters()
        params = {k: v for k, v in defaults.items() if k in accepted}
        other = registry.build(entry.kind, ref, params, _CONTEXT)
        return own, other, call(ref, params)
    params = {k: v for k, v in defaults.items() if k in inspect.signature(ref).parameters}
    return own, ref(**params, **needs), call(getattr(ref, "__qualname__", repr(ref)), params)


def _case(rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    if rng.random() < 0.5:
        p, k = rng.randint(2, 8), rng.randint(2, 4)
        labels = torch.arange(p).repeat_interleave(k)[torch.randperm(p * k, generator=g)]
    else:
        b = rng.randint(2, 32)
        labels = torch.randint(0, rng.randint(1, 8), (b,), generator=g)
    return torch.randn(len(labels), 16, generator=g, dtype=torch.float64), labels


def _key(t: tuple[torch.Tensor, ...], size: int) -> torch.Tensor:
    key = torch.zeros(len(t[0]), dtype=torch.long)
    for part in t:
        key = key * size + part.long()
    return key.sort().values


def _value_and_grad(loss: Any, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    value = loss(x, labels)
    grad = torch.autograd.grad(value, x, allow_unused=True)[0] if value.requires_grad else None
    return value.detach(), torch.zeros_like(x) if grad is None else grad


def check(entry: Any, cases: int, seed: int) -> CheckResult:
    """One plugin entry against its reference over ``cases`` random batches."""
    own, ref, settings = _build(entry)
    rng = random.Random(seed)
    worst_v = worst_g = 0.0
    differ = 0
    for _ in range(cases):
        x, labels = _case(rng)
        if entry.kind == "miner":
            a, b = own(x, labels), ref(x, labels)
            if len(a) != len(b) or not torch.equal(_key(tuple(a), len(labels)), _key(tuple(b), len(labels))):
                differ += 1
            continue
        (v1, g1), (v2, g2) = _value_and_grad(own, x, labels), _value_and_grad(ref, x, labels)
        worst_v, worst_g = max(worst_v, rel_diff(v1, v2)), max(worst_g, rel_diff(g1, g2))
    note = f"tuple sets differ in {differ} case(s)" if differ else ""
    return CheckResult(
        f"{entry.kind} {entry.name} (plugin)", settings, cases, float("inf") if differ else worst_v, worst_g, note
    )


def checks(cases: int = 50, seed: int = 0) -> Iterable[CheckResult]:
    """One result per entry that declares a reference (installed plugins are imported for this)."""
    for entry in registry.entries():
        if entry.reference is not None:
            yield check(entry, cases, seed)
