"""A dataset listed in a CSV file, open-metric-learning's format: ``csv:PATH#SPLIT``.

Columns (a header row names them, in any order): ``label`` (the class, an
integer >= 0, global across the file), ``path`` (the image, relative to the
CSV file's folder), ``split`` (``train`` or ``validation``), and optionally
``is_query`` and ``is_gallery`` (true/false on validation rows; ignored on
train rows, where OML leaves them empty). OML's ``category`` and
``category_name`` are read past; its crop columns ``x_1, x_2, y_1, y_2`` are
refused when they hold a value, since the images would be used uncropped.

``SPLIT`` chooses the rows: ``train``, ``validation`` (every validation row;
refused when is_query/is_gallery divide them, which only a query/gallery
test set says right), ``query`` or ``gallery`` (validation rows marked so).
A row that is both query and gallery is excluded from its own gallery by
its row number (`ROW`, a per-sample id).

The same rules as an image folder: images are read lazily as files
(`bench.data.files`), fingerprinted by content, channels decided over the
whole selection; a relative ``csv:`` path in a protocol is relative to the
protocol file's folder. What a hostile file could do is refused in one line
naming the CSV line: an absolute path or one leaving the CSV's folder, a
missing image, a label that is not an integer >= 0, an unknown split, a
selection with no rows, the same image twice in one selection.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path, PurePosixPath

from bench.data.files import FileIndex
from bench.errors import BenchError

SPLITS = ("train", "validation", "query", "gallery")
REQUIRED = ("label", "path", "split")
CROPS = ("x_1", "x_2", "y_1", "y_2")
ROW = "csv_row"  # per-sample fact: the sample's line in the CSV, pairing a query with itself in the gallery
MAX_BYTES = 1 << 30  # a listing above 1 GiB is not a dataset index
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def split_spec(path: str) -> tuple[str, str]:
    """``PATH#SPLIT`` -> (PATH, SPLIT); a missing or unknown split is one line naming the four."""
    file, sep, split = path.rpartition("#")
    if not sep or split not in SPLITS or not file:
        raise BenchError(
            f"csv:{path}: name the rows to read after a '#': csv:{file or path}#SPLIT with SPLIT one of "
            f"{', '.join(SPLITS)} (OML's split column; query and gallery: validation rows marked is_query, is_gallery)"
        )
    return file, split


def csv_index(path: str | Path, split: str) -> FileIndex:
    """The `FileIndex` of the rows ``split`` of the CSV at ``path`` (checked as the module docstring says)."""
    file = Path(path)
    name = f"csv:{file}#{split}"
    if not file.is_file():
        raise BenchError(f"{name}: file {file} does not exist")
    if file.stat().st_size > MAX_BYTES:
        raise BenchError(f"{name}: {file} is {file.stat().st_size:,} bytes, more than a listing ({MAX_BYTES:,})")
    try:
        text = file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise BenchError(f"{name}: not UTF-8 text (byte {e.start}): save the CSV as UTF-8") from None
    rows = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(rows)]
    except StopIteration:
        raise BenchError(f"{name}: the file is empty: expected a header row with {', '.join(REQUIRED)}") from None
    except csv.Error as e:
        raise BenchError(f"{name}: line 1: {e}") from None
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise BenchError(
            f"{name}: the header has no column {', '.join(missing)} (it has {', '.join(header[:8]) or 'none'}): "
            "open-metric-learning's format is label, path, split[, is_query, is_gallery]"
        )
    column = {h: i for i, h in reversed(list(enumerate(header)))}
    root = file.parent
    paths: list[str] = []
    labels: list[int] = []
    lines: list[int] = []
    counts: dict[str, int] = {}
    marked = {"is_query" in column, "is_gallery" in column}
    divided = False  # a validation row that is not both query and gallery
    seen: dict[str, int] = {}
    try:
        for number, row in enumerate(rows, start=2):
            if not any(cell.strip() for cell in row):
                continue  # a blank line
            where = f"{name}: line {number}"

            def cell(key: str, row: list[str] = row) -> str:
                i = column.get(key)
                return row[i].strip() if i is not None and i < len(row) else ""

            value = cell("split")
            if value not in ("train", "validation"):
                raise BenchError(f"{where}: split {value!r}: expected train or validation")
            counts[value] = counts.get(value, 0) + 1
            crops = [c for c in CROPS if cell(c)]
            if crops:
                raise BenchError(
                    f"{where}: a crop ({', '.join(crops)}) is given: dmlbench reads whole images, so crop the "
                    "images first and list the crops"
                )
            query = gallery = True
            if value == "validation" and True in marked:
                query, gallery = (
                    _flag(cell("is_query"), "is_query", where),
                    _flag(cell("is_gallery"), "is_gallery", where),
                )
                if not (query or gallery):
                    raise BenchError(f"{where}: a validation row that is neither query nor gallery")
                divided = divided or not (query and gallery)
            wanted = {
                "train": value == "train",
                "validation": value == "validation",
                "query": value == "validation" and query,
                "gallery": value == "validation" and gallery,
            }[split]
            if not wanted:
                continue
            label = _label(cell("label"), where)
            rel = _relative(cell("path"), where, root)
            if rel in seen:
                raise BenchError(f"{where}: {rel} is listed again (first on line {seen[rel]}) in the {split} rows")
            seen[rel] = number
            paths.append(rel)
            labels.append(label)
            lines.append(number)
    except csv.Error as e:
        raise BenchError(f"{name}: {e}") from None
    if split == "validation" and divided:
        raise BenchError(
            f"{name}: is_query and is_gallery divide the validation rows: give the test side as "
            f"{{query: csv:{file}#query, gallery: csv:{file}#gallery}}"
        )
    if not paths:
        found = ", ".join(f"{k}: {v} rows" for k, v in sorted(counts.items())) or "no rows"
        raise BenchError(f"{name}: no row is selected by {split!r} (the file has {found})")
    for rel, number in zip(paths, lines):
        if not (root / rel).is_file():
            raise BenchError(f"{name}: line {number}: image {rel} does not exist under {root}")
    return FileIndex(
        root,
        tuple(paths),
        tuple(labels),
        name,
        per_sample={ROW: tuple(lines)},
        class_names={c: str(c) for c in sorted(set(labels))},
    )


def _flag(value: str, key: str, where: str) -> bool:
    text = value.lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise BenchError(f"{where}: {key} {value!r}: expected True or False on a validation row")


def _label(value: str, where: str) -> int:
    """An integer >= 0 (``3`` or ``3.0``), below 2^53 so that no two labels merge as floats or int64."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number.is_integer() and 0 <= number < 2**53):
        raise BenchError(f"{where}: label {value!r}: expected an integer >= 0 (the class, as in OML's format)")
    return int(number)


def _relative(value: str, where: str, root: Path) -> str:
    """The image path as a clean relative POSIX path inside the CSV's folder; anything leaving it is refused."""
    if not value:
        raise BenchError(f"{where}: the path is empty")
    text = value.replace("\\", "/")
    posix = PurePosixPath(text)
    if posix.is_absolute() or (len(text) > 1 and text[1] == ":") or "\0" in text:
        raise BenchError(f"{where}: path {value!r} is absolute: list images relative to the CSV's folder {root}")
    parts: list[str] = []
    for part in posix.parts:
        if part == "..":
            if not parts:
                raise BenchError(f"{where}: path {value!r} leaves the CSV's folder {root}: keep images inside it")
            parts.pop()
        elif part != ".":
            parts.append(part)
    if not parts:
        raise BenchError(f"{where}: path {value!r} names the CSV's folder, not an image")
    return "/".join(parts)
