"""A sweep: every cell of a protocol tuned with the same trials, retrained with the same seeds, and its tables.

* `runner`: `run_protocol` / `Sweep`, the orchestration, resumable across
  workers sharing one Optuna storage;
* `tuning`: one cell's trials (data, objective, slots, search strategy,
  common random numbers);
* `final_run`: one final seed of a cell trained, scored and recorded, for the
  sweep and for the budget check alike;
* `budget_check`: the tuned cells retrained at a multiple of the budget;
* `floor`: the untrained trunk scored like a final seed;
* `probe`: searched parameters that cannot change the gradient's direction;
* `preflight`: every problem of a protocol and its stores, before anything
  is spent (what `validate`, `plan`, `run` and `budget-check` all ask);
* `tables`: the results tables, rebuilt whole from the records;
* `kept`: each final seed's model and test embeddings, kept as MLflow
  artifacts, and `kept.load_final` that reads them back;
* `artifacts`, `progress`, `result`.

Nothing is imported here, so that reading tables never imports the trainer.
"""

__all__ = [
    "artifacts",
    "budget_check",
    "final_run",
    "floor",
    "kept",
    "precision",
    "preflight",
    "probe",
    "progress",
    "result",
    "runner",
    "tables",
    "tuning",
]
