"""Provenance: what a result needs to be rerun, recorded on every run and in every manifest.

* `package_versions`: the versions of the packages a result depends on, and
  of every plugin loaded in this process (version, source hash, source);
* `git_commit`, `git_dirty`: the commit the code runs from, and whether
  tracked files differ from it;
* `hardware`: the CPU a result is trained on (its model name, whether it has
  AMX and avx512_bf16, which change bf16's speed and rounding path) and the
  torch thread count (the order of float additions, so the numbers, depend
  on it);
* `standard_tags`: all of the above as the ``dmlbench.*`` MLflow tags every
  run carries (`dmlbench train` and sweeps alike), with the split fingerprint.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import registry

__all__ = [
    "PACKAGES",
    "cpu",
    "git_commit",
    "git_dirty",
    "hardware",
    "package_versions",
    "plugin_versions",
    "standard_tags",
]

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


def cpu(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU: ``model`` (``model name`` of /proc/cpuinfo, else lscpu's ``Model name``, else the platform's
    processor), and ``amx_bf16`` and ``avx512_bf16`` from its flags (None where no flags are listed: not
    Linux, or not x86). ``cpuinfo``: the text of /proc/cpuinfo (default: this machine's)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())  # the first processor's
    model = fields.get("model name") or _lscpu_model() or platform.processor() or platform.machine() or "unknown"
    flags = fields["flags"].split() if "flags" in fields else None
    return {
        "model": model,
        "amx_bf16": None if flags is None else "amx_bf16" in flags,
        "avx512_bf16": None if flags is None else "avx512_bf16" in flags,
    }


def _lscpu_model() -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            return value.strip()
    return None


def hardware() -> dict[str, Any]:
    """This process's part of a result: the CPU (`cpu`), its cores, the torch threads in use, the host and
    when it started. A sweep's manifest lists one per worker start (``hardware``), so a sweep resumed or
    grown on another machine or thread count says which part ran where."""
    import torch

    this = cpu()
    return {
        "cpu": this["model"],
        "amx_bf16": this["amx_bf16"],
        "avx512_bf16": this["avx512_bf16"],
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "host": platform.node(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def standard_tags(split_fingerprint: str | None = None, **extra: Any) -> dict[str, str]:
    """The tags every dmlbench run carries: versions, git commit, the CPU and thread count (`hardware`), split
    fingerprint, plus ``extra``."""
    tags = {f"dmlbench.version.{k}": v for k, v in package_versions().items()}
    tags["dmlbench.git_commit"] = git_commit()
    tags["dmlbench.git_dirty"] = str(git_dirty()).lower()
    part = hardware()
    for key in ("cpu", "amx_bf16", "avx512_bf16", "threads"):
        tags[f"dmlbench.{key}"] = str(part[key]).lower() if isinstance(part[key], bool) else str(part[key])
    if split_fingerprint is not None:
        tags["dmlbench.split_fingerprint"] = split_fingerprint
    tags.update({f"dmlbench.{k}": str(v) for k, v in extra.items()})
    return tags
