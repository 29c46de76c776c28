"""Dead search parameters, and cells that train nothing: refused before a sweep spends its budget on them.

A searched parameter is *dead* when the two ends of its range give the same
gradient on the embeddings up to a positive factor (cosine within
``COSINE_TOL`` of 1, or both zero) on every probe batch, and the same
gradient, likewise, on the loss's own parameters (proxies, class weights, a
learned beta or metric), compared apart: a regulariser acting on a proxy
loss's weights alone is live. A loss's own ``lr`` (``OWN_LR``: the step size
of those parameters, `bench.training`) is no gradient at all: it is live
when the loss has parameters that get a gradient, dead otherwise.
A constant added to the loss changes nothing that training sees, and a
rescaled gradient changes nothing under Adam, so the tuner would spend its
trials on replicates of one configuration and then pick the noisiest one.

The probe is generic: for each searched parameter of each cell it builds
the cell's loss (and miner) from the registry at the low and at the high end
of the range, with the cell's fixed values, and the other searched
parameters at their defaults (their range's middle when the default lies
outside it), then at the low ends, then at the high ends (a margin can be
silenced by a saturating scale at one of them), and differentiates the loss through the miner's tuples on a few seeded
batches shaped like the protocol's (P classes x K samples, on the unit
sphere when the protocol normalises): random ones, and one whose classes
are clustered, as after some training. Everything random (proxies, a
learned metric, a miner's sampling) is seeded identically at both ends.

On the same batches a whole cell is probed (`dead_cells`): its loss at its
fixed values, the searched parameters at their defaults, low ends and high
ends, must give some gradient somewhere, or the network never moves.

Miners with a warm-up (a ``warmup_iterations`` parameter) behave
differently during and after it; both phases are probed, and a parameter
that moves the gradient in either one is live. What the probe cannot see:
a parameter that acts only across steps (a dataset-level miner's
``refresh_every``) is judged on one step, and would be refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from bench import registry
from bench.cell import build_methods, classes_of
from bench.errors import BenchError
from bench.plan import Cell, Plan

# cosine >= 1 - COSINE_TOL: the same direction (an angle under 0.8 degrees). Not 1e-6: lifted structure's
# margin on normalised embeddings turns the gradient by 1e-5 (cosine 0.99999) across [0.1, 2.0], a rescale
# for every practical purpose, while the least live parameter of the shipped protocols (MultiSimilarity's
# epsilon) turns it by 2.4e-3.
COSINE_TOL = 1e-4
ZERO_TOL = 1e-12  # a gradient with a smaller norm carries nothing
MAX_CLASSES = 8  # probe batches hold at most this many classes (see probe_batches)
SEEDS = (0, 1, 2)  # random batches; one clustered batch comes on top
CLUSTER_SPREAD = 0.3  # within-class noise of the clustered batch, relative to unit class centres
WARMUP = "warmup_iterations"
OWN_LR = "loss.lr"  # a loss's own parameters' learning rate (its param_lr)
# one cell's gradients by (loss params, miner params, batch): the probes of a cell share settings
Cache = dict[tuple[str, str, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class DeadParameter:
    """One searched parameter whose range changes nothing training sees."""

    cell: str
    parameter: str  # "loss.<name>" / "miner.<name>", as in the cell's search space
    low: Any
    high: Any
    batches: int  # probe batches on which both ends agreed

    def __str__(self) -> str:
        return f"{self.cell} {self.parameter} [{self.low!r}, {self.high!r}]"


def dead_parameters(plan: Plan, batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> list[DeadParameter]:
    """Every dead (cell, searched parameter) of the plan, in grid and search-space order (on ``batches``,
    default the plan's probe batches)."""
    batches = _batches(plan) if batches is None else batches
    dead: list[DeadParameter] = []
    for cell in plan.cells:
        cache: Cache = {}
        for key, dist in cell.search_space.items():
            ends = _ends(dist)
            if len(ends) < 2:
                continue
            if _is_dead(cell, key, ends, batches, cache):
                dead.append(DeadParameter(cell.id, key, ends[0], ends[-1], len(batches)))
    return dead


def dead_cells(plan: Plan, batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> list[str]:
    """The cells whose loss gives no gradient at all (on the embeddings or its own parameters) on any probe
    batch, in any miner phase, wherever their searched parameters sit (defaults, low ends, high ends): fixed
    values that silence the loss (a contrastive negative margin of 0 with a positive margin beyond every
    distance), so the network never leaves its initialisation and the cell's trials and seeds are the floor
    bought at full price. A cell every probed setting of which the method refuses says nothing: not dead."""
    batches = _batches(plan) if batches is None else batches
    return [cell.id for cell in plan.cells if _gives_gradient(cell, batches) is False]


def _gives_gradient(cell: Cell, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool | None:
    """Whether ``cell``'s loss gives a gradient on some probe batch, phase and setting of its searched
    parameters; None when the method refuses every one (nothing compared)."""
    cache: Cache = {}
    compared = False
    for where in OTHERS if cell.search_space else OTHERS[:1]:
        for b, (x, labels) in enumerate(batches):
            for phase in range(len(_phases(cell, cell.miner_params))):
                try:
                    grads = _cached(cell, _params(cell, "", None, where), phase, b, x, labels, cache)
                except BenchError:
                    continue
                compared = True
                # a non-finite gradient moves the network too (it diverges, which training reports)
                if any(not float(g.norm()) <= ZERO_TOL for g in grads):
                    return True
    return False if compared else None


def check_live(plan: Plan) -> None:
    """Refuse a plan that searches a dead parameter, one line naming each (cell, parameter), or holds a cell
    whose loss gives no gradient at all."""
    batches = _batches(plan)
    dead = dead_parameters(plan, batches)
    if dead:
        raise BenchError(
            f"dead search parameters: {', '.join(map(str, dead))}: both ends of each range give the "
            f"same gradient up to a positive factor on all {len(batches)} probe batches, so tuning "
            "them tunes nothing; fix the method or drop them from search_space"
        )
    silent = dead_cells(plan, batches)
    if silent:
        raise BenchError(
            f"cells that train nothing: {', '.join(silent)}: the loss gives a zero gradient on all "
            f"{len(batches)} probe batches at its fixed values (and at its searched ranges' defaults and "
            "ends), so the network would never leave its initialisation; fix the fixed params"
        )


def _batches(plan: Plan) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The probe batches of a plan's shape (P capped at ``MAX_CLASSES``)."""
    spec = plan.protocol.spec
    return probe_batches(
        min(spec.training.P, MAX_CLASSES), spec.training.K, spec.model.embedding_dim, spec.model.normalize
    )


def probe_batches(P: int, K: int, dim: int, normalize: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Seeded (embeddings, labels) batches: random ones, then one with its classes clustered.

    Whether a parameter moves the gradient is a property of the loss's formula,
    not of the batch size, while quadruplet mining grows as the fourth power of
    the batch: `dead_parameters` caps P at ``MAX_CLASSES`` to stay fast.
    """
    labels = torch.arange(P).repeat_interleave(K)
    out = []
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        out.append(torch.randn(P * K, dim, generator=g, dtype=torch.float64))
    g = torch.Generator().manual_seed(len(SEEDS))
    centres = torch.nn.functional.normalize(torch.randn(P, dim, generator=g, dtype=torch.float64), dim=1)
    noise = torch.randn(P * K, dim, generator=g, dtype=torch.float64) * CLUSTER_SPREAD / math.sqrt(dim)
    out.append(centres[labels] + noise)
    if normalize:
        out = [torch.nn.functional.normalize(x, dim=1) for x in out]
    return [(x.float(), labels) for x in out]


def _ends(dist: dict[str, Any]) -> list[Any]:
    if dist["type"] == "categorical":
        return list(dist["choices"])
    return [dist["low"], dist["high"]]


OTHERS = ("default", "low", "high")  # where the searched parameters not under probe sit, in turn


def _other_value(dist: dict[str, Any], default: Any, where: str) -> Any:
    """A searched parameter not under probe: at an end of its range, or at its default when the sweep can
    draw it (else its range's middle)."""
    if dist["type"] == "categorical":
        choices = dist["choices"]
        if where != "default":
            return choices[0] if where == "low" else choices[-1]
        return default if default in choices else choices[0]
    low, high = dist["low"], dist["high"]
    if where != "default":
        return low if where == "low" else high
    if isinstance(default, (int, float)) and not isinstance(default, bool) and low <= default <= high:
        return default
    middle = math.sqrt(low * high) if dist.get("log") else (low + high) / 2
    return round(middle) if dist["type"] == "int" else middle


def _params(cell: Cell, key: str, value: Any, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Loss and miner parameters with ``key`` at ``value`` and the other searched ones at ``where``."""
    params = {"loss": dict(cell.loss_params), "miner": dict(cell.miner_params)}
    for other, dist in cell.search_space.items():
        kind, name = other.split(".", 1)
        if other == key:
            params[kind][name] = value
        else:
            owner = cell.loss if kind == "loss" else cell.miner
            assert owner is not None, f"{other} is searched in a cell without a miner"  # the plan never builds one
            entry = registry.get(kind, owner)
            params[kind][name] = _other_value(dist, entry.parameters().get(name), where)
    return params["loss"], params["miner"]


def _phases(cell: Cell, miner_params: dict[str, Any]) -> list[dict[str, Any]]:
    """The miner's parameters during its warm-up (as configured) and after it (no warm-up)."""
    if cell.miner is None or WARMUP not in registry.get("miner", cell.miner).parameters():
        return [miner_params]
    return [miner_params, {**miner_params, WARMUP: 0}]


def _is_dead(
    cell: Cell,
    key: str,
    ends: list[Any],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    cache: Cache,
) -> bool:
    """No end moves the gradient's direction away from the first end's, wherever the other searched
    parameters sit, on any batch, in any miner phase. A combination the method refuses (e.g. the
    quadruplet loss's alpha1 <= alpha2) says nothing and is skipped; with no comparison left, not dead."""
    compared = False
    wheres = OTHERS if len(cell.search_space) > 1 else OTHERS[:1]
    for where in wheres:
        for b, (x, labels) in enumerate(batches):
            for phase in range(len(_phases(cell, cell.miner_params))):
                try:
                    grads = [_cached(cell, _params(cell, key, v, where), phase, b, x, labels, cache) for v in ends]
                except BenchError:
                    continue
                compared = True
                if key == OWN_LR and any(float(own.norm()) > ZERO_TOL for _, own in grads):
                    return False  # a step size for parameters that move: never a rescaled gradient
                if key == OWN_LR:
                    continue
                if any(not same_direction(a, b) for g in grads[1:] for a, b in zip(grads[0], g)):
                    return False
    return compared


def _cached(
    cell: Cell,
    params: tuple[dict[str, Any], dict[str, Any]],
    phase: int,
    b: int,
    x: torch.Tensor,
    labels: torch.Tensor,
    cache: Cache,
) -> tuple[torch.Tensor, torch.Tensor]:
    loss_params, miner_params = params[0], _phases(cell, params[1])[phase]
    key = (repr(sorted(loss_params.items())), repr(sorted(miner_params.items())), b)
    if key not in cache:
        cache[key] = _gradient(cell, loss_params, miner_params, x, labels)
    return cache[key]


def _gradient(
    cell: Cell, loss_params: dict[str, Any], miner_params: dict[str, Any], x: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """d loss / d embeddings and d loss / d the loss's own parameters (flattened, empty without any) for
    these parameters; every random draw seeded the same."""
    emb = x.clone().requires_grad_(True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        loss_fn, miner = build_methods(
            cell.loss,
            loss_params,
            cell.miner,
            miner_params,
            num_classes=classes_of(labels),  # the probe batch's labels are 0..P-1
            embedding_dim=x.shape[1],
        )
        tuples = miner(emb, labels) if miner is not None else None
        loss = loss_fn(emb, labels, tuples)
    own = [p for p in loss_fn.parameters() if p.requires_grad] if isinstance(loss_fn, torch.nn.Module) else []
    if not loss.requires_grad:
        return torch.zeros_like(x), torch.zeros(sum(p.numel() for p in own))
    grads = torch.autograd.grad(loss, [emb, *own], allow_unused=True)
    parts = [torch.zeros_like(t) if g is None else g.detach() for t, g in zip([emb, *own], grads)]
    return parts[0], torch.cat([p.flatten() for p in parts[1:]]) if own else torch.zeros(0)


def same_direction(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to a positive factor: both (near) zero, or cosine >= 1 - COSINE_TOL."""
    a, b = a.double().flatten(), b.double().flatten()
    na, nb = float(a.norm()), float(b.norm())
    if na <= ZERO_TOL or nb <= ZERO_TOL:
        return na <= ZERO_TOL and nb <= ZERO_TOL
    return float(a @ b) / (na * nb) >= 1 - COSINE_TOL
