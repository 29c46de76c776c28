"""A new local SQLite MLflow store: MLflow building it (its schema migrations) against a copy of the template.

Each repeat makes two new stores in fresh folders, in alternating order (built, copied, copied, built, ...),
each opened as dmlbench opens one (`MlflowWriter`: the client, the default experiment, one experiment of its
own); the template itself is made once, before the timed repeats, in a private cache. Prints the medians and
their ratio. `bench/stores/mlflow_template.py` explains the template.

    .venv/bin/python benchmarks/bench_store_creation.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def _open(path: Path, template: bool) -> float:
    from bench.stores import mlflow_runs

    seed = mlflow_runs.seed_new_store
    if not template:
        mlflow_runs.seed_new_store = lambda path: None  # type: ignore[assignment]  # the store as MLflow builds it
    try:
        start = time.perf_counter()
        mlflow_runs.MlflowWriter(f"sqlite:///{path}", "bench")
        return time.perf_counter() - start
    finally:
        mlflow_runs.seed_new_store = seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["DMLBENCH_CACHE"] = str(root / "cache")
        _open(root / "warm" / "mlflow.db", template=True)  # imports, and the template made once
        times: dict[bool, list[float]] = {False: [], True: []}
        for i in range(args.repeats):
            for template in (False, True) if i % 2 == 0 else (True, False):
                times[template].append(_open(root / f"{i}-{template}" / "mlflow.db", template))
    built, copied = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"MLflow builds a new store:   median {built:.2f} s over {args.repeats} ({', '.join(f'{t:.2f}' for t in times[False])})"
    )
    print(
        f"a copy of the template:      median {copied:.2f} s over {args.repeats} ({', '.join(f'{t:.2f}' for t in times[True])})"
    )
    print(f"ratio copy / build: {copied / built:.3f}")


if __name__ == "__main__":
    main()
