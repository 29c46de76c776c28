"""The trial objective: draw a cell's parameters, train on each fold, score on its validation classes.

A trial is a function of (protocol seed, slot, fold) and the drawn
parameters: its training seed comes from `trial_seed`, which does not
depend on the cell (common random numbers), so a resumed sweep reproduces
an uninterrupted one and two cells' slot ``t`` start alike.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.data.splits import ClassSplit, fold_label
from bench.errors import BenchError, DivergedError, MethodError
from bench.evaluation import evaluate, pair_scorer_of, score_model, scoring_precision
from bench.plan import Cell
from bench.protocol import Protocol
from bench.resume import RunState
from bench.sweep.prepare import Prepared, TestLeakError
from bench.sweep.seeds import final_fold_seed, final_seed, trial_seed
from bench.training import EarlyStopping, TrainConfig, train


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
    metric: Any = None  # the learned metric that ranked the test pairs (`bench.evaluation.pair_scorer_of`), or None
    train_s: float = 0.0  # the training loop's seconds (`TrainResult.wall_time_s`; all of it on a failure)
    score_s: float = 0.0  # scoring the trained model
    best_iteration: int | None = None  # early stopping: the iteration of the checkpoint scored; None: the last
    loss: Any = None  # the trained loss module (its own parameters: proxies, a learned metric), COMPLETE runs only
    resumed: str = ""  # a run resumed from an earlier attempt's state: its parts (`bench.resume.RunState`)


@dataclass
class TrialOutcome:
    """A whole trial (all its folds): what the study is told and the records keep."""

    state: str
    value: float | None
    fold_values: list[float]
    params: dict[str, Any]
    iterations: int
    samples_seen: int
    wall_time_s: float
    reason: str = ""
    train_s: float = 0.0  # its folds' training loops
    score_s: float = 0.0  # its folds' validation scoring
    best_iterations: list[int] = field(default_factory=list)  # early stopping: each fold's best checkpoint


@dataclass(frozen=True)
class Rung:
    """A successive-halving trial's rung (`bench.plan.rungs`): its index, the iterations a fold trains, and the
    rung-0 slot of its configuration, whose training seed it reuses."""

    index: int
    iterations: int
    seed_slot: int


class Hooks:
    """What the runner observes of a trial: fold starts and ends (MLflow records, progress)."""

    def fold_started(self, slot: int, fold: int, seed: int, train_split: ClassSplit, val_split: ClassSplit) -> None:
        """A fold of trial ``slot`` begins, with its training seed and class splits."""
        pass

    def fold_finished(self, slot: int, fold: int, result: RunResult) -> None:
        """A fold of trial ``slot`` ended, whatever its state."""
        pass

    def iteration(self, it: int, total: int, loss: float) -> None:
        """The training loop's progress callback (``it`` of ``total``, the latest loss)."""
        pass

    def run_state(self, slot: int, fold: int) -> RunState | None:
        """Where the run of a fold of trial ``slot`` saves its state, so a later attempt goes on from it
        (`bench.resume`); None: nowhere (the run starts over when interrupted)."""
        return None


def validation_metrics(protocol: Protocol, model: Any, data: Any, device: Any, metric: Any) -> dict[str, float]:
    """A model scored on validation classes as pruning and early stopping both read it: the protocol's ks and
    geometry and scoring precision, no clustering, ranked by the cell's learned `metric` when it has one."""
    with scoring_precision(protocol.spec):
        return evaluate(
            model,
            data,
            ks=tuple(protocol.spec.evaluation.ks),
            clustering=False,
            device=device,
            normalize=protocol.spec.model.normalize,
            metric=metric,
        )


def train_config(
    protocol: Protocol, cell: Cell, loss_params: dict[str, Any], miner_params: dict[str, Any], seed: int
) -> TrainConfig:
    """The protocol's training settings for one run of a cell with these parameter values and seed."""
    m, t = protocol.spec.model, protocol.spec.training
    return TrainConfig(
        trunk=m.trunk,
        trunk_params=dict(m.trunk_params),
        embedding_dim=m.embedding_dim,
        loss=cell.loss,
        loss_params=loss_params,
        miner=cell.miner,
        miner_params=miner_params,
        optimizer=t.optimizer,
        lr=t.lr,
        weight_decay=t.weight_decay,
        P=t.P,
        K=t.K,
        iterations=t.iterations,
        seed=seed,
        augmentation=protocol.spec.data.augmentation,
        device=t.device,
        precision=t.precision,
        channels_last=t.channels_last,
        schedule=dict(t.schedule or {}),
        pretrained=m.pretrained,
        freeze_bn=m.freeze_bn,
        trunk_lr=t.trunk_lr,
    )


def final_config(protocol: Protocol, cell: Cell, params: dict[str, Any], seed: int) -> TrainConfig:
    """Final seed ``seed`` of a cell retrained with the best trial's ``params``: its training seed is the
    same in every cell (`final_seed`), so cells share the trunk initialisation and the batch order."""
    loss_params, miner_params = split_params(cell, params)
    return train_config(protocol, cell, loss_params, miner_params, final_seed(protocol.seed, seed))


def final_fold_config(protocol: Protocol, cell: Cell, params: dict[str, Any], seed: int, fold: int) -> TrainConfig:
    """Fold ``fold``'s model of final seed ``seed`` under ``final.mode: folds``, with the best trial's
    ``params``: its training seed is the same in every cell (`final_fold_seed`)."""
    loss_params, miner_params = split_params(cell, params)
    return train_config(protocol, cell, loss_params, miner_params, final_fold_seed(protocol.seed, seed, fold))


def final_iterations(protocol: Protocol, best_iterations: list[int]) -> int | None:
    """The iterations a final seed trains under ``training.early_stopping``, or None (all of them).

    A final seed is retrained on every training class, so it has no validation classes to stop on; it
    trains as long as the cell's best trial's fold models trained to their best checkpoints: their mean,
    rounded to a multiple of ``check_every`` (at least one check, at most the budget), the learning-rate
    schedule still that of the whole budget. Without early stopping, or no fold iterations recorded: None.
    """
    stopping = protocol.spec.training.early_stopping
    if not stopping or not best_iterations:
        return None
    every = stopping.check_every
    mean = sum(best_iterations) / len(best_iterations)
    return int(min(max(every, every * round(mean / every)), protocol.spec.training.iterations))


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
    params: dict[str, Any] = {}
    for key, dist in sorted(cell.search_space.items()):
        if dist["type"] == "float":
            params[key] = trial.suggest_float(
                key, dist["low"], dist["high"], log=dist.get("log", False), step=dist.get("step")
            )
        elif dist["type"] == "int":
            params[key] = trial.suggest_int(
                key, dist["low"], dist["high"], log=dist.get("log", False), step=dist.get("step") or 1
            )
        else:
            params[key] = trial.suggest_categorical(key, dist["choices"])
    return params


def _ended(e: BaseException, wall_s: float, batch: int, checked_it: int) -> RunResult:
    """The record of a run that ended without a model: diverged or its loss or miner raised (FAIL), pruned,
    or a sampled combination the method refuses (e.g. alpha1 <= alpha2: FAIL at iteration 0)."""
    import optuna

    if isinstance(e, DivergedError):
        done, state = e.iteration, "FAIL"
    elif isinstance(e, MethodError):  # the loss or miner raised: its steps before that one were trained
        done, state = max(e.iteration - 1, 0), "FAIL"
    elif isinstance(e, optuna.TrialPruned):
        done, state = checked_it, "PRUNED"
    else:
        done, state = 0, "FAIL"
    reason = f"pruned at iteration {done}" if state == "PRUNED" else str(e)
    return RunResult(state, done, done * batch, wall_s, reason=reason, train_s=wall_s)


def train_and_score(
    protocol: Protocol,
    config: Any,
    data: Any,
    score_on: Any,
    *,
    clustering: bool,
    lake_runs: Any = None,
    on_checkpoint: Callable | None = None,
    checkpoint_every: int = 0,
    progress: Callable | None = None,
    stop_on: Any = None,
    on_score: Callable[[int, float], None] | None = None,
    stop_after: int | None = None,
    resume: RunState | None = None,
) -> RunResult:
    """Train, then evaluate on ``score_on``; divergence, a loss or miner that raises (`MethodError`) and bad
    parameter values become a FAIL, not a crash. ``on_checkpoint(iteration, model, metric)`` gets the
    loss's learned metric (or None) to rank by, as the final score does.

    ``stop_on``: validation data the run is early-stopped on (``training.early_stopping``: its metric
    every ``check_every`` iterations, the best checkpoint the model scored, `bench.training.EarlyStopping`);
    ``on_score(iteration, value)`` is told each of those scores (a pruner's report; it may raise
    ``optuna.TrialPruned``). None: the run trains ``config.iterations``, or ``stop_after`` of them
    (`bench.training.train`).

    ``resume``: the run's saved state (`bench.resume`), loaded if an earlier attempt left one and removed once the
    run has ended, whatever its outcome; the times count the earlier attempts' training too. Not with a
    pruner's callbacks: their reports belong to the Optuna trial, which an interruption gave back.
    """
    import optuna

    start = time.perf_counter()
    batch = config.P * config.K
    last = {"it": 0}

    built: dict[str, Any] = {}

    def checkpoint(it: int, model: Any) -> None:
        last["it"] = it
        assert on_checkpoint is not None  # only passed to train() when given
        on_checkpoint(it, model, pair_scorer_of(built["loss"]))  # a learned-metric cell is ranked by its g

    stopping = protocol.spec.training.early_stopping
    early = None
    if stop_on is not None and stopping:

        def score(it: int, model: Any) -> float:
            last["it"] = it
            value = validation_metrics(protocol, model, stop_on, config.device, pair_scorer_of(built["loss"]))[
                stopping.metric
            ]
            if on_score is not None:
                on_score(it, float(value))
            return float(value)

        early = EarlyStopping(stopping.check_every, stopping.patience, score)

    if on_checkpoint is not None or on_score is not None:
        resume = None
    try:
        result = train(
            config,
            data,
            checkpoint_every=checkpoint_every,
            on_checkpoint=checkpoint if on_checkpoint else None,
            progress=progress,
            on_built=lambda trunk, loss: built.update(loss=loss),
            early_stopping=early,
            stop_after=stop_after,
            resume=resume,
        )
    except TestLeakError:
        raise
    except (DivergedError, MethodError, optuna.TrialPruned, BenchError) as e:
        if resume is not None:  # the run ended (failed, pruned, refused): a later attempt starts over
            resume.clear()
        return _ended(e, time.perf_counter() - start, batch, last["it"])
    if resume is not None:
        resume.clear()
    start -= result.earlier_s  # the run's time counts its earlier attempts' training too
    metric = pair_scorer_of(result.loss_module)  # a learned-metric cell is ranked by its own g
    scoring = time.perf_counter()
    metrics = score_model(
        protocol.spec,
        result.model,
        score_on,
        clustering=clustering,
        lake_runs=lake_runs,
        device=config.device,
        seed=config.seed,
        metric=metric,
    )
    return RunResult(
        "COMPLETE",
        result.iterations,
        result.samples_seen,
        time.perf_counter() - start,
        metrics,
        result.final_loss,
        result.reason,
        result.model,
        metric,
        result.wall_time_s,
        time.perf_counter() - scoring,
        result.best_iteration,
        result.loss_module,
        result.resumed,
    )


def run_trial(
    protocol: Protocol,
    prepared: Prepared,
    cell: Cell,
    trial: Any,
    slot: int,
    hooks: Hooks | None = None,
    rung: Rung | None = None,
) -> TrialOutcome:
    """Train on each fold's training classes, score the primary metric on its validation classes; mean over folds.

    With a pruner, the validation score is reported every ``check_every``
    iterations at step ``fold x iterations + iteration``, so trials are
    compared fold by fold at equal training time. Under
    ``training.early_stopping`` each fold's run is early-stopped on that
    fold's validation classes, the pruner is told the early-stopping scores
    (the same steps), and each fold's best checkpoint is what the trial is
    scored on; the iterations are those trained, ``best_iterations`` the
    checkpoints'.

    ``rung`` (successive halving, `bench.plan.rungs`): each fold trains ``rung.iterations`` of the whole
    budget's schedule (`train`'s ``stop_after``), and the trial reports its value at that step (the rung's
    intermediate value). Its training seed is that of the configuration's rung-0 slot (``rung.seed_slot``), so
    a promoted configuration repeats its shorter run exactly and goes on.
    """
    import optuna

    hooks = hooks or Hooks()
    primary = protocol.primary
    iterations = protocol.spec.training.iterations
    pruner = protocol.spec.tuning.pruner
    stopping = protocol.spec.training.early_stopping
    best_iterations: list[int] = []
    params = suggest(trial, cell)
    loss_params, miner_params = split_params(cell, params)
    values: list[float] = []
    total_it = total_samples = 0
    train_s = score_s = 0.0
    start = time.perf_counter()
    for f, (tr_split, val_split) in enumerate(prepared.folds):
        tr, val = prepared.fold(f)
        seed = trial_seed(protocol.seed, slot if rung is None else rung.seed_slot, f)
        hooks.fold_started(slot, f, seed, tr_split, val_split)
        config = train_config(protocol, cell, loss_params, miner_params, seed)

        def on_checkpoint(it: int, model: Any, metric: Any, f: int = f, val: Any = val, config: Any = config) -> None:
            value = validation_metrics(protocol, model, val, config.device, metric)[primary]
            trial.report(value, f * iterations + it)
            if trial.should_prune():
                raise optuna.TrialPruned()

        def on_score(it: int, value: float, f: int = f) -> None:  # under early stopping: its scores, pruned
            trial.report(value, f * iterations + it)
            if trial.should_prune():
                raise optuna.TrialPruned()

        use_pruner = pruner.type != "none"
        result = train_and_score(
            protocol,
            config,
            tr,
            val,
            clustering=False,
            on_checkpoint=on_checkpoint if use_pruner and not stopping else None,
            checkpoint_every=(pruner.check_every or 0) if use_pruner and not stopping else 0,
            progress=hooks.iteration,
            stop_on=val if stopping else None,
            on_score=on_score if use_pruner and stopping else None,
            stop_after=rung.iterations if rung is not None else None,
            resume=hooks.run_state(slot, f),
        )
        if result.best_iteration is not None:
            best_iterations.append(result.best_iteration)
        total_it += result.iterations
        total_samples += result.samples_seen
        train_s += result.train_s
        score_s += result.score_s
        hooks.fold_finished(slot, f, result)
        if result.state != "COMPLETE":
            return TrialOutcome(
                result.state,
                None,
                values,
                params,
                total_it,
                total_samples,
                time.perf_counter() - start,
                f"{fold_label(f)}: {result.reason}",
                train_s,
                score_s,
                best_iterations,
            )
        values.append(float(result.metrics[primary]))
    value = float(sum(values) / len(values))
    if rung is not None:
        trial.report(value, rung.iterations)  # the rung's validation score, as Optuna records intermediate values
    return TrialOutcome(
        "COMPLETE",
        value,
        values,
        params,
        total_it,
        total_samples,
        time.perf_counter() - start,
        train_s=train_s,
        score_s=score_s,
        best_iterations=best_iterations,
    )


def trial_attrs(outcome: TrialOutcome, protocol: Protocol, rung: Rung | None = None) -> dict[str, Any]:
    """What every trial records besides its value: the budget it used and was given (the maximum under early
    stopping; a rung's iterations under successive halving, with its ``rung``), and under early stopping each
    fold's best checkpoint (``best_iterations``)."""
    b = protocol.spec.training
    extra: dict[str, Any] = {"best_iterations": outcome.best_iterations} if b.early_stopping else {}
    if rung is not None:
        extra.update(rung=rung.index, seed_slot=rung.seed_slot)
    return {
        **extra,
        "iterations": outcome.iterations,
        "samples_seen": outcome.samples_seen,
        "wall_time_s": round(outcome.wall_time_s, 3),
        "fold_values": outcome.fold_values,
        "budget_iterations": (b.iterations if rung is None else rung.iterations) * protocol.spec.data.validation.use,
        "reason": outcome.reason,
    }
