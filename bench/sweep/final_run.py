"""One final run: a cell retrained with its best trial's parameters on one final seed, scored on the test set.

The sweep's final seeds (bench.sweep.final_phase) and the budget check's seeds
(bench.sweep.budget_check) are the same run, told apart by three things:

* the iteration multiple: 1 for a final seed; the budget check trains
  ``multiple`` times as long, its schedule's warm-up scaled alike
  (`final_run_config`);
* where the record goes: a `Record` the caller subclasses. A final seed's
  goes into its slot of the cell's finals study in the Optuna storage (under
  the slot's heartbeat, the slot given back if the run is interrupted); a
  budget check's into a row of budget_check.csv. Both also get an MLflow run,
  named and tagged by the record;
* the artifacts: the test pair distances (and the 2-D embedding) written to
  a cell's directory and attached to the MLflow run, for the first final
  seed only (``artifacts``).

Under ``final.mode: folds`` (the Reality Check's procedure) a final seed is
not one model but one per validation fold in use (`train_fold_models`): fold
``f``'s model trains on that fold's training classes with the best
parameters, early-stopped on its validation classes where the protocol
stops early, and is scored alone on the test set; the final seed's metrics
are those of the fold models concatenated (`bench.evaluation.Concatenated`),
and its ``separate`` metrics the fold models' mean. Both become rows of the
tables (`bench.sweep.records.expand_evaluations`).

Everything else is `train_final`: the test-class guard, training and
scoring by `bench.sweep.tuning.train_and_score` (the one call, so a budget
check seed's first ``iterations`` batches are the final's), the MLflow run
(opened by its key, so a resumed run finds it; ended KILLED when
interrupted), the progress bars. A record is written only once the run is
scored, so an interrupted run leaves nothing recorded and resuming trains
it again; one already recorded is skipped by the caller.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.data.query_gallery import one_set
from bench.data.splits import fold_label
from bench.evaluation import (
    EMBEDDING_PREFIX,
    Concatenated,
    clusters_on_test,
    kept_embeddings,
    score_model,
    scoring_precision,
)
from bench.plan import Cell
from bench.protocol import Protocol
from bench.resume import RunState, resumed_tag
from bench.stores.retry import StoreUnavailableError
from bench.sweep.artifacts import write_cell_artifacts
from bench.sweep.kept import write_final
from bench.sweep.prepare import Prepared
from bench.sweep.records import metric_names
from bench.sweep.tuning import RunResult, final_config, final_fold_config, train_and_score

SEPARATE_PREFIX = "separate_"  # final.mode folds: a final seed's fold models scored alone, their mean

if TYPE_CHECKING:
    from collections.abc import Callable

    from bench.stores.mlflow_runs import MlflowRecords
    from bench.sweep.progress import Progress
    from bench.training import TrainConfig


def final_run_config(
    protocol: Protocol, cell: Cell, params: dict[str, Any], seed: int, multiple: int = 1
) -> TrainConfig:
    """Final seed ``seed`` of ``cell`` with ``params``, trained ``multiple`` times as long: the finals' config
    (`final_config`, so the same training seed) with the iterations and the schedule's warm-up scaled; at
    ``multiple`` 1 the finals' config as it is."""
    config = final_config(protocol, cell, params, seed)
    if multiple == 1:
        return config
    schedule = dict(config.schedule)
    schedule["warmup"] = int(schedule.get("warmup", 0)) * multiple
    return replace(config, iterations=config.iterations * multiple, schedule=schedule)


@dataclass
class FinalRun:
    """What one final run produced: its config, the training result, and the protocol's test metrics it
    scored (those of ``tables.metric_names`` the evaluation gave; none when the run failed)."""

    seed: int
    config: TrainConfig
    result: RunResult
    metrics: dict[str, float]
    run_id: str
    artifacts_s: float = 0.0  # writing and logging the artifacts (the first seed of a cell)
    # final.mode folds: the fold models' metrics (``metrics`` are their concatenation's), each fold's iterations
    folds: list[RunResult] = field(default_factory=list)

    @property
    def separate(self) -> dict[str, float]:
        """Under final.mode folds, each metric of ``metrics`` as the mean of the fold models scored alone."""
        if not self.folds:
            return {}
        return {m: sum(float(r.metrics[m]) for r in self.folds) / len(self.folds) for m in self.metrics}


class Record:
    """Where a final run is recorded: its MLflow run (key, name, tags, parent run, the parameters logged
    beside the config) and, through a subclass's `write`, the caller's own store."""

    def __init__(
        self,
        key: str,
        name: str,
        tags: dict[str, Any],
        *,
        parent: str | None = None,
        params: dict[str, Any] | None = None,
        purpose: str = "final training",
    ) -> None:
        self.key, self.name, self.tags, self.parent = key, name, tags, parent
        self.params = params or {}
        self.purpose = purpose  # what the test-class guard calls this training

    def held(self) -> AbstractContextManager[Any]:
        """Held around training (a slot's heartbeat)."""
        return nullcontext()

    def abandon(self) -> None:
        """The run was interrupted: give back what `held` claimed."""

    def run_state(self) -> RunState | None:
        """Where the run saves its state, so that a later attempt goes on from it (`bench.resume`); None:
        nowhere (an interrupted run starts over)."""
        return None

    def write(self, run: FinalRun) -> None:
        """Record the scored run in the caller's store (the Optuna slot, the CSV row)."""
        raise NotImplementedError

    def logged_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The test metrics as the MLflow run logs them."""
        return metrics


def train_final(
    protocol: Protocol,
    prepared: Prepared,
    cell: Cell,
    params: dict[str, Any],
    seed: int,
    record: Record,
    *,
    mlflow: MlflowRecords,
    progress: Progress,
    step: Callable[[int, int, float], None],
    multiple: int = 1,
    artifacts: Path | None = None,
    stop_after: int | None = None,
    keep: bool = False,
) -> FinalRun:
    """Train final seed ``seed`` of ``cell`` with ``params`` (``multiple`` x the budget), score it on the test
    set, write the artifacts into ``artifacts`` (a cell's directory; None: none) when it completed, record
    it (``record``) and log its MLflow run. ``step`` is the training loop's progress callback (it may raise
    KeyboardInterrupt); an interruption ends the MLflow run KILLED, records nothing and is raised again.
    ``stop_after``: under ``training.early_stopping`` the iterations the final trains (`final_iterations`, the
    cell's best trial's early-stopped length; x ``multiple`` here), the schedule that of the whole budget.
    ``keep``: a completed run's model and test embeddings are attached to its MLflow run (`bench.sweep.kept`)."""
    run_id = mlflow.run(record.key, record.name, record.parent, tags=record.tags)
    config = final_run_config(protocol, cell, params, seed, multiple)
    by_folds = protocol.spec.final.mode == "folds"
    folds: list[RunResult] = []
    allotment = config.iterations * len(prepared.folds) if by_folds else config.iterations
    progress.run_started(allotment if stop_after is None else stop_after * multiple)
    # the test set is embedded once for the scores and the artifacts of the first seed (`kept_embeddings`)
    with kept_embeddings(getattr(prepared.test, "x", None)):
        try:
            with record.held():
                prepared.guard.check(prepared.train.classes, record.purpose)
                if by_folds:
                    result, folds = train_fold_models(protocol, prepared, cell, params, seed, step=step)
                else:
                    result = train_and_score(
                        protocol,
                        config,
                        prepared.train,
                        prepared.test,
                        clustering=clusters_on_test(protocol.spec),
                        lake_runs=prepared.lake_runs,
                        progress=step,
                        stop_after=None if stop_after is None else stop_after * multiple,
                        resume=record.run_state(),
                    )
        except BaseException:
            record.abandon()
            with suppress(StoreUnavailableError):  # a store that is gone gets nothing back; the original is raised
                mlflow.end(run_id, "KILLED")
            raise
        progress.run_finished()
        metrics = {m: float(result.metrics[m]) for m in metric_names(protocol.spec.evaluation) if m in result.metrics}
        # a learned-metric cell's embedding-distance ranking: a labelled secondary result, logged beside the table's
        secondary = {m: float(v) for m, v in result.metrics.items() if m.startswith(EMBEDDING_PREFIX)}
        run = FinalRun(seed, config, result, metrics, run_id, folds=folds if result.state == "COMPLETE" else [])
        # the artifacts' and the kept model's embeddings are those the seed was scored on: the same precision
        with scoring_precision(protocol.spec):
            if artifacts is not None and result.state == "COMPLETE":
                began = time.perf_counter()
                _artifacts(protocol, prepared, result, artifacts, mlflow, run_id)
                run.artifacts_s = time.perf_counter() - began
            if keep and result.state == "COMPLETE":
                began = time.perf_counter()
                _keep(protocol, prepared, cell, params, seed, result, folds, mlflow, run_id)
                run.artifacts_s += time.perf_counter() - began
    # MLflow first, the record last: a recorded seed always has its MLflow run (a worker stopped in between
    # trains the seed again, and the run, found by key, keeps the values it logged)
    mlflow.log(
        run_id,
        params={**config.to_dict(), **record.params},
        metrics={
            **record.logged_metrics(metrics),
            **secondary,
            **{SEPARATE_PREFIX + m: v for m, v in run.separate.items()},
            **{f"{fold_label(f).replace(' ', '')}_iterations": r.iterations for f, r in enumerate(folds)},
            "final_loss": result.final_loss,
            "iterations": result.iterations,
            "samples_seen": result.samples_seen,
            "wall_time_s": result.wall_time_s,
        },
        tags={"state": result.state, "reason": result.reason[:500], **resumed_tag(result.resumed)},
    )
    mlflow.end(run_id, result.state)
    record.write(run)
    return run


def train_fold_models(
    protocol: Protocol,
    prepared: Prepared,
    cell: Cell,
    params: dict[str, Any],
    seed: int,
    *,
    step: Callable[[int, int, float], None],
) -> tuple[RunResult, list[RunResult]]:
    """Final seed ``seed`` of ``cell`` under ``final.mode: folds``: one model per validation fold in use, each
    trained with ``params`` on its fold's training classes (early-stopped on the fold's validation classes under
    ``training.early_stopping``, else the whole budget) and scored alone on the test set; then the fold models
    concatenated (`Concatenated`), scored the same way. Returns the concatenation's run (its iterations and
    samples those of every fold model; a FAIL naming the fold when one fails) and the fold models' runs.
    ``step`` sees one count over the fold models, fold ``f`` starting at ``f`` x the budget."""
    stopping = protocol.spec.training.early_stopping
    clustering = clusters_on_test(protocol.spec)
    began = time.perf_counter()
    # each fold model embeds the test set once, alone, then joined (a query/gallery test set embeds as always)
    with kept_embeddings(getattr(prepared.test, "x", None)):
        runs: list[RunResult] = []
        for f in range(len(prepared.folds)):
            train_part, validation = prepared.fold(f)  # each checked against the test classes by the guard
            config = final_fold_config(protocol, cell, params, seed, f)
            offset = f * config.iterations
            run = train_and_score(
                protocol,
                config,
                train_part,
                prepared.test,
                clustering=clustering,
                lake_runs=prepared.lake_runs,
                progress=lambda it, total, loss, offset=offset: step(offset + it, total, loss),
                stop_on=validation if stopping else None,
            )
            runs.append(run)
            if run.state != "COMPLETE":
                return _folds_result(runs, began, run.state, f"{fold_label(f)}: {run.reason}"), runs
        scoring = time.perf_counter()
        concatenated = Concatenated([r.model for r in runs])
        metrics = score_model(
            protocol.spec,
            concatenated,
            prepared.test,
            clustering=clustering,
            lake_runs=prepared.lake_runs,
            device=protocol.spec.training.device,
            seed=config.seed,
        )
        out = _folds_result(runs, began, "COMPLETE", "", metrics)
        out.model = concatenated
        out.score_s += time.perf_counter() - scoring
        return out, runs


def _folds_result(
    runs: list[RunResult], began: float, state: str, reason: str, metrics: dict[str, float] | None = None
) -> RunResult:
    """The fold models' runs as one final seed's run: iterations, samples and seconds summed."""
    return RunResult(
        state,
        sum(r.iterations for r in runs),
        sum(r.samples_seen for r in runs),
        time.perf_counter() - began,
        metrics or {},
        final_loss=sum(r.final_loss for r in runs) / len(runs),
        reason=reason,
        train_s=sum(r.train_s for r in runs),
        score_s=sum(r.score_s for r in runs),
    )


def _artifacts(
    protocol: Protocol, prepared: Prepared, result: RunResult, directory: Path, mlflow: MlflowRecords, run_id: str
) -> None:
    """Test pair distances (and the 2-D embedding) of the run, for reports, attached to its MLflow run."""
    written = write_cell_artifacts(
        result.model,
        one_set(prepared.test),
        directory,
        protocol_seed=protocol.seed,
        normalize=protocol.spec.model.normalize,
        device=protocol.spec.training.device,
        metric=result.metric,
    )
    for path in written:
        mlflow.artifact(run_id, path.name, path=path)


def _keep(
    protocol: Protocol,
    prepared: Prepared,
    cell: Cell,
    params: dict[str, Any],
    seed: int,
    result: RunResult,
    folds: list[RunResult],
    mlflow: MlflowRecords,
    run_id: str,
) -> None:
    """The run's model and test embeddings (`bench.sweep.kept.write_final`), attached to its MLflow run."""
    losses = [r.loss for r in folds] if folds else [result.loss]
    with tempfile.TemporaryDirectory() as tmp:
        for path in write_final(Path(tmp), protocol, prepared, cell, params, seed, result.model, losses):
            mlflow.artifact(run_id, path.name, path=path)
