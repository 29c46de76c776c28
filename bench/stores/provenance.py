"""Provenance: what a result needs to be rerun, recorded on every run and in every manifest.

* `package_versions`: the versions of the packages a result depends on, and
  of every plugin loaded in this process (version, source hash, source);
* `git_commit`, `git_dirty`: the commit the code runs from, and whether
  tracked files differ from it;
* `standard_tags`: all of the above as the ``dmlbench.*`` MLflow tags every
  run carries (`dmlbench train` and sweeps alike), with the split fingerprint.
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["PACKAGES", "git_commit", "git_dirty", "package_versions", "plugin_versions", "standard_tags"]

PACKAGES = {
    "torch": "torch",
    "pml": "pytorch-metric-learning",
    "optuna": "optuna",
    "mlflow": "mlflow",
    "dmlbench": "dmlbench",
}


def package_versions() -> dict[str, str]:
    """Versions of the packages a result depends on, by short name (``torch``, ``pml``, ...).

    Plugin entries loaded in this process (registered, from an entry point
    or a ``--plugin`` file) follow as ``plugin.<kind>.<name>``: their version,
    the sha256 of their source file and where they came from, so a result
    from a plugin says which code made it.
    """
    versions = {}
    for short, dist in PACKAGES.items():
        try:
            versions[short] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[short] = "absent"
    return {**versions, **plugin_versions()}


def plugin_versions() -> dict[str, str]:
    """``plugin.<kind>.<name>`` -> ``<version> sha256:<hash> (<source>)`` for every plugin entry loaded."""
    from bench import registry

    return {
        f"plugin.{e.kind}.{e.name}": f"{e.version or '-'} sha256:{e.source_hash or '-'} ({e.source})"
        for e in registry.loaded_plugins()
    }


def _git(args: list[str], path: str | Path | None) -> str | None:
    cwd = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit(path: str | Path | None = None) -> str:
    """The commit the code runs from (``git rev-parse HEAD``), or ``unknown`` outside a repository."""
    return _git(["rev-parse", "HEAD"], path) or "unknown"


def git_dirty(path: str | Path | None = None) -> bool | None:
    """Whether tracked files differ from that commit (None outside a repository): a result from
    uncommitted code cannot be rerun from the commit alone."""
    status = _git(["status", "--porcelain", "--untracked-files=no"], path)
    return None if status is None else bool(status)


def standard_tags(split_fingerprint: str | None = None, **extra: Any) -> dict[str, str]:
    """The tags every dmlbench run carries: versions, git commit, split fingerprint, plus ``extra``."""
    tags = {f"dmlbench.version.{k}": v for k, v in package_versions().items()}
    tags["dmlbench.git_commit"] = git_commit()
    tags["dmlbench.git_dirty"] = str(git_dirty()).lower()
    if split_fingerprint is not None:
        tags["dmlbench.split_fingerprint"] = split_fingerprint
    tags.update({f"dmlbench.{k}": str(v) for k, v in extra.items()})
    return tags
