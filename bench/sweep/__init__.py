"""A sweep: every cell of a protocol tuned with the same trials, retrained with the same seeds, and its tables.

* `runner`: `run_protocol` / `Sweep`, the orchestration, resumable across
  workers sharing one Optuna storage; a worker's set-up is `worker`'s, its
  phases `trial_phase`, `final_phase` and `floor_phase`, what it has done
  and left, its time limit and stop requests `accounts`';
* `prepare`: the data of a protocol, split once, and the test-class guard;
* `seeds`: every run's seed (common random numbers);
* `tuning`: one cell's trials (objective, slots, search strategy);
* `final_run`: one final seed of a cell trained, scored and recorded, for the
  sweep and for the budget check alike;
* `budget_check`: the tuned cells retrained at a multiple of the budget;
* `floor`: the untrained trunk scored like a final seed;
* `probe`: searched parameters that cannot change the gradient's direction;
* `preflight`: every problem of a protocol and its stores, before anything
  is spent (what `validate`, `plan`, `run` and `budget-check` all ask);
* `tables`: the results tables' files, rebuilt whole from the records
  (`records`: the rows read from the records; `frames`: the tables built
  from them; `budget_audit`: the cells whose budget differs, refused);
* `merge`: the jobs of a split sweep joined into one results folder;
* `kept`: each final seed's model and test embeddings, kept as MLflow
  artifacts, and `kept.load_final` that reads them back;
* `artifacts`, `precision`, `progress`, `result`.

Nothing is imported here, so that reading tables never imports the trainer.
"""

__all__ = [
    "accounts",
    "artifacts",
    "budget_audit",
    "budget_check",
    "final_phase",
    "final_run",
    "floor",
    "floor_phase",
    "frames",
    "kept",
    "merge",
    "precision",
    "preflight",
    "prepare",
    "probe",
    "progress",
    "records",
    "result",
    "runner",
    "seeds",
    "tables",
    "trial_phase",
    "tuning",
    "worker",
]
