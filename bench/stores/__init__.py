"""Where a sweep's records live: the Optuna storage and the MLflow tracking store, and what every record carries.

* `urls`: the one reader of storage and tracking URLs (query strings, ``~``,
  relative paths, default locations, password redaction);
* `tracking`: the MLflow tracking URI and its reachability;
* `provenance`: what every record carries to be rerun (package and plugin
  versions, git commit and dirty flag, the standard run tags);
* `optuna`: the Optuna storage, opened one way (heartbeats and stale-trial
  handling passed in by the caller);
* `mlflow_runs`: writing to MLflow, one way for `dmlbench train` and sweeps
  (`MlflowWriter`), and a sweep's runs found again by key (`MlflowRecords`);
* `checks`: the checks made on the stores before a sweep opens them (blank,
  swapped, shared or emptied stores).

Nothing here knows what a sweep is: `bench.sweep` passes its records in.
"""

__all__ = ["checks", "mlflow_runs", "optuna", "provenance", "tracking", "urls"]
