"""Tuning a cell: class-disjoint folds, the trial objective, and trial slots in a shared Optuna study.

Three rules of the fair protocol are enforced here, in code:

* Test classes are never seen while tuning. `TestClassGuard` compares the
  class set of every piece of data a trial trains or scores on with the
  test classes and raises `TestLeakError` if they meet, whatever the
  protocol or a bug elsewhere says.
* Every cell gets the same number of trials. A study's trials are numbered
  by the storage; `SlotStudy.claim` gives the first ``n`` fresh trials
  slots 0..n-1 and fails any later one as surplus before it trains, so
  several workers sharing a storage can never run more than ``n`` (see
  bench/runner.py for the multi-worker rules). A trial left RUNNING by a
  killed worker is failed as stale and re-enqueued with the same parameters
  and slot, so the count stays ``n`` and the replacement reproduces it.
* A trial is a function of (protocol seed, cell, slot, fold): its training
  seed and the TPE sampler's seed are derived from them (`derive_seed`), so
  a resumed sweep reproduces an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.errors import BenchError, DivergedError
from bench.plan import Cell
from bench.protocol import Protocol
from bench.splits import ClassSplit, class_folds

HEARTBEAT_S = 30  # a worker records that its trial is alive this often...
GRACE_S = 120  # ...and a trial silent for this long is failed as stale by any worker

ATTR_OWNER = "dmlbench:owner"
ATTR_SURPLUS = "dmlbench:surplus"


class TestLeakError(BenchError):
    """Data a trial would see contains test classes: a bug or a protocol error, never a trial result."""

    exit_code = 3
    __test__ = False  # not a pytest class, despite the name


# --------------------------------------------------------------------------- seeds


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from the protocol seed and names: stable across processes, machines and versions."""
    text = ":".join(map(str, parts))
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


# --------------------------------------------------------------------------- data


class TestClassGuard:
    """Refuses any data that shares a class with the test split."""

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, test: ClassSplit):
        self.test = test
        self._classes = frozenset(test.classes)

    def check(self, classes: Sequence[int], role: str) -> ClassSplit:
        shared = self._classes.intersection(int(c) for c in classes)
        if shared:
            shown = ", ".join(map(str, sorted(shared)[:5]))
            raise TestLeakError(f"{role} data contains {len(shared)} test class(es) ({shown}): "
                                f"test classes ({self.test.fingerprint[:12]}) are never used for training or tuning")
        return ClassSplit(role, tuple(classes))


@dataclass
class Prepared:
    """The data of a protocol, split once: what every trial and final run reads."""

    train: Any  # LabeledData, all training classes
    test: Any  # LabeledData, the test classes
    train_split: ClassSplit
    test_split: ClassSplit
    folds: list[tuple[ClassSplit, ClassSplit]]  # (fold train, fold validation), only the folds used
    guard: TestClassGuard
    lake_runs: Any = None
    _fold_data: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def fold(self, f: int) -> tuple[Any, Any]:
        """(training, validation) data of fold f, each checked by the guard; built once."""
        if f not in self._fold_data:
            tr_split, val_split = self.folds[f]
            self.guard.check(tr_split.classes, f"fold {f} training")
            self.guard.check(val_split.classes, f"fold {f} validation")
            self._fold_data[f] = (self.train.subset(tr_split.classes), self.train.subset(val_split.classes))
        tr, val = self._fold_data[f]
        self.guard.check(tr.classes, f"fold {f} training")  # the data itself, not only the split
        self.guard.check(val.classes, f"fold {f} validation")
        return tr, val

    def fingerprints(self) -> dict[str, Any]:
        from bench.splits import fingerprint

        return {"split": fingerprint(self.train_split, self.test_split), "train": self.train_split.fingerprint,
                "test": self.test_split.fingerprint,
                "folds": [{"train": t.fingerprint, "validation": v.fingerprint} for t, v in self.folds]}


def _select(classes: Sequence[int], wanted: Any, seed: int, side: str, spec: str) -> tuple[int, ...]:
    """All classes, exactly the listed ones, or a seeded sample of n (sha256 order: platform-independent)."""
    if wanted is None:
        return tuple(classes)
    if isinstance(wanted, list):
        missing = sorted(set(wanted) - set(classes))
        if missing:
            raise BenchError(f"data.{side}_classes: {spec} has no class {missing[0]}")
        return tuple(sorted(wanted))
    if wanted > len(classes):
        raise BenchError(f"data.{side}_classes: asked for {wanted} classes, {spec} has {len(classes)}")
    order = sorted(classes, key=lambda c: hashlib.sha256(f"{seed}:{side}:{c}".encode()).hexdigest())
    return tuple(sorted(order[:wanted]))


def prepare(protocol: Protocol, data_root: str | None = None) -> Prepared:
    """Load the data, select classes, make the folds and check that training can run on every fold."""
    import torch

    from bench import data as datasets

    d, t = protocol.doc["data"], protocol.doc["training"]
    train_all = datasets.load(d["train"], data_root, d["image_size"])
    test_all = train_all if d["test"] == d["train"] else datasets.load(d["test"], data_root, d["image_size"])
    train_classes = _select(train_all.classes, d["train_classes"], protocol.seed, "train", d["train"])
    test_classes = _select(test_all.classes, d["test_classes"], protocol.seed, "test", d["test"])
    test_split = ClassSplit("test", test_classes)
    guard = TestClassGuard(test_split)
    train_split = guard.check(train_classes, "train")
    train, test = train_all.subset(train_classes), test_all.subset(test_classes)
    for data, side in ((train, "train"), (test, "test")):
        _, counts = torch.unique(data.y, return_counts=True)
        low = int(counts.argmin())
        if int(counts[low]) < d["min_samples_per_class"]:
            cls = int(torch.unique(data.y)[low])
            raise BenchError(f"{data.name}: class {cls} has {int(counts[low])} sample(s); every {side} class needs "
                             f"at least {d['min_samples_per_class']} (data.min_samples_per_class)")
    validation = d["validation"]
    groups = None
    if validation["group_by"]:
        groups = train.meta.get(validation["group_by"])
        if not isinstance(groups, dict):
            raise BenchError(f"data.validation.group_by: {d['train']} has no per-class {validation['group_by']!r}")
    folds = class_folds(train_split.classes, validation["folds"], protocol.seed, groups)[: validation["use"]]
    for i, (fold_train, _) in enumerate(folds):
        if len(fold_train) < t["P"]:
            raise BenchError(f"training.P: {t['P']} classes per batch, but fold {i} trains on {len(fold_train)} classes")
    lake = None
    if "lake_accuracy" in protocol.doc["evaluation"]["metrics"]:
        if d["test"] != "omniglot:evaluation":
            raise BenchError("evaluation.metrics: lake_accuracy needs omniglot:evaluation as the test data")
        lake = datasets.load_lake_runs(data_root, d["image_size"])
    return Prepared(train, test, train_split, test_split, folds, guard, lake)


# --------------------------------------------------------------------------- one trial


@dataclass
class RunResult:
    """One training run (a fold of a trial, or a final seed) as the records keep it."""

    state: str  # COMPLETE | PRUNED | FAIL
    iterations: int
    samples_seen: int
    wall_time_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    final_loss: float = math.nan
    reason: str = ""
    model: Any = None


@dataclass
class TrialOutcome:
    state: str
    value: float | None
    fold_values: list[float]
    params: dict[str, Any]
    iterations: int
    samples_seen: int
    wall_time_s: float
    reason: str = ""


class Hooks:
    """What the runner observes of a trial: fold starts and ends (MLflow records, progress)."""

    def fold_started(self, slot: int, fold: int, seed: int, train_split: ClassSplit, val_split: ClassSplit) -> None:
        pass

    def fold_finished(self, slot: int, fold: int, result: RunResult) -> None:
        pass

    def iteration(self, it: int, total: int, loss: float) -> None:
        pass


def train_config(protocol: Protocol, cell: Cell, loss_params: dict, miner_params: dict, seed: int):
    from bench.training import TrainConfig

    m, t = protocol.doc["model"], protocol.doc["training"]
    return TrainConfig(trunk=m["trunk"], trunk_params=dict(m["trunk_params"]), embedding_dim=m["embedding_dim"],
                       loss=cell.loss, loss_params=loss_params, miner=cell.miner, miner_params=miner_params,
                       optimizer=t["optimizer"], lr=t["lr"], weight_decay=t["weight_decay"], P=t["P"], K=t["K"],
                       iterations=t["iterations"], seed=seed, augmentation=protocol.doc["data"]["augmentation"],
                       device=t["device"])


def split_params(cell: Cell, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Searched values (``loss.x``, ``miner.y``) merged over the cell's fixed parameters."""
    loss = dict(cell.loss_params)
    miner = dict(cell.miner_params)
    for key, value in params.items():
        kind, name = key.split(".", 1)
        (loss if kind == "loss" else miner)[name] = value
    return loss, miner


def suggest(trial: Any, cell: Cell) -> dict[str, Any]:
    """Draw every searched parameter of the cell from the trial (or take the enqueued values)."""
    params = {}
    for key, dist in sorted(cell.search_space.items()):
        if dist["type"] == "float":
            params[key] = trial.suggest_float(key, dist["low"], dist["high"], log=dist.get("log", False),
                                              step=dist.get("step"))
        elif dist["type"] == "int":
            params[key] = trial.suggest_int(key, dist["low"], dist["high"], log=dist.get("log", False),
                                            step=dist.get("step") or 1)
        else:
            params[key] = trial.suggest_categorical(key, dist["choices"])
    return params


def train_and_score(protocol: Protocol, config: Any, data: Any, score_on: Any, *, clustering: bool,
                    lake_runs: Any = None, on_checkpoint: Callable | None = None, checkpoint_every: int = 0,
                    progress: Callable | None = None) -> RunResult:
    """Train, then evaluate on ``score_on``; divergence and bad parameter values become a FAIL, not a crash."""
    import optuna

    from bench.training import evaluate, train

    start = time.perf_counter()
    batch = config.P * config.K
    last = {"it": 0}

    def checkpoint(it: int, model: Any) -> None:
        last["it"] = it
        on_checkpoint(it, model)

    try:
        result = train(config, data, checkpoint_every=checkpoint_every,
                       on_checkpoint=checkpoint if on_checkpoint else None, progress=progress)
    except DivergedError as e:
        return RunResult("FAIL", e.iteration, e.iteration * batch, time.perf_counter() - start, reason=str(e))
    except optuna.TrialPruned:
        it = last["it"]
        return RunResult("PRUNED", it, it * batch, time.perf_counter() - start,
                         reason=f"pruned at iteration {it}")
    except TestLeakError:
        raise
    except BenchError as e:  # a sampled combination the method refuses (e.g. alpha1 <= alpha2)
        return RunResult("FAIL", 0, 0, time.perf_counter() - start, reason=str(e))
    ev = protocol.doc["evaluation"]
    metrics = evaluate(result.model, score_on, ks=tuple(ev["ks"]), lake_runs=lake_runs, clustering=clustering,
                       device=config.device, seed=config.seed, normalize=protocol.doc["model"]["normalize"])
    return RunResult("COMPLETE", result.iterations, result.samples_seen, time.perf_counter() - start, metrics,
                     result.final_loss, result.reason, result.model)


def run_trial(protocol: Protocol, prepared: Prepared, cell: Cell, trial: Any, slot: int,
              hooks: Hooks | None = None) -> TrialOutcome:
    """Train on each fold's training classes, score the primary metric on its validation classes; mean over folds.

    With a pruner, the validation score is reported every ``check_every``
    iterations at step ``fold x iterations + iteration``, so trials are
    compared fold by fold at equal training time.
    """
    import optuna

    hooks = hooks or Hooks()
    primary = protocol.primary
    iterations = protocol.doc["training"]["iterations"]
    pruner = protocol.doc["tuning"]["pruner"]
    params = suggest(trial, cell)
    loss_params, miner_params = split_params(cell, params)
    values: list[float] = []
    total_it = total_samples = 0
    start = time.perf_counter()
    for f, (tr_split, val_split) in enumerate(prepared.folds):
        tr, val = prepared.fold(f)
        seed = derive_seed(protocol.seed, cell.id, "trial", slot, "fold", f)
        hooks.fold_started(slot, f, seed, tr_split, val_split)
        config = train_config(protocol, cell, loss_params, miner_params, seed)

        def on_checkpoint(it: int, model: Any, f: int = f, val: Any = val) -> None:
            from bench.training import evaluate

            value = evaluate(model, val, ks=tuple(protocol.doc["evaluation"]["ks"]), clustering=False,
                             device=config.device, normalize=protocol.doc["model"]["normalize"])[primary]
            trial.report(value, f * iterations + it)
            if trial.should_prune():
                raise optuna.TrialPruned()

        use_pruner = pruner["type"] != "none"
        result = train_and_score(protocol, config, tr, val, clustering=False,
                                 on_checkpoint=on_checkpoint if use_pruner else None,
                                 checkpoint_every=pruner.get("check_every", 0) if use_pruner else 0,
                                 progress=hooks.iteration)
        total_it += result.iterations
        total_samples += result.samples_seen
        hooks.fold_finished(slot, f, result)
        if result.state != "COMPLETE":
            return TrialOutcome(result.state, None, values, params, total_it, total_samples,
                                time.perf_counter() - start, f"fold {f}: {result.reason}")
        values.append(float(result.metrics[primary]))
    return TrialOutcome("COMPLETE", float(sum(values) / len(values)), values, params, total_it, total_samples,
                        time.perf_counter() - start)


# --------------------------------------------------------------------------- storage and slots


def open_storage(url: str):
    """An Optuna RDB storage with heartbeats (SQLite waits for locks instead of failing at once)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # study creation is not news on a command line
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(4):  # two workers starting at once on a new database race to create its tables
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S,
                                                  grace_period=GRACE_S, heartbeat_stale_trial_callback=_requeue)
            except Exception as e:  # a URL that cannot be opened is the user's
                if attempt == 3 or "UNIQUE constraint" not in str(e) and "already exists" not in str(e):
                    raise BenchError(f"cannot open Optuna storage {redact(url)!r}: {str(e).splitlines()[0]}") from e
                time.sleep(1 + attempt)
    raise AssertionError("unreachable")


def redact(url: str) -> str:
    """The URL without its password, fit for logs and manifests."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':', 1)[0]}:***@{host}"
    return url


def _process_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_record() -> dict[str, Any]:
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

    def __init__(self, storage: Any, trial_id: int):
        self.storage, self.trial_id = storage, trial_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Heartbeat":
        self.storage.record_heartbeat(self.trial_id)
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
    trial: Any  # optuna.Trial
    slot: int


class SlotStudy:
    """An Optuna study whose trials fill exactly ``n`` numbered slots, shared safely by any number of workers."""

    def __init__(self, storage: Any, name: str, n: int, direction: str = "maximize", sampler: Any = None,
                 pruner: Any = None):
        import optuna

        self.storage, self.name, self.n = storage, name, n
        self.study = optuna.create_study(storage=storage, study_name=name, direction=direction,
                                         sampler=sampler or optuna.samplers.RandomSampler(0),
                                         pruner=pruner or optuna.pruners.NopPruner(), load_if_exists=True)
        if self.study.user_attrs.get("slots") != n:
            self.study.set_user_attr("slots", n)  # read by stale-trial recovery in any worker

    # ---- reading

    def trials(self) -> list[Any]:
        return self.study.get_trials(deepcopy=False)

    def counted(self) -> dict[int, Any]:
        """slot -> the trial that holds it now (stale and surplus trials excluded)."""
        return held(self.trials(), self.n)

    def finished(self) -> bool:
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
            never_owned = owner is None and t.datetime_start is not None and \
                now - t.datetime_start.timestamp() > GRACE_S
            if _owner_dead(owner) or never_owned:
                try:
                    if self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL):
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
        import optuna
        from optuna.trial import TrialState

        self.recover_stale()
        if not self.open_slots():
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "heartbeat is supposed to be used with optimize": we beat ourselves
            trial = self.study.ask()
        frozen = self.storage.get_trial(trial._trial_id)
        slot = frozen.user_attrs.get("slot")
        if slot is None:
            fresh = [t.number for t in self._fresh(self.trials())]
            rank = fresh.index(frozen.number)
            if rank >= self.n:
                self.storage.set_trial_system_attr(trial._trial_id, ATTR_SURPLUS, f"all {self.n} slots taken")
                self.study.tell(trial, state=TrialState.FAIL)
                return None if not self.open_slots() else self.claim(sampler_for_slot)
            slot = rank
            trial.set_user_attr("slot", slot)
        self.storage.set_trial_system_attr(trial._trial_id, ATTR_OWNER, owner_record())
        if sampler_for_slot is not None:
            self.study.sampler = sampler_for_slot(slot)
        return Slot(trial, slot)

    def abandon(self, slot: Slot, why: str) -> None:
        """Give a slot back after an interruption (Ctrl-C): failed as stale, re-enqueued with its parameters."""
        import optuna
        from optuna.trial import TrialState

        try:
            if self.storage.set_trial_state_values(slot.trial._trial_id, TrialState.FAIL):
                _requeue(self.study, self.storage.get_trial(slot.trial._trial_id), why)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass


def make_sampler(protocol: Protocol, cell: Cell, slot: int):
    """TPE seeded by (protocol seed, cell, slot): the draw for a slot does not depend on how many times
    the sweep was interrupted before it."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=derive_seed(protocol.seed, cell.id, "sampler", slot),
                                          n_startup_trials=protocol.doc["tuning"]["startup_trials"],
                                          constant_liar=True)


def make_pruner(protocol: Protocol):
    import optuna

    p = protocol.doc["tuning"]["pruner"]
    if p["type"] == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p["startup_trials"], n_warmup_steps=p["warmup_steps"])
    if p["type"] == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p["min_resource"],
                                                      reduction_factor=p["reduction_factor"])
    return optuna.pruners.NopPruner()


def study_name(protocol: Protocol, cell: Cell, finals: bool = False) -> str:
    return f"{protocol.name}:{protocol.hash12}:{cell.id}" + (":final" if finals else "")


def trial_attrs(outcome: TrialOutcome, protocol: Protocol) -> dict[str, Any]:
    """What every trial records besides its value: the budget it used and was given."""
    b = protocol.doc["training"]
    return {"iterations": outcome.iterations, "samples_seen": outcome.samples_seen,
            "wall_time_s": round(outcome.wall_time_s, 3), "fold_values": outcome.fold_values,
            "budget_iterations": b["iterations"] * protocol.doc["data"]["validation"]["use"],
            "reason": outcome.reason}


__all__ = ["Hooks", "Prepared", "RunResult", "SlotStudy", "TestClassGuard", "TestLeakError", "TrialOutcome",
           "derive_seed", "make_pruner", "make_sampler", "prepare", "run_trial", "study_name"]
