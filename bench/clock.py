"""Durations as people read them on a command line: ``H:MM:SS``, the one format of plans and progress; and a
sweep's wall time accounted (`Ledger`)."""

from __future__ import annotations

import time
from typing import Any


def hms(seconds: float) -> str:
    """``1:02:03`` for 3723 s, rounded to the second; hours are not wrapped into days."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


ACCOUNTS = ("start-up", "training", "run set-up", "validation", "test", "records", "tables", "waiting", "floor")


class Ledger:
    """Where a sweep's wall time went: seconds per account (`ACCOUNTS`), the rest of the wall time being
    ``other``. ``start-up``: pre-flight, data, stores, the precision choice; ``training``: the training loops;
    ``run set-up``: a run's time outside its loop and scoring (building the trunk, loss, optimiser, loader);
    ``validation`` / ``test``: scoring trials / final seeds (and the first seed's artifacts); ``records``:
    MLflow and Optuna (slots, tells, runs, metrics); ``tables``: the results tables rewritten; ``waiting``:
    polling for other workers' trials; ``floor``: the untrained trunk scored."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(ACCOUNTS, 0.0)
        self.open: list[_Timing] = []  # timings in progress, innermost last

    def add(self, account: str, seconds: float) -> None:
        if account not in self.seconds:
            raise KeyError(f"unknown account {account!r}: expected one of {', '.join(ACCOUNTS)}")
        self.seconds[account] += max(0.0, seconds)
        if self.open:  # seconds spent inside the timing in progress: not its own as well
            self.open[-1].inner += max(0.0, seconds)

    def timing(self, account: str) -> _Timing:
        """A context adding the seconds spent in it to ``account``. Timings may nest: an inner one's seconds
        go to its own account and not to the outer one's as well, so the accounts never sum past the wall."""
        return _Timing(self, account)

    def table(self, wall_s: float) -> dict[str, Any]:
        """What a manifest records: the wall time, each account's seconds and share, ``other`` the rest."""
        accounts = {k: round(v, 2) for k, v in self.seconds.items()}
        accounts["other"] = round(max(0.0, wall_s - sum(self.seconds.values())), 2)
        return {
            "wall_s": round(wall_s, 2),
            "seconds": accounts,
            "share": {k: round(v / wall_s, 4) if wall_s > 0 else 0.0 for k, v in accounts.items()},
        }


def summary(table: dict[str, Any]) -> str:
    """One line of `Ledger.table`: the wall time, then the accounts by share, largest first (none under 0.5%)."""
    shares = sorted(table["share"].items(), key=lambda kv: -kv[1])
    parts = [f"{k} {v:.0%}" for k, v in shares if v >= 0.005]
    not_training = 1 - table["share"].get("training", 0.0)
    return f"{hms(table['wall_s'])} wall: " + ", ".join(parts) + f" (not training: {not_training:.0%})"


class _Timing:
    def __init__(self, ledger: Ledger, account: str) -> None:
        self.ledger, self.account = ledger, account

    def __enter__(self) -> _Timing:
        self.start, self.inner = time.perf_counter(), 0.0
        self.ledger.open.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        spent = time.perf_counter() - self.start
        self.ledger.open.remove(self)
        self.ledger.add(self.account, spent - self.inner)  # which counts it inside the enclosing timing too
        if self.ledger.open:
            self.ledger.open[-1].inner += self.inner  # and the seconds of the timings inside this one
