"""Problems collected while a protocol is checked, each one line: ``FILE:LINE: key.path: what was expected``."""

from __future__ import annotations

from bench.protocol.types import ProtocolError


class Reporter:
    """Every problem found, in order; `raise_if_any` raises them as one ProtocolError."""

    def __init__(self, source: str, lines: dict[tuple, int]) -> None:
        self.source, self.lines = source, lines
        self.problems: list[str] = []
        self.paths: set[tuple] = set()

    def add(self, path: tuple, message: str) -> None:
        self.paths.add(path)
        line = next((self.lines[path[:n]] for n in range(len(path), -1, -1) if path[:n] in self.lines), None)
        where = f"{self.source}:{line}" if line else self.source
        self.problems.append(f"{where}: {format_path(path) or '(top level)'}: {message}")

    def raise_if_any(self) -> None:
        if self.problems:
            raise ProtocolError(self.problems)


def format_path(path: tuple) -> str:
    """A key path as the user writes it: ``grid.losses[0].search_space``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
