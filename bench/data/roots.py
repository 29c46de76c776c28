"""Where data lives: an explicit option, ``$DMLBENCH_DATA``, ``../shared/data``, ``./data``, in that order."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bench.errors import BenchError

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA_REL = Path("..") / "shared" / "data"


def candidate_roots(explicit: str | Path | None = None) -> list[Path]:
    """Where data may live, in the order it is looked up.

    An explicit root is the only candidate when given: a user who names a
    folder wants that folder, and a typo must not silently load other data.
    Otherwise: ``$DMLBENCH_DATA``; ``../shared/data`` seen from the current
    directory (what a user running from their checkout means by the
    relative path), then seen from the repository root (so the same
    command works from any sub-folder or an installed entry point); and
    ``./data`` last.
    """
    if explicit is not None and str(explicit) != "":
        return [Path(explicit).expanduser()]
    roots: list[Path] = []
    env = os.environ.get("DMLBENCH_DATA")
    if env:
        roots.append(Path(env).expanduser())
    relative = [Path.cwd() / SHARED_DATA_REL, REPO_ROOT / SHARED_DATA_REL, Path.cwd() / "data"]
    roots += [Path(os.path.normpath(r)) for r in relative]
    unique: list[Path] = []
    for root in roots:
        if not any(_same(root, seen) for seen in unique):
            unique.append(root)
    return unique


def _same(a: Path, b: Path) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def resolve_root(
    explicit: str | Path | None = None,
    dataset: str = "omniglot",
    files: Sequence[str] = ("images_background.zip", "images_evaluation.zip"),
    *,
    extra_roots: Sequence[Path] = (),
    hint: str = "",
) -> Path:
    """Return the first data root whose ``<root>/<dataset>/`` holds every one of `files`.

    Each dataset is looked up on its own, so Omniglot may come from the
    shared folder and another dataset from ``./data``. `extra_roots` come
    after the usual candidates, even after an explicit root: they are a
    system-wide install of that one dataset (a Debian package, say), which
    an explicit root meant for other data should not hide. `hint` opens the
    error, for datasets a package manager can install.
    """
    roots = candidate_roots(explicit) + list(extra_roots)
    for root in roots:
        if all((root / dataset / f).is_file() for f in files):
            return root
    names = " and ".join(files) if len(files) <= 2 else ", ".join(files[:-1]) + " and " + files[-1]
    where = str(candidate_roots(explicit)[0]) if explicit else "$DMLBENCH_DATA"
    looked = ", ".join(str(r / dataset) for r in roots)
    prefix = f"{hint}, or " if hint else ""
    raise BenchError(f"{dataset} not found: {prefix}put {names} under {where}/{dataset}/ (looked in: {looked})")
