"""Seeds of every training run, as pure functions of the protocol seed and a name.

Common random numbers: a run's seed does not depend on the cell. Final seed
``s`` gives every cell the same trunk initialisation and the same batch
order, and tuning slot ``t`` on fold ``f`` the same for every cell, so two
cells differ only by their method and the comparison between them is
paired (docs/METHODS.md, *Fair comparison*). The sampler's seed does depend on the cell:
each cell's search space is its own.
"""

from __future__ import annotations

import hashlib
from typing import Any

from bench.protocol import Protocol


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from the protocol seed and names: stable across processes, machines and versions."""
    text = ":".join(map(str, parts))
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def trial_seed(protocol_seed: int, slot: int, fold: int) -> int:
    """Training seed of tuning slot ``slot`` on fold ``fold``: the same in every cell."""
    return derive_seed(protocol_seed, "trial", slot, "fold", fold)


def final_seed(protocol_seed: int, seed: int) -> int:
    """Training seed of final seed ``seed``: the same trunk initialisation and batches in every cell."""
    return derive_seed(protocol_seed, "final", seed)


def final_fold_seed(protocol_seed: int, seed: int, fold: int) -> int:
    """Training seed of fold ``fold``'s model of final seed ``seed`` (``final.mode: folds``): the same in every
    cell, and another in every fold (each fold model starts from its own initialisation, as the Reality Check's
    fold models do)."""
    return derive_seed(protocol_seed, "final", seed, "fold", fold)


def sampler_seed(protocol_seed: int, cell_id: str, slot: int) -> int:
    """TPE's seed for one slot of one cell: its draw does not depend on interruptions before it."""
    return derive_seed(protocol_seed, cell_id, "sampler", slot)


def for_draw(protocol: Protocol, draw: int) -> Protocol:
    """The protocol as tuning draw ``draw`` of ``tuning.repeats`` trains it: draw 0 is the protocol itself; draw
    r > 0 has its own protocol seed, so its sampler, its trials' training seeds and its final seeds are
    independent of every other draw's, and still the same in every cell (common random numbers by draw). The
    hash, text and records are the protocol's; only the seed that runs derive theirs from differs."""
    if draw == 0:
        return protocol
    return protocol.with_seed(derive_seed(protocol.seed, "draw", draw))
