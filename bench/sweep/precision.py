"""One precision for a whole sweep: a fixed one as the protocol says, ``auto`` chosen once at its start.

Fairness needs every cell of a sweep, every trial and every final seed, to
train in the same precision and memory format. A protocol that fixes
``training.precision`` has that by construction. ``precision: auto`` picks
the fastest of fp32 and bf16, each with and without channels-last
(`bench.plan.measure.choose_precision`: the protocol's trunk, batch and image
size timed on random inputs, the variants alternating), the first time any
worker starts the sweep; the choice and the timings it rests on are stored
in the sweep's Optuna storage (study ``<protocol>:<key12>:precision``, one
finished trial whose ``choice`` attribute holds them) and in the manifest.
Every later start, resumed or on another worker or machine, reads the
stored choice and never measures again: a sweep begun in fp32 on a CPU
stays in fp32 when a GPU worker joins. Two workers starting together may
both measure; each records its choice as a trial inserted in one statement,
and the first trial in the database's order is the sweep's, for both.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from typing import Any

from bench.protocol import Protocol

__all__ = ["recorded_choice", "resolve_precision", "study_name"]


def study_name(protocol: Protocol) -> str:
    """The Optuna study holding the sweep's precision choice (keyed like the cells' studies)."""
    return f"{protocol.name}:{protocol.key12}:precision"


def _effective(protocol: Protocol) -> dict[str, Any]:
    from bench.plan.measure import VARIANTS, protocol_variant

    variant = protocol_variant(protocol)
    training = protocol.spec.training
    channels_last = VARIANTS[variant][1] if variant else bool(training.channels_last)
    return {"setting": training.precision, "precision": training.precision, "channels_last": channels_last}


def recorded_choice(protocol: Protocol, storage: Any) -> dict[str, Any] | None:
    """The choice stored for this sweep (the first recorded one), or None when none is stored yet."""
    import optuna

    try:
        study = optuna.load_study(study_name=study_name(protocol), storage=storage)
    except KeyError:
        return None
    done = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished() and "choice" in t.user_attrs]
    return min(done, key=lambda t: t.number).user_attrs["choice"] if done else None


def resolve_precision(
    protocol: Protocol, storage: Any, choose: Callable[[Protocol], Any] | None = None
) -> tuple[Protocol, dict[str, Any]]:
    """The protocol as the sweep trains it, and what the manifest records of its precision.

    A fixed precision: the protocol unchanged, the record its precision and effective channels-last. ``auto``:
    the stored choice, or, when none is stored, ``choose(protocol)`` (default `choose_precision`) recorded
    first; the protocol returned has the chosen precision and channels-last (`Protocol.with_precision`)."""
    if not protocol.precision_auto:
        return protocol, _effective(protocol)
    import optuna

    chosen = recorded_choice(protocol, storage)
    if chosen is None:
        from bench.plan.measure import choose_precision

        began = time.perf_counter()
        choice = (choose or choose_precision)(protocol)
        record = {
            "setting": "auto",
            **choice.to_dict(),
            "measured_s": round(time.perf_counter() - began, 1),
            "host": platform.node(),
            "machine": platform.processor() or platform.machine(),
            "chosen_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        study = optuna.create_study(study_name=study_name(protocol), storage=storage, load_if_exists=True)
        study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs={"choice": record}))  # one insert
        chosen = recorded_choice(protocol, storage)  # another worker's, if it recorded first
        assert chosen is not None
    return protocol.with_precision(chosen["precision"], bool(chosen["channels_last"])), chosen
