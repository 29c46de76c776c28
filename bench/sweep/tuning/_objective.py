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
from typing import TYPE_CHECKING, Any

from bench.data.splits import ClassSplit, fold_label
from bench.errors import BenchError, DivergedError, MethodError
from bench.plan import Cell
from bench.protocol import Protocol
from bench.sweep.tuning._data import Prepared, TestLeakError
from bench.sweep.tuning._seeds import final_seed, trial_seed

if TYPE_CHECKING:
    from bench.training import TrainConfig


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


def train_config(
    protocol: Protocol, cell: Cell, loss_params: dict[str, Any], miner_params: dict[str, Any], seed: int
) -> TrainConfig:
    """The protocol's training settings for one run of a cell with these parameter values and seed."""
    from bench.protocol.schema import setting
    from bench.training import TrainConfig

    m, t = protocol.doc["model"], protocol.doc["training"]
    return TrainConfig(
        trunk=m["trunk"],
        trunk_params=dict(m["trunk_params"]),
        embedding_dim=m["embedding_dim"],
        loss=cell.loss,
        loss_params=loss_params,
        miner=cell.miner,
        miner_params=miner_params,
        optimizer=t["optimizer"],
        lr=t["lr"],
        weight_decay=t["weight_decay"],
        P=t["P"],
        K=t["K"],
        iterations=t["iterations"],
        seed=seed,
        augmentation=protocol.doc["data"]["augmentation"],
        device=t["device"],
        precision=t["precision"],
        channels_last=t["channels_last"],
        schedule=dict(t["schedule"]),
        pretrained=setting(protocol.doc, "model.pretrained"),
        freeze_bn=setting(protocol.doc, "model.freeze_bn"),
        trunk_lr=setting(protocol.doc, "training.trunk_lr"),
    )


def final_config(protocol: Protocol, cell: Cell, params: dict[str, Any], seed: int) -> TrainConfig:
    """Final seed ``seed`` of a cell retrained with the best trial's ``params``: its training seed is the
    same in every cell (`final_seed`), so cells share the trunk initialisation and the batch order."""
    loss_params, miner_params = split_params(cell, params)
    return train_config(protocol, cell, loss_params, miner_params, final_seed(protocol.seed, seed))


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
) -> RunResult:
    """Train, then evaluate on ``score_on``; divergence, a loss or miner that raises (`MethodError`) and bad
    parameter values become a FAIL, not a crash. ``on_checkpoint(iteration, model, metric)`` gets the
    loss's learned metric (or None) to rank by, as the final score does."""
    import optuna

    from bench.evaluation import pair_scorer_of, score_model
    from bench.training import train

    start = time.perf_counter()
    batch = config.P * config.K
    last = {"it": 0}

    built: dict[str, Any] = {}

    def checkpoint(it: int, model: Any) -> None:
        last["it"] = it
        assert on_checkpoint is not None  # only passed to train() when given
        on_checkpoint(it, model, pair_scorer_of(built["loss"]))  # a learned-metric cell is ranked by its g

    try:
        result = train(
            config,
            data,
            checkpoint_every=checkpoint_every,
            on_checkpoint=checkpoint if on_checkpoint else None,
            progress=progress,
            on_built=lambda trunk, loss: built.update(loss=loss),
        )
    except DivergedError as e:
        return RunResult(
            "FAIL",
            e.iteration,
            e.iteration * batch,
            time.perf_counter() - start,
            reason=str(e),
            train_s=time.perf_counter() - start,
        )
    except MethodError as e:  # the loss or miner raised: its steps before that one were trained
        done = max(e.iteration - 1, 0)
        return RunResult(
            "FAIL", done, done * batch, time.perf_counter() - start, reason=str(e), train_s=time.perf_counter() - start
        )
    except optuna.TrialPruned:
        it = last["it"]
        return RunResult(
            "PRUNED",
            it,
            it * batch,
            time.perf_counter() - start,
            reason=f"pruned at iteration {it}",
            train_s=time.perf_counter() - start,
        )
    except TestLeakError:
        raise
    except BenchError as e:  # a sampled combination the method refuses (e.g. alpha1 <= alpha2)
        return RunResult("FAIL", 0, 0, time.perf_counter() - start, reason=str(e), train_s=time.perf_counter() - start)
    metric = pair_scorer_of(result.loss_module)  # a learned-metric cell is ranked by its own g
    scoring = time.perf_counter()
    metrics = score_model(
        protocol,
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
    )


def run_trial(
    protocol: Protocol, prepared: Prepared, cell: Cell, trial: Any, slot: int, hooks: Hooks | None = None
) -> TrialOutcome:
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
    train_s = score_s = 0.0
    start = time.perf_counter()
    for f, (tr_split, val_split) in enumerate(prepared.folds):
        tr, val = prepared.fold(f)
        seed = trial_seed(protocol.seed, slot, f)
        hooks.fold_started(slot, f, seed, tr_split, val_split)
        config = train_config(protocol, cell, loss_params, miner_params, seed)

        def on_checkpoint(it: int, model: Any, metric: Any, f: int = f, val: Any = val, config: Any = config) -> None:
            from bench.evaluation import evaluate

            value = evaluate(
                model,
                val,
                ks=tuple(protocol.doc["evaluation"]["ks"]),
                clustering=False,
                device=config.device,
                normalize=protocol.doc["model"]["normalize"],
                metric=metric,
            )[primary]
            trial.report(value, f * iterations + it)
            if trial.should_prune():
                raise optuna.TrialPruned()

        use_pruner = pruner["type"] != "none"
        result = train_and_score(
            protocol,
            config,
            tr,
            val,
            clustering=False,
            on_checkpoint=on_checkpoint if use_pruner else None,
            checkpoint_every=pruner.get("check_every", 0) if use_pruner else 0,
            progress=hooks.iteration,
        )
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
            )
        values.append(float(result.metrics[primary]))
    return TrialOutcome(
        "COMPLETE",
        float(sum(values) / len(values)),
        values,
        params,
        total_it,
        total_samples,
        time.perf_counter() - start,
        train_s=train_s,
        score_s=score_s,
    )


def trial_attrs(outcome: TrialOutcome, protocol: Protocol) -> dict[str, Any]:
    """What every trial records besides its value: the budget it used and was given."""
    b = protocol.doc["training"]
    return {
        "iterations": outcome.iterations,
        "samples_seen": outcome.samples_seen,
        "wall_time_s": round(outcome.wall_time_s, 3),
        "fold_values": outcome.fold_values,
        "budget_iterations": b["iterations"] * protocol.doc["data"]["validation"]["use"],
        "reason": outcome.reason,
    }
