"""What the readers of published dataset layouts share: finding the folder, reading index lines, errors.

Each published archive unpacks into one folder under a data root
(``CUB_200_2011/``, ``Stanford_Online_Products/`` ...). A reader names the
entries it needs in a `Layout`; the root is the first candidate of
`candidate_roots` (explicit root, ``$DMLBENCH_DATA``, ``../shared/data``,
``./data``) that holds all of them, so these datasets are found where
Omniglot is. A missing entry is one line saying which archive to unpack
where, because that, not a file name, is what the user has to act on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.data.roots import candidate_roots
from bench.errors import BenchError


@dataclass(frozen=True)
class Layout:
    """A published layout: its spec family, its folder under the data root, the entries a reader needs.

    `required` entries are relative to the folder; a trailing ``/`` marks a
    folder. `unpack` says how to get them, with ``{where}`` for the root.
    """

    family: str
    folder: str
    required: tuple[str, ...]
    unpack: str

    def missing(self, root: Path) -> str | None:
        """The first required entry absent under `root` (as ``folder/entry``), or None when all are there."""
        for entry in self.required:
            path = root / self.folder / entry
            if not (path.is_dir() if entry.endswith("/") else path.is_file()):
                return f"{self.folder}/{entry}"
        return None

    def require(self, root: Path) -> Path:
        """`root`/`folder` when every required entry is there, else the one-line error naming the archive."""
        if self.missing(root) is not None:
            raise self._absent(root)
        return root / self.folder

    def _absent(self, root: Path, looked: str = "") -> BenchError:
        return BenchError(
            f"{self.family}: {self.missing(root)} not found under {root}: {self.unpack.format(where=root)}{looked}"
        )

    def check_images(self, root: Path, relatives: Sequence[str]) -> None:
        """Every listed image must exist (a stat each: about a second for SOP's 120,053): a truncated
        unpacking, a deleted file or an index from another release is named here, not by a loader
        worker hours into a run."""
        folder = root / self.folder
        missing = [r for r in relatives if not (folder / r).is_file()]
        if missing:
            more = f" (and {len(missing) - 1} more of {len(relatives)})" if len(missing) > 1 else ""
            raise BenchError(
                f"{self.family}: image {folder / missing[0]} listed in the index is missing{more}: "
                f"{self.unpack.format(where=root)}"
            )

    def find(self, explicit: str | Path | None) -> Path:
        """The first candidate data root that holds the whole layout.

        An explicit root is the only candidate (as for every dataset). When
        none holds it, the error is about the first candidate, the place the
        user chose (the explicit root, else ``$DMLBENCH_DATA`` when set), and
        lists every place looked in.
        """
        roots = candidate_roots(explicit)
        for root in roots:
            if self.missing(root) is None:
                return root
        looked = "" if len(roots) == 1 else " (looked in: " + ", ".join(str(r) for r in roots) + ")"
        raise self._absent(roots[0], looked)


def index_rows(file: Path) -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, whitespace-separated fields) of each non-blank line.

    Whitespace splitting, not a fixed separator: In-shop pads its columns
    with runs of spaces, and Windows line ends must not become part of a path.
    """
    try:
        with open(file, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    yield number, line.split()
    except UnicodeDecodeError:  # raised per decoded block, so no line number
        raise BenchError(f"{file}: not UTF-8 text: is this the published index file?") from None


def malformed(family: str, file: Path, line: int, why: str) -> BenchError:
    """The error for a bad line of an index file: which dataset, which file, which line, what is wrong."""
    return BenchError(f"{family}: {file}, line {line}: {why}")


def integer(family: str, file: Path, line: int, field: str, value: str) -> int:
    """`value` as an int, or the malformed-line error naming the field."""
    try:
        return int(value)
    except ValueError:
        raise malformed(family, file, line, f"{field} {value!r} is not an integer") from None


def check_split(family: str, split: str, splits: tuple[str, ...]) -> None:
    if split not in splits:
        raise BenchError(f"{family}: unknown split {split!r}: expected one of {', '.join(splits)}")


def nonempty(name: str, paths: list[str], where: str) -> None:
    """A split with no image is a wrong or truncated index, not an empty dataset to train on."""
    if not paths:
        raise BenchError(f"{name}: no images in this split ({where})")
