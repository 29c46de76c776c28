"""docs/METHODS.md, the project's method notes: every citation of it resolves, every method has notes.

Code cites "METHODS.md" (sometimes with a section: "METHODS.md, fair
comparison"); the file must exist in the repository and the cited section
must be one of its headings. Every built-in loss and miner of the registry
(`bench.registry.ENTRIES`, PML-backed entries included, plugins not) must be
named in the notes, in backticks as the notes write registry names, so that
a method added without notes fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "docs" / "METHODS.md"
CITATION = re.compile(r"METHODS\.md")
SECTION = re.compile(r"METHODS\.md,\s*([A-Za-z][A-Za-z -]*[A-Za-z])\s*\)")


def citations() -> list[tuple[str, int, str]]:
    """(file relative to the root, line number, line) of every mention of METHODS.md in bench/**/*.py."""
    found = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if CITATION.search(line):
                found.append((str(path.relative_to(ROOT)), number, line.strip()))
    return found


def headings() -> list[str]:
    """The notes' headings, lower case, without their '#' marks."""
    return [
        line.lstrip("#").strip().lower()
        for line in NOTES.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    ]


def test_cited_notes_exist() -> None:
    cited = citations()
    if cited:
        where = ", ".join(f"{f}:{n}" for f, n, _ in cited)
        assert NOTES.is_file(), f"docs/METHODS.md is cited ({where}) but missing"


@pytest.mark.parametrize(
    "where,section", [(f"{f}:{n}", m.group(1)) for f, n, line in citations() for m in SECTION.finditer(line)]
)
def test_cited_sections_are_headings(where: str, section: str) -> None:
    found = [h for h in headings() if h.startswith(section.lower())]
    assert found, f"{where} cites METHODS.md, {section}: no such heading in docs/METHODS.md"


def own_methods() -> list[tuple[str, str]]:
    """(kind, name) of every loss and miner in the registry's built-in table."""
    from bench.registry import ENTRIES

    return [(e.kind, e.name) for e in ENTRIES if e.kind in ("loss", "miner")]


def test_registry_has_losses_and_miners() -> None:
    kinds = {kind for kind, _ in own_methods()}
    assert kinds == {"loss", "miner"}


@pytest.mark.parametrize("kind,name", own_methods())
def test_every_method_has_notes(kind: str, name: str) -> None:
    text = NOTES.read_text(encoding="utf-8")
    assert f"`{name}`" in text, f"{kind} {name!r} is in bench.registry but not in docs/METHODS.md (as `{name}`)"
