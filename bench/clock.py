"""Durations as people read them on a command line: ``H:MM:SS``, the one format of plans and progress."""

from __future__ import annotations


def hms(seconds: float) -> str:
    """``1:02:03`` for 3723 s, rounded to the second; hours are not wrapped into days."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
