"""Reports over results tables: leaderboards, regression checks and claim verdicts.

Every module here computes tables and verdicts as pure functions of the
tables `bench.sweep.tables` reads; the commands in `bench.commands` are the only
place files are written.
"""

__all__ = [
    "budget",
    "claims",
    "edges",
    "escape",
    "floor",
    "html",
    "leaderboard",
    "mlflow_source",
    "regress",
    "source",
    "svg",
]
