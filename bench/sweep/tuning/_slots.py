"""Trial slots in a shared Optuna study: every cell gets exactly ``n`` trials, whatever the workers do.

A study's trials are numbered by the storage; `SlotStudy.claim` gives the
first ``n`` fresh trials slots 0..n-1 and fails any later one as surplus
before it trains, so several workers sharing a storage can never run more
than ``n`` (see bench/sweep/runner.py for the multi-worker rules). A trial left
RUNNING by a killed worker is failed as stale and re-enqueued with the same
parameters and slot (its owner record names the host and process), so the
count stays ``n`` and the replacement reproduces it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bench.plan import Cell, cell_key
from bench.protocol import Protocol
from bench.stores import optuna as stores_optuna
from bench.stores import retry

HEARTBEAT_S = 30  # a worker records that its trial is alive this often...
GRACE_S = 120  # ...and a trial silent for this long is failed as stale by any worker

ATTR_OWNER = "dmlbench:owner"
ATTR_SURPLUS = "dmlbench:surplus"


def open_storage(url: str) -> Any:
    """The Optuna storage of a sweep: the stores' storage with the slots' heartbeat and stale-trial recovery
    (a trial silent for GRACE_S is failed by Optuna and re-enqueued into its slot by `_requeue`)."""
    return stores_optuna.open_storage(
        url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, stale_trial_callback=_requeue
    )


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, from /proc (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_record() -> dict[str, Any]:
    """Who runs a trial: host, pid and the process's start time (a reused pid is not the same owner)."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start(pid)}


def _owner_dead(owner: dict[str, Any] | None) -> bool:
    """True only when the owner ran on this machine and its process is gone (or the pid was reused)."""
    if not owner or owner.get("host") != socket.gethostname():
        return False
    pid = int(owner["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    started = _process_start(pid)
    return owner.get("start") is not None and started is not None and started != owner["start"]


def held(trials: Sequence[Any], n: float) -> dict[int, Any]:
    """slot -> the trial holding it: stale trials (those a replacement names) and surplus ones excluded.

    A finished trial cannot take new attributes in Optuna, so staleness is
    recorded on the replacement (``replaces``), not on the stale trial.
    """
    replaced = {t.user_attrs["replaces"] for t in trials if "replaces" in t.user_attrs}
    out: dict[int, Any] = {}
    for t in trials:
        slot = t.user_attrs.get("slot")
        if t.number in replaced or ATTR_SURPLUS in t.system_attrs or slot is None or slot >= n:
            continue
        out[slot] = t
    return out


def best_trial(counted: dict[int, Any]) -> Any:
    """The COMPLETE trial with the best validation value (ties: the lower slot), or None.

    Only the study's value, the mean validation score over folds, and the
    slot are read: a test score can never choose or break a tie (METHODS.md).
    """
    complete = [t for _, t in sorted(counted.items()) if t.state.name == "COMPLETE"]
    return max(complete, key=lambda t: (t.value, -t.user_attrs["slot"])) if complete else None


def _requeue(study: Any, trial: Any, why: str = "its worker stopped sending heartbeats") -> None:
    """Enqueue a failed stale trial's parameters again under the same slot; the replacement names it."""
    slot = trial.user_attrs.get("slot")
    if slot is None:  # killed between being created and being given its slot: the slot is its rank
        fresh = [t.number for t in study.get_trials(deepcopy=False) if "replaces" not in t.user_attrs]
        slot = sorted(fresh).index(trial.number)
        if slot >= study.user_attrs.get("slots", slot + 1):
            return
    study.enqueue_trial(dict(trial.params), user_attrs={"slot": slot, "replaces": trial.number, "stale": why})


class Heartbeat:
    """Records a trial's heartbeat every HEARTBEAT_S seconds from a daemon thread."""

    def __init__(self, storage: Any, trial_id: int) -> None:
        self.storage, self.trial_id = storage, trial_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Heartbeat:
        # the first beat is part of claiming the slot: a database away now is waited for like any storage call
        # (bench.stores.retry); the beats of the thread are not, a missed one is only skipped
        target = getattr(self.storage, "dmlbench_target", None)
        if target is None:
            self.storage.record_heartbeat(self.trial_id)
        else:
            retry.call(target, lambda: self.storage.record_heartbeat(self.trial_id))
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # a missed beat only risks a duplicate claim after GRACE_S, never a crash
                pass


@dataclass
class Slot:
    """A claimed trial and the slot it fills."""

    trial: Any  # optuna.Trial
    slot: int
    trial_id: int  # the storage's id of the trial (its heartbeat and system attributes are set through it)


class SlotStudy:
    """An Optuna study whose trials fill exactly ``n`` numbered slots, shared safely by any number of workers."""

    def __init__(
        self,
        storage: Any,
        name: str,
        n: int,
        direction: Literal["minimize", "maximize"] = "maximize",
        sampler: Any = None,
        pruner: Any = None,
    ) -> None:
        import optuna

        self.storage, self.name, self.n = storage, name, n
        self.study = optuna.create_study(
            storage=storage,
            study_name=name,
            direction=direction,
            sampler=sampler or optuna.samplers.RandomSampler(0),
            pruner=pruner or optuna.pruners.NopPruner(),
            load_if_exists=True,
        )
        if self.study.user_attrs.get("slots") != n:
            self.study.set_user_attr("slots", n)  # read by stale-trial recovery in any worker
        self.study_id = storage.get_study_id_from_name(name)

    def trial_id(self, number: int) -> int:
        """The storage's id of the study's trial ``number`` (Optuna's public route to it)."""
        return int(self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number))

    # ---- reading

    def trials(self) -> list[Any]:
        """Every trial of the study, stale and surplus ones included."""
        return self.study.get_trials(deepcopy=False)

    def counted(self) -> dict[int, Any]:
        """slot -> the trial that holds it now (stale and surplus trials excluded)."""
        return held(self.trials(), self.n)

    def finished(self) -> bool:
        """Whether every slot holds a finished trial: the cell's tuning is over."""
        counted = self.counted()
        return len(counted) == self.n and all(t.state.is_finished() for t in counted.values())

    def _fresh(self, trials: list[Any]) -> list[Any]:
        return sorted((t for t in trials if "replaces" not in t.user_attrs), key=lambda t: t.number)

    # ---- claiming

    def recover_stale(self) -> int:
        """Fail and re-enqueue trials whose worker is gone: a dead local process at once, others after GRACE_S."""
        import optuna
        from optuna.trial import TrialState

        recovered = 0
        now = time.time()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = t.system_attrs.get(ATTR_OWNER)
            never_owned = (
                owner is None and t.datetime_start is not None and now - t.datetime_start.timestamp() > GRACE_S
            )
            if _owner_dead(owner) or never_owned:
                try:
                    if self.storage.set_trial_state_values(self.trial_id(t.number), TrialState.FAIL):
                        _requeue(self.study, t, "its worker process is gone")
                        recovered += 1
                except optuna.exceptions.UpdateFinishedTrialError:
                    pass  # another worker got there first
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        return recovered

    def open_slots(self) -> bool:
        """Whether a claim could succeed now (cheap check; `claim` decides)."""
        from optuna.trial import TrialState

        trials = self.trials()
        waiting = any(t.state == TrialState.WAITING for t in trials)
        return waiting or len(self._fresh(trials)) < self.n

    def claim(self, sampler_for_slot: Callable[[int], Any] | None = None) -> Slot | None:
        """The next free slot as a RUNNING trial, or None when all ``n`` are taken.

        Fresh trials get their slot from their rank among fresh trials in
        storage order, which the database fixes: the first ``n`` win, any
        later one is failed as surplus before it runs.
        """
        from optuna.trial import TrialState

        self.recover_stale()
        if not self.open_slots():
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "heartbeat is supposed to be used with optimize": we beat ourselves
            trial = self.study.ask()
        trial_id = self.trial_id(trial.number)
        frozen = self.storage.get_trial(trial_id)
        slot = frozen.user_attrs.get("slot")
        if slot is None:
            fresh = [t.number for t in self._fresh(self.trials())]
            rank = fresh.index(frozen.number)
            if rank >= self.n:
                self.storage.set_trial_system_attr(trial_id, ATTR_SURPLUS, f"all {self.n} slots taken")
                self.study.tell(trial, state=TrialState.FAIL)
                return None if not self.open_slots() else self.claim(sampler_for_slot)
            slot = rank
            trial.set_user_attr("slot", slot)
        self.storage.set_trial_system_attr(trial_id, ATTR_OWNER, owner_record())
        if sampler_for_slot is not None:
            self.study.sampler = sampler_for_slot(slot)
        return Slot(trial, slot, trial_id)

    def abandon(self, slot: Slot, why: str) -> None:
        """Give a slot back after an interruption (Ctrl-C): failed as stale, re-enqueued with its parameters."""
        import optuna
        from optuna.trial import TrialState

        try:
            if self.storage.set_trial_state_values(slot.trial_id, TrialState.FAIL):
                _requeue(self.study, self.storage.get_trial(slot.trial_id), why)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass


def study_name(protocol: Protocol, cell: Cell, finals: bool = False, draw: int = 0) -> str:
    """The Optuna study of a cell's tuning (or its final seeds): ``<protocol>:<cell key>:<cell>``, keyed by the
    cell's key (`bench.plan.cell_key`), so a cell keeps its studies when other cells are added or removed;
    tuning draw r > 0 (``tuning.repeats``) has its own, ``...:draw<r>``."""
    name = f"{protocol.name}:{cell_key(protocol, cell)}:{cell.id}" + (":final" if finals else "")
    return name + (f":draw{draw}" if draw else "")


def extra_seed_study(protocol: Protocol, cell: Cell, draw: int, index: int) -> str:
    """The study of final seed ``index`` (0-based, at or past a seed range's ``min``, `bench.plan.seeds`): one
    slot, so whichever worker claims it first trains it, and it is claimed only once the rule over the seeds
    before it asks for it; the first ``min`` seeds share the cell's finals study."""
    return f"{study_name(protocol, cell, finals=True, draw=draw)}:seed{index}"
