"""Where a sweep's records live: the Optuna storage and the MLflow tracking store, and what every record carries.

* `urls`: the one reader of storage and tracking URLs (query strings, ``~``,
  relative paths, default locations, password redaction);
* `tracking`: the MLflow tracking URI, reachability, run tags and provenance
  (package versions, plugins, git commit);
* `optuna`: the Optuna storage, opened one way (heartbeats and stale-trial
  handling passed in by the caller);
* `mlflow_runs`: a sweep's MLflow runs, found again by key, never duplicated;
* `checks`: the checks made on the stores before a sweep opens them (blank,
  swapped, shared or emptied stores).

Nothing here knows what a sweep is: `bench.sweep` passes its records in.
"""

__all__ = ["checks", "mlflow_runs", "optuna", "tracking", "urls"]
